"""The acceptance matrix as a markdown report and PNG plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path


def _f(x, spec: str = ".2f") -> str:
    return "—" if x is None else format(x, spec)


def _table(cols: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return lines


def _chooser_cells(r: dict) -> list[str]:
    """tok/step, best alone, tok/step alone, gain: the columns an oracle and a hybrid row share."""
    return [
        _f(r["tokens_per_target_step"]),
        r["best_alone"] or "—",
        _f(r["best_alone_tokens_per_target_step"]),
        _f(r["gain"], ".2f") + "×" if r["gain"] else "—",
    ]


def _sources_cell(r: dict) -> str:
    """Per member: share of the steps, tokens accepted / drafted there."""
    return ", ".join(
        f"{m} {_f(v['share'], '.0%')}: {v['accepted_tokens']}/{v['draft_tokens']}" for m, v in r["sources"].items()
    )


def _oracle_section(rows: list[dict]) -> list[str]:
    """The oracle table: per cell its tokens per step against the best member alone, and the steps each member won."""
    if not rows:
        return []
    lines = [
        "## Oracle: the best drafter per step (reference decoder, greedy)",
        "",
        "Per step the oracle takes the member whose draft greedy verification accepts furthest (it reads the "
        "greedy output ahead: what a perfect per-step choice between these drafters reaches; it is "
        "not served). Gain = its tokens per target step over the best member alone; per member: share of the "
        "steps it won, and tokens accepted / drafted there.",
        "",
    ]
    lines += _table(
        [
            "workload",
            "k",
            "oracle",
            "tok/step",
            "best alone",
            "tok/step alone",
            "gain",
            "steps won: accepted/drafted",
        ],
        [[r["workload"], r["k"], r["method"], *_chooser_cells(r), _sources_cell(r)] for r in rows],
    ) + [""]
    return lines


def _hybrid_section(rows: list[dict], hybrids: dict) -> list[str]:
    """The hybrid table: per cell its tokens per step against the best member alone and the oracle over the same
    members, and per member the steps the policy gave it with their acceptance."""
    if not rows:
        return []
    fitted = "; ".join(
        f"{h}: {fit.get('conversations')} conversations of `{Path(str(fit.get('data'))).name}`"
        + (f", head chain {i['head_depth']} deep" if i.get("head_depth") else "")
        + (
            f", policies fitted at T = {', '.join(f'{t:g}' for t in i['temperatures'])}"
            if len(i.get("temperatures") or []) > 1
            else ""
        )
        for h, i, fit in ((h, i, i.get("policy")) for h, i in hybrids.items())
        if fit
    )
    lines = [
        "## Hybrid: the fitted policy's choice per step (served in vLLM and reference decoder)",
        "",
        "Per step every member drafts and the policy (fitted on training conversations, never on these prompts"
        + (f" — {fitted}" if fitted else "")
        + ") proposes the one it expects to be accepted furthest. Gain = tokens per target step over the best "
        "member alone (same source); oracle = the reference decoder's oracle over the same members (greedy); per "
        "member: share of the steps it was given, tokens accepted / drafted there. Served, the head's chain is not "
        "run on steps where no head draft could be chosen (head chain skipped).",
        "",
    ]
    lines += _table(
        [
            "source",
            "workload",
            "T",
            "k",
            "hybrid",
            "tok/step",
            "best alone",
            "tok/step alone",
            "gain",
            "oracle",
            "speedup",
            "best alone speedup",
            "head chain skipped",
            "steps given: accepted/drafted",
        ],
        [
            [
                r.get("source", "reference"),
                r["workload"],
                _f(r["temperature"], "g"),
                r["k"],
                r["method"],
                *_chooser_cells(r),
                _f(r.get("oracle_tokens_per_target_step")),
                _f(r.get("speedup_vs_none")),
                _f(r.get("best_alone_speedup_vs_none")),
                "—" if r.get("head_skipped") is None else r["head_skipped"],
                _sources_cell(r),
            ]
            for r in rows
        ],
    ) + [""]
    return lines


def write_report(result: dict) -> str:
    """Markdown: settings, one table per source × temperature (rows method × workload, k across), the
    per-cell detail, k recommendations and the calibration table."""
    v = result.get("versions") or {}
    lines = [
        f"# Acceptance matrix: `{Path(result['target']).name}`",
        "",
        f"{result['created']} · k ∈ {result['ks']} · temperatures {result['temperatures']} · "
        f"max_tokens {result['max_tokens']} · seed {result['seed']} · vLLM {v.get('vllm')} · "
        f"torch {v.get('torch')} · transformers {v.get('transformers')}",
        "",
        "Workloads: "
        + ", ".join(f"**{n}** ({w['num_prompts']} prompts, `{w['source']}`)" for n, w in result["workloads"].items()),
        "",
    ]
    cells = result["cells"]
    ks = result["ks"]
    reused = sorted(
        {(c["workload"], c["temperature"], c["k"], c["reused_from"]) for c in cells if c.get("reused_from")}
    )
    if reused:
        lines += [
            "Served cells read back from an earlier run (`--reuse-served`); their τ and acceptance are exact, but "
            "a speedup against `none` compares engines run under whatever load each run had:",
            "",
        ]
        lines += [f"* {w} T={t:g} k={k}: `{src}`" for w, t, k, src in reused] + [""]
    for source in ("served", "reference"):
        for temp in result["temperatures"]:
            sub = [c for c in cells if c["source"] == source and c["temperature"] == temp]
            if not sub:
                continue
            title = "served in vLLM" if source == "served" else "in-process reference decoder"
            lines += [f"## τ (mean acceptance length), {title}, temperature {temp:g}", ""]
            rows = []
            for wname in result["workloads"]:
                for method in result["methods"]:
                    if method == "none":
                        continue
                    by_k = {c["k"]: c for c in sub if c["workload"] == wname and c["method"] == method}
                    if not by_k:
                        continue
                    rows.append(
                        [method, wname]
                        + [
                            ("failed" if by_k[k].get("status") != "ok" else _f(by_k[k].get("mean_acceptance_length")))
                            if k in by_k
                            else ""
                            for k in ks
                        ]
                    )
            lines += _table(["method", "workload"] + [f"k={k}" for k in ks], rows) + [""]
            lines += [
                f"Detail ({title}, T={temp:g}): α, per-position acceptance, tokens per target step, "
                "expected speedup (α i.i.d. fitted to τ, c measured), measured speedup vs none, greedy match.",
                "",
            ]
            rows = []
            for c in sorted(sub, key=lambda c: (c["workload"], c["method"] != "none", c["method"], c["k"])):
                if c.get("status") != "ok":
                    rows.append([c["workload"], c["method"], c["k"], "failed"] + [""] * 7)
                    continue
                pos = c.get("per_position_acceptance")
                rows.append(
                    [
                        c["workload"],
                        c["method"],
                        c["k"],
                        _f(c.get("mean_acceptance_length")),
                        _f(c.get("acceptance_rate")),
                        "[" + ", ".join(_f(p) for p in pos) + "]" if pos else "—",
                        _f(c.get("tokens_per_target_step")),
                        _f(c.get("draft_cost_ratio"), ".3f"),
                        _f(c.get("expected_speedup")),
                        _f(c.get("speedup_vs_none")),
                        "ref" if c["method"] == "none" else _f(c.get("match_vs_none")),
                    ]
                )
            lines += _table(
                [
                    "workload",
                    "method",
                    "k",
                    "τ",
                    "α",
                    "accept/pos",
                    "tok/step",
                    "c",
                    "exp. speedup",
                    "speedup",
                    "match none",
                ],
                rows,
            ) + [""]
    lines += _oracle_section(result.get("oracle") or [])
    lines += _hybrid_section(result.get("hybrid") or [], result.get("hybrids") or {})
    rec = result.get("recommendations") or []
    if rec:
        lines += [
            "## Recommended k",
            "",
            "Per workload and method: the k with the best expected speedup "
            "(1−α^(k+1))/((1−α)(k·c+1)) and, for served runs, the best measured tok/s against no speculation.",
            "",
        ]
        lines += _table(
            [
                "source",
                "workload",
                "T",
                "method",
                "best k (expected)",
                "expected speedup",
                "best k (measured)",
                "measured speedup",
            ],
            [
                [
                    r["source"],
                    r["workload"],
                    f"{r['temperature']:g}",
                    r["method"],
                    _f(r["best_k_expected"], "d"),
                    _f(r["expected_speedup"]),
                    _f(r["best_k_measured"], "d"),
                    _f(r["measured_speedup"]),
                ]
                for r in rec
            ],
        ) + [""]
    cal = result.get("calibration") or []
    if cal:
        lines += [
            "## Calibration: offline estimates against served τ",
            "",
            "reference − served must lie within 3 standard errors of the difference (SE of τ from the "
            "accepted-length distribution each run's per-position counts give); simulated = the head's "
            "held-out training-time estimate (`eval/sim_accept_len` at its TTT depth, chained step "
            "accuracies below it).",
            "",
        ]
        lines += _table(
            [
                "workload",
                "T",
                "k",
                "method",
                "served τ",
                "reference τ",
                "ref − served",
                "tolerance",
                "ok",
                "simulated τ",
                "sim − served",
            ],
            [
                [
                    r["workload"],
                    f"{r['temperature']:g}",
                    r["k"],
                    r["method"],
                    _f(r["served_tau"], ".3f"),
                    _f(r["reference_tau"], ".3f"),
                    _f(r.get("reference_error"), "+.3f"),
                    _f(r.get("tolerance"), ".3f"),
                    {True: "yes", False: "**no**", None: "—"}[r.get("within_tolerance")],
                    _f(r["simulated_tau"], ".3f"),
                    _f(r.get("simulated_error"), "+.3f"),
                ]
                for r in cal
            ],
        ) + [""]
    for name, path in (result.get("plots") or {}).items():
        lines += [f"![{name}]({Path(path).relative_to(Path(path).parent.parent)})", ""]
    return "\n".join(lines)


def write_plots(result: dict, plot_dir: str | Path) -> dict[str, str]:
    """per_position.png, tau_vs_k.png, speedup_vs_k.png, acceptance_by_output_position.png; {name: path}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot_dir = Path(plot_dir)
    plot_dir.mkdir(parents=True, exist_ok=True)
    cells = [c for c in result["cells"] if c.get("status") == "ok" and c["method"] != "none"]
    if not cells:
        return {}
    workloads = list(result["workloads"])
    temp = result["temperatures"][0]
    kmax = max(result["ks"])
    style = {"served": "-", "reference": "--"}
    color = {m: f"C{i}" for i, m in enumerate(result["methods"])}  # one colour per method in every plot
    paths = {}

    def grid(title):
        fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.4), squeeze=False)
        fig.suptitle(title)
        return fig, axes[0]

    def save(fig, axes, name):
        for ax in axes:
            ax.grid(alpha=0.3)
        handles, labels = axes[0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8)
        fig.tight_layout(rect=(0, 0.1, 1, 0.95))
        path = plot_dir / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths[name] = str(path)

    fig, axes = grid(f"per-position acceptance, k={kmax}, T={temp:g} (solid = served, dashed = reference)")
    for ax, w in zip(axes, workloads):
        for c in cells:
            if c["workload"] == w and c["k"] == kmax and c["temperature"] == temp and c.get("per_position_acceptance"):
                pos = c["per_position_acceptance"]
                ax.plot(
                    range(1, len(pos) + 1),
                    pos,
                    style[c["source"]],
                    marker="o",
                    color=color[c["method"]],
                    label=f"{c['method']} ({c['source']})",
                )
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set(title=w, xlabel="draft position", ylabel="accepted share of drafts", ylim=(0, 1))
    save(fig, axes, "per_position")

    for key, name, ylabel in (
        ("mean_acceptance_length", "tau_vs_k", "τ"),
        ("expected_speedup", "speedup_vs_k", "expected speedup"),
    ):
        fig, axes = grid(f"{ylabel} vs k, T={temp:g} (solid = served, dashed = reference)")
        for ax, w in zip(axes, workloads):
            series: dict[tuple, list] = {}
            for c in cells:
                if c["workload"] == w and c["temperature"] == temp and c.get(key) is not None:
                    series.setdefault((c["method"], c["source"]), []).append((c["k"], c[key]))
            for (method, src), pts in sorted(series.items()):
                pts.sort()
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    style[src],
                    marker="o",
                    color=color[method],
                    label=f"{method} ({src})",
                )
            ax.xaxis.get_major_locator().set_params(integer=True)
            if key == "expected_speedup":
                ax.axhline(1.0, color="grey", lw=0.8)
            ax.set(title=w, xlabel="k", ylabel=ylabel)
        save(fig, axes, name)

    fig, axes = grid(f"acceptance over output position (reference decoder, k={kmax}, T={temp:g})")
    for ax, w in zip(axes, workloads):
        for c in cells:
            by = c.get("acceptance_by_output_position")
            if c["source"] == "reference" and c["workload"] == w and c["k"] == kmax and c["temperature"] == temp and by:
                xs = [(i + 0.5) * by["bin_size"] for i, a in enumerate(by["acceptance_rate"]) if a is not None]
                ys = [a for a in by["acceptance_rate"] if a is not None]
                ax.plot(xs, ys, marker=".", color=color[c["method"]], label=c["method"])
        ax.set(title=w, xlabel="output token position", ylabel="α (draft tokens accepted)", ylim=(0, 1))
    save(fig, axes, "acceptance_by_output_position")
    return paths

r"""The acceptance matrix: methods × workloads × k × temperature, served in vLLM and decoded by the in-process
reference decoder, with calibration, k recommendation, a markdown report and PNG plots.

    draftsmith eval matrix --target smollm2 --head mine=outputs/quickstart \
        --workloads chat=outputs/quickstart/heldout_prompts.jsonl,mtbench,code \
        --ks 1,2,3,4,5,6,7 --temperatures 0,1 --num-prompts 16 --max-tokens 128 --out runs/matrix

A head is NAME=DIR where DIR is an exported directory or a training checkpoint / run dir (exported here
for vLLM; its held-out simulated acceptance length joins the calibration table). Writes
OUT/matrix.json, OUT/report.md, OUT/plots/*.png, and per cell OUT/served/<workload>/T<t>/k<k>/ (the
`draftsmith eval acceptance` outputs of that cell).
"""

from __future__ import annotations

import json
import math
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

from draftsmith.argtypes import positive_int
from draftsmith.eval.acceptance import engine_versions, run_acceptance
from draftsmith.eval.acceptance_rows import compare_outputs
from draftsmith.eval.methods import BASELINES
from draftsmith.eval.prompts import load_workload, render_prompts
from draftsmith.eval.reference_decoder import (
    OracleDrafter,
    alpha_from_tau,
    decode_prompts,
    expected_speedup,
    generation_stop_ids,
    load_drafter,
    load_head_drafter,
)
from draftsmith.serve.runner import HYBRID_KEYS

KEYS = (
    "mean_acceptance_length",
    "acceptance_rate",
    "per_position_acceptance",
    "tokens_per_target_step",
    "output_tokens_per_s",
    "match_vs_none",
    "counters",
    "status",
)


def tau_standard_error(counters: dict | None) -> float | None:
    """Standard error of τ from per-position counts: accepted_per_pos[i] = drafts accepting >= i+1 tokens,
    so the distribution of accepted length per draft (and its variance) follows exactly."""
    if not counters or not counters.get("num_drafts"):
        return None
    n, per = counters["num_drafts"], counters["num_accepted_tokens_per_pos"]
    at_least = [n, *per, 0]  # drafts with >= j accepted, j = 0..k+1
    probs = [(at_least[j] - at_least[j + 1]) / n for j in range(len(per) + 1)]  # P(L = j)
    mean = sum(j * p for j, p in enumerate(probs))
    var = sum((j - mean) ** 2 * p for j, p in enumerate(probs))
    return math.sqrt(var / n)


def sim_tau(metrics: dict, k: int, ttt_steps: int | None) -> float | None:
    """The training-time estimate of τ for chains of k: `eval/sim_accept_len` at k = the TTT depth, else the
    chained held-out step accuracies 1 + Σ_i Π_{j<=i} acc_j (None beyond the depth trained)."""
    if k == ttt_steps and metrics.get("eval/sim_accept_len") is not None:
        return metrics["eval/sim_accept_len"]
    acc = metrics.get("eval/acc")
    if not acc or k > len(acc):
        return None
    tau, run = 1.0, 1.0
    for a in acc[:k]:
        run *= a
        tau += run
    return tau


def oracle_sets(names: list[str], heads: list[str]) -> dict[str, list[str]]:
    """The oracles the matrix adds: per head, that head with the training-free drafters asked for (ngram,
    suffix); with no head, those drafters alone. Named `oracle(a+b+c)`, the head first."""
    free = [n for n in names if n in ("ngram", "suffix") and n not in heads]
    sets = [[h, *free] for h in heads] if heads else [free]
    return {f"oracle({'+'.join(m)})": m for m in sets if len(m) >= 2}


def _prepare_heads(heads: dict[str, str], target: str, out: Path, log, target_config=None) -> tuple[dict, dict]:
    """(name -> exported dir for vLLM, name -> {family, source, metrics, depth}); a head made for another target
    is refused first (`check_head_for_target`), a checkpoint before it is exported."""
    from draftsmith.eval.head_check import check_head_for_target
    from draftsmith.train.checkpoint import read_head, resolve_checkpoint, training_data

    served, info = {}, {}
    for name, path in heads.items():
        p = Path(path)
        check_head_for_target(p, target, target_config)
        family, cfg, state, metrics = read_head(p)  # metrics: a checkpoint's, kept for calibration ({} exported)
        if (p / "config.json").is_file():
            served[name] = str(p)
        else:  # a checkpoint: export it for vLLM
            dest = out / "heads" / name
            family.exporter(
                state,
                family.config(**cfg),
                dest,
                verifier=target,
                target_config=target_config,
                source=p,
                trained_on=training_data(p),
            )
            served[name] = str(dest)
            log(f"exported head {name} ({family.name}) from {resolve_checkpoint(p)} -> {dest}")
            if (p / "hybrid.json").is_file():  # its fitted hybrid policy travels with it (recorded for the export)
                from draftsmith.eval.hybrid import carry_policy

                carry_policy(p, dest)
        info[name] = {
            "family": family.name,
            "source": str(p),
            "served_dir": served[name],
            "metrics": metrics,
            "depth": cfg.get("ttt_steps") or cfg.get("n_predict"),
        }
    return served, info


def run_matrix(
    target: str,
    workloads: list[str],
    methods: list[str],
    heads: dict[str, str],
    ks: list[int],
    temperatures: list[float],
    max_tokens: int,
    num_prompts: int | None,
    out_dir: str,
    seed: int = 0,
    served: bool = True,
    reference: bool = True,
    chat_file: str | None = None,
    reuse_served: bool = False,
    oracle: bool = True,
    hybrid: bool = True,
    **engine,
) -> dict:
    """Run the whole matrix; write matrix.json, report.md and plots under out_dir.

    reuse_served: a served cell already under out_dir is read back instead of re-run when it was made with
    the same target, prompts, k, length, temperature and seed and holds every method asked for, heads
    served from the same directories (see `_reusable`): re-analysing after a change on the reference side
    then costs no vLLM time.

    oracle: at temperature 0 the reference decoder also runs `oracle_sets`' oracles, which per step take the
    member drafter whose draft would be accepted furthest (`OracleDrafter`): how much a perfect per-step choice
    between the head and the training-free methods would gain. vLLM cannot serve an oracle.

    hybrid: a head whose directory holds a fitted hybrid policy (`draftsmith eval fit-hybrid`) also runs as
    `hybrid(NAME)` in the reference decoder, at every k and temperature: per step the policy's choice between
    the head and suffix/ngram (`HybridDrafter`). Evaluation prompts the policy was fitted on are refused."""
    from transformers import AutoConfig, AutoTokenizer

    from draftsmith.assets import resolve_target

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = print
    bad = [m for m in methods if m not in BASELINES]
    if bad:
        raise ValueError(f"unknown methods {bad}: choose from {list(BASELINES)} (heads go in `heads`)")
    if not ks or min(ks) < 1:
        raise ValueError(f"k values must be >= 1, got {ks}")
    target = resolve_target(str(target))
    tokenizer = AutoTokenizer.from_pretrained(target)
    stop_ids = generation_stop_ids(tokenizer, target)
    served_heads, head_info = _prepare_heads(heads, target, out, log, AutoConfig.from_pretrained(target))
    names = list(dict.fromkeys([*methods, *heads]))
    oracle_members = oracle_sets(names, list(heads)) if reference and oracle and 0 in temperatures else {}
    policies = _hybrid_policies(heads) if hybrid else {}

    wl: dict[str, dict] = {}
    for spec in workloads:
        name, prompts, source = load_workload(spec, num_prompts, chat_file)
        f = out / "workloads" / f"{name}.jsonl"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("".join(json.dumps({"messages": p["messages"], "id": p["id"]}) + "\n" for p in prompts))
        wl[name] = {
            "file": str(f),
            "source": source,
            "num_prompts": len(prompts),
            "prompt_ids": render_prompts(tokenizer, prompts),
        }
        for hname, (_, policy) in policies.items():
            policy.check_disjoint(wl[name]["prompt_ids"], f"workload {name} ({source}) for {hname}")

    cells: list[dict] = []  # one per (source, workload, temperature, k, method)
    t_start = time.perf_counter()
    if reference:
        cells += _reference_cells(
            target,
            wl,
            names,
            heads,
            oracle_members,
            policies,
            ks,
            temperatures,
            max_tokens,
            seed,
            stop_ids,
            engine,
            log,
        )
    if served:
        for wname, w in wl.items():
            for temp in temperatures:
                none_row = None
                for k in ks:
                    run_methods = [m for m in methods if m != "none" or k == ks[0]]
                    cell_dir = out / "served" / wname / f"T{temp:g}" / f"k{k}"
                    want = {
                        "target": target,
                        "prompts_file": w["file"],
                        "num_prompts": w["num_prompts"],
                        "k": k,
                        "max_tokens": max_tokens,
                        "temperature": temp,
                        "seed": seed,
                    }
                    r = (
                        _reusable(
                            cell_dir,
                            want,
                            run_methods,
                            served_heads,
                            engine.get("ngram_min", 2),
                            engine.get("ngram_max", 5),
                        )
                        if reuse_served
                        else None
                    )
                    reused = r is not None
                    if reused:
                        log(f"served {wname} T={temp:g} k={k}: reused {cell_dir / 'acceptance.json'}")
                    else:
                        r = run_acceptance(
                            target,
                            w["file"],
                            run_methods,
                            served_heads,
                            k=k,
                            max_tokens=max_tokens,
                            num_prompts=None,
                            out_dir=str(cell_dir),
                            temperature=temp,
                            seed=seed,
                            hybrids=tuple(head for head, _ in policies.values()),
                            **engine,
                        )
                    none_row = r["methods"].get("none", none_row)
                    for name, row in r["methods"].items():
                        cell = {
                            "source": "served",
                            "workload": wname,
                            "temperature": temp,
                            "k": k,
                            "method": name,
                            **{key: row.get(key) for key in KEYS},
                            "generation_s": row.get("generation_s"),
                            "generated_tokens": row.get("generated_tokens"),
                            "speculative_config": row.get("speculative_config"),
                            "dir": str(cell_dir),
                        }
                        if row.get("hybrid_sources"):
                            for key in HYBRID_KEYS:
                                cell[key] = row.get(key)
                        if reused:
                            cell["reused_from"] = f"{cell_dir / 'acceptance.json'} ({r.get('created')})"
                        if name != "none" and none_row and row.get("status") == "ok":
                            cell.update(_served_vs_none(row, none_row, k, temp))
                        cells.append(cell)
                    engine_used, versions = r["engine"], r["versions"]
    hybrid_members = {h: [head, *(r for r in p.members if r != "head")] for h, (head, p) in policies.items()}
    analysis = analyse(cells, head_info, ks, oracle_members, hybrid_members)
    result = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "target": target,
        "workloads": {n: {k: v for k, v in w.items() if k != "prompt_ids"} for n, w in wl.items()},
        "methods": names + list(hybrid_members) + list(oracle_members),
        "oracles": oracle_members,
        "hybrids": {
            h: {
                "members": m,
                "policy": policies[h][1].for_temperature(0).fitted_on,
                "head_depth": policies[h][1].depth,
                "temperatures": policies[h][1].temperatures,
            }
            for h, m in hybrid_members.items()
        },
        "heads": head_info,
        "ks": ks,
        "temperatures": temperatures,
        "max_tokens": max_tokens,
        "seed": seed,
        "stop_ids": list(stop_ids),
        "engine": engine_used if served else None,
        "versions": versions if served else {**engine_versions(), "python": platform.python_version()},
        "elapsed_s": time.perf_counter() - t_start,
        "cells": cells,
        **analysis,
    }
    (out / "matrix.json").write_text(json.dumps(result, indent=2) + "\n")
    from draftsmith.eval.report import write_plots, write_report

    result["plots"] = write_plots(result, out / "plots")
    (out / "report.md").write_text(write_report(result))
    (out / "matrix.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _hybrid_policies(heads: dict[str, str]) -> dict:
    """hybrid(NAME) -> (NAME, policy) for every head whose directory holds a fitted hybrid policy."""
    from draftsmith.serve.policy import POLICY_FILE, HybridPolicies

    return {f"hybrid({n})": (n, HybridPolicies.load(d)) for n, d in heads.items() if (Path(d) / POLICY_FILE).is_file()}


def _reference_cells(
    target: str,
    wl: dict,
    names: list[str],
    heads: dict[str, str],
    oracle_members: dict[str, list[str]],
    policies: dict,
    ks: list[int],
    temperatures: list[float],
    max_tokens: int,
    seed: int,
    stop_ids: tuple[int, ...],
    engine: dict,
    log,
) -> list[dict]:
    """The in-process reference decoder's cells: every method, every hybrid (and, at temperature 0, every oracle)
    per workload, temperature and k, on one HF copy of the target."""
    import torch

    from draftsmith.eval.hybrid import HybridDrafter, hybrid_members
    from draftsmith.train.target import Target

    cells: list[dict] = []
    model = Target.from_pretrained(target, aux_layer_ids=[0]).model  # the HF model; each drafter picks its aux ids
    threads = torch.get_num_threads()
    drafters = {}
    for name in names:
        if name in heads:
            aux = _aux_ids(heads[name])
            tgt = Target(model, aux or [0])  # aux states feed EAGLE-3 only; [0] is a cheap placeholder
            drafters[name] = (load_head_drafter(name, heads[name], tgt)[0], tgt)
        else:
            drafters[name] = (None, Target(model, [0]))  # built per cell, below
    oracles = [(o, drafters[m[0]][1]) for o, m in oracle_members.items()]  # a head's target gives its aux states

    def fresh(name):
        return load_drafter(name, ngram_min=engine.get("ngram_min", 2), ngram_max=engine.get("ngram_max", 5))

    for wname, w in wl.items():
        for temp in temperatures:
            none_out, none_speed, greedy = None, None, None
            for k in ks:
                runs = [(name, *drafters[name]) for name in names if name != "none" or k == ks[0]]
                runs += [(h, None, drafters[head][1]) for h, (head, _) in policies.items()]
                if temp == 0:  # the oracles after the methods: they read their greedy outputs
                    runs += [(o, None, tgt) for o, tgt in oracles]
                for name, drafter, tgt in runs:
                    if name in policies:  # fresh training-free members per cell, as for the baselines
                        head, policy = policies[name]
                        members = hybrid_members(
                            drafters[head][0], policy.members, engine.get("ngram_min", 2), engine.get("ngram_max", 5)
                        )
                        drafter = HybridDrafter(members, policy, name)
                    elif name in oracle_members:
                        drafter = OracleDrafter(
                            {m: drafters[m][0] or fresh(m) for m in oracle_members[name]}, greedy, name
                        )
                    elif drafter is None:
                        # a fresh baseline per cell: suffix decoding indexes earlier outputs, and a served cell is
                        # a fresh engine, so outputs of another cell (same prompts, another k) must not leak in
                        drafter = fresh(name)
                    t0 = time.perf_counter()
                    outs, s = decode_prompts(
                        tgt,
                        drafter,
                        w["prompt_ids"],
                        k=k,
                        max_tokens=max_tokens,
                        temperature=temp,
                        seed=seed,
                        stop_ids=stop_ids,
                    )
                    if temp == 0 and (greedy is None or name == "none"):  # any greedy run's outputs are none's
                        greedy = {tuple(p): o for p, o in zip(w["prompt_ids"], outs)}
                    if name == "none":
                        none_out, none_speed = outs, s["output_tokens_per_s"]
                        s.update(mean_acceptance_length=None, per_position_acceptance=None)
                    s["speedup_vs_none"] = (
                        s["output_tokens_per_s"] / none_speed if none_out is not None and none_speed else None
                    )
                    match = compare_outputs(outs, none_out)[0] if temp == 0 and none_out and name != "none" else None
                    if isinstance(drafter, OracleDrafter):
                        s["oracle_sources"] = drafter.sources
                    if isinstance(drafter, HybridDrafter):
                        s["hybrid_sources"] = drafter.sources
                    cells.append(
                        {
                            "source": "reference",
                            "workload": wname,
                            "temperature": temp,
                            "k": k,
                            "method": name,
                            "status": "ok",
                            "match_vs_none": match,
                            "torch_threads": threads,
                            **s,
                        }
                    )
                    log(
                        f"reference {wname} T={temp} k={k} {name}: τ={_f(s['mean_acceptance_length'])} "
                        f"tok/step={_f(s['tokens_per_target_step'])} ({time.perf_counter() - t0:.0f} s)"
                    )
    return cells


def _reusable(
    cell_dir: Path, want: dict, methods: list[str], heads: dict[str, str], ngram_min: int = 2, ngram_max: int = 5
) -> dict | None:
    """The served cell's acceptance.json if it answers exactly this request, else None: the same target,
    prompts, k, length, temperature and seed, and every method run ok with the speculative config it would
    get now (a head also from the same directory; cells written before rows recorded `head_dir` are matched
    on the speculative config alone, which names an MLP speculator's proposer class, not its directory)."""
    from draftsmith.eval.methods import speculative_config

    f = cell_dir / "acceptance.json"
    if not f.is_file():
        return None
    r = json.loads(f.read_text())
    if any(r.get(key) != value for key, value in want.items()):
        return None
    rows = r.get("methods", {})
    for name in [*methods, *heads]:
        row = rows.get(name)
        if row is None or row.get("status") != "ok" or not Path(row.get("outputs") or "").is_file():
            return None  # the token ids are read back for output-match checks
        if row.get("speculative_config") != speculative_config(name, want["k"], heads, ngram_min, ngram_max):
            return None
        head_dir = str(Path(heads[name]).resolve()) if name in heads else None
        if head_dir and row.get("head_dir", head_dir) != head_dir:
            return None
    return r


def _f(x, spec=".2f"):
    return "—" if x is None else format(x, spec)


def _aux_ids(path: str) -> list[int] | None:
    """The aux layer ids a head reads (None for a family without them: the MLP speculator reads the last state)."""
    from draftsmith.train.checkpoint import read_head

    return read_head(path)[1].get("aux_layer_ids")


def _served_vs_none(row: dict, none_row: dict, k: int, temp: float) -> dict:
    """Served draft cost c (from step times against no speculation) and the match with none's outputs."""
    extra: dict = {}
    gen, acc = row.get("generated_tokens"), (row.get("counters") or {}).get("num_accepted_tokens", 0)
    steps, none_steps = gen - acc, none_row.get("generated_tokens")
    if steps and none_steps and row.get("generation_s") and none_row.get("generation_s"):
        t_step = row["generation_s"] / steps
        t_none = none_row["generation_s"] / none_steps
        extra["draft_cost_ratio"] = max(0.0, (t_step / t_none - 1.0) / k)
        extra["speedup_vs_none"] = (gen / row["generation_s"]) / (none_steps / none_row["generation_s"])
    if temp == 0 and row.get("match_vs_none") is None and none_row.get("outputs") and row.get("outputs"):
        mine = json.loads(Path(row["outputs"]).read_text())["output_token_ids"]
        ref = json.loads(Path(none_row["outputs"]).read_text())["output_token_ids"]
        extra["match_vs_none"] = compare_outputs(mine, ref)[0]
    return extra


def analyse(
    cells: list[dict],
    head_info: dict,
    ks: list[int],
    oracles: dict[str, list[str]] | None = None,
    hybrids: dict[str, list[str]] | None = None,
) -> dict:
    """Expected speedups, k recommendations, the calibration table, the oracle and hybrid rows from the cells."""
    for c in cells:
        tau = c.get("mean_acceptance_length")
        c["tau_se"] = tau_standard_error(c.get("counters"))
        cost = c.get("draft_cost_ratio")
        if tau is not None and c["method"] != "none" and cost is not None:
            a = alpha_from_tau(min(max(tau, 1.0), c["k"] + 1), c["k"])
            c["alpha_iid"] = a
            c["expected_speedup"] = expected_speedup(a, c["k"], cost)
    recommend = []
    groups: dict[tuple, list[dict]] = {}
    for c in cells:  # an oracle's draft cost is all its members' and it cannot be served: no k to recommend
        if c["method"] != "none" and c.get("status") == "ok" and "oracle_sources" not in c:
            groups.setdefault((c["source"], c["workload"], c["temperature"], c["method"]), []).append(c)
    for (source, wname, temp, method), cs in groups.items():
        exp = {c["k"]: c["expected_speedup"] for c in cs if c.get("expected_speedup") is not None}
        meas = {c["k"]: c["speedup_vs_none"] for c in cs if c.get("speedup_vs_none") is not None}
        recommend.append(
            {
                "source": source,
                "workload": wname,
                "temperature": temp,
                "method": method,
                "best_k_expected": max(exp, key=exp.get) if exp else None,
                "expected_speedup": exp.get(max(exp, key=exp.get)) if exp else None,
                "best_k_measured": max(meas, key=meas.get) if meas else None,
                "measured_speedup": meas.get(max(meas, key=meas.get)) if meas else None,
            }
        )
    by = {(c["source"], c["workload"], c["temperature"], c["k"], c["method"]): c for c in cells}
    calibration = []
    for (source, wname, temp, k, method), c in by.items():
        if source != "served" or method == "none" or c.get("status") != "ok":
            continue
        ref = by.get(("reference", wname, temp, k, method))
        info = head_info.get(method, {})
        sim = sim_tau(info.get("metrics") or {}, k, info.get("depth")) if info else None
        tau_s = c.get("mean_acceptance_length")
        row = {
            "workload": wname,
            "temperature": temp,
            "k": k,
            "method": method,
            "served_tau": tau_s,
            "served_se": c.get("tau_se"),
            "reference_tau": ref and ref.get("mean_acceptance_length"),
            "reference_se": ref and ref.get("tau_se"),
            "simulated_tau": sim,
        }
        if row["reference_tau"] is not None and tau_s is not None:
            row["reference_error"] = row["reference_tau"] - tau_s
            se = math.hypot(row["served_se"] or 0.0, row["reference_se"] or 0.0)
            row["tolerance"] = 3 * se  # 3 standard errors of the difference of two independent means
            row["within_tolerance"] = abs(row["reference_error"]) <= row["tolerance"] + 1e-9
        if sim is not None and tau_s is not None:
            row["simulated_error"] = sim - tau_s
        calibration.append(row)
    return {
        "recommendations": recommend,
        "calibration": calibration,
        "oracle": chooser_rows(cells, oracles or {}, "oracle_sources"),
        "hybrid": chooser_rows(cells, hybrids or {}, "hybrid_sources", oracles or {}),
    }


def oracle_rows(cells: list[dict], oracles: dict[str, list[str]]) -> list[dict]:
    """Per oracle cell: its tokens per target step against the best of its members alone (same workload, k,
    reference decoder), and how the steps split between the members."""
    return chooser_rows(cells, oracles, "oracle_sources")


def chooser_rows(
    cells: list[dict], members: dict[str, list[str]], sources_key: str, oracles: dict[str, list[str]] | None = None
) -> list[dict]:
    """Per cell of a drafter that chooses among members each step (an oracle, a hybrid): its tokens per target
    step against the best of its members alone (same workload, temperature, k, reference decoder), how the
    steps split between the members, and, given `oracles`, the oracle over the same members beside it."""
    by = {(c["source"], c["workload"], c["temperature"], c["k"], c["method"]): c for c in cells}
    rows = []
    for c in cells:
        if sources_key not in c:
            continue
        key = (c["source"], c["workload"], c["temperature"], c["k"])
        alone = {
            m: by[(*key, m)].get("tokens_per_target_step") for m in members.get(c["method"], []) if (*key, m) in by
        }
        best = max(alone, key=lambda m: alone[m] or 0.0) if alone else None
        steps = sum(v["steps"] for v in c[sources_key].values())
        row = {
            "source": c["source"],
            "workload": c["workload"],
            "temperature": c["temperature"],
            "k": c["k"],
            "method": c["method"],
            "tokens_per_target_step": c.get("tokens_per_target_step"),
            "best_alone": best,
            "best_alone_tokens_per_target_step": alone.get(best),
            "gain": c["tokens_per_target_step"] / alone[best] if best and alone[best] else None,
            "speedup_vs_none": c.get("speedup_vs_none"),
            # the fastest member alone in tok/s (served cells measure speed)
            "best_alone_speedup_vs_none": max(
                (by[(*key, m)].get("speedup_vs_none") or 0.0 for m in alone), default=None
            )
            or None,
            "head_skipped": c.get("hybrid_head_skipped"),  # served: steps whose head chain was not run
            "sources": {m: {**v, "share": v["steps"] / steps if steps else None} for m, v in c[sources_key].items()},
        }
        if oracles is not None:
            same = [o for o, ms in oracles.items() if set(ms) == set(members.get(c["method"], []))]
            o = by.get(("reference", *key[1:], same[0])) if same else None
            row["oracle"] = same[0] if o else None
            row["oracle_tokens_per_target_step"] = o and o.get("tokens_per_target_step")
        rows.append(row)
    return rows


def _ints(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        out += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    return out


def main(argv: list[str]) -> int:
    import argparse
    import sys

    from draftsmith.eval.acceptance_plan import ENGINE_DEFAULTS
    from draftsmith.eval.args import head_arg, methods_arg
    from draftsmith.eval.prompts import PromptFileError

    p = argparse.ArgumentParser(
        prog="draftsmith eval matrix", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", required=True, help="target HF dir, or `smollm2`")
    p.add_argument(
        "--head",
        type=head_arg,
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="exported head dir or training checkpoint/run dir (repeatable)",
    )
    p.add_argument(
        "--methods", type=methods_arg, default=list(BASELINES), help="built-in methods (default none,ngram,suffix)"
    )
    p.add_argument(
        "--workloads",
        default="chat,mtbench,code",
        help="comma-separated: chat (needs --prompts or chat=FILE), mtbench, code, NAME=FILE.jsonl",
    )
    p.add_argument("--prompts", default=None, help="the chat workload's JSONL (e.g. a run's heldout_prompts.jsonl)")
    p.add_argument("--ks", type=_ints, default=list(range(1, 8)), help="k sweep, e.g. 1-7 or 1,3,5 (default 1-7)")
    p.add_argument("--temperatures", default="0,1", help="comma-separated (default 0,1: greedy and sampled)")
    p.add_argument("--num-prompts", type=positive_int, default=16, help="prompts per workload (default 16)")
    p.add_argument("--max-tokens", type=positive_int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-served", action="store_true", help="skip vLLM (reference decoder only)")
    p.add_argument("--no-reference", action="store_true", help="skip the in-process reference decoder")
    p.add_argument(
        "--no-oracle",
        action="store_true",
        help="skip the oracle rows (greedy, reference decoder: per step the drafter whose draft is accepted furthest)",
    )
    p.add_argument(
        "--no-hybrid",
        action="store_true",
        help="skip the hybrid rows (heads with a fitted hybrid.json run as hybrid(NAME) in the reference decoder)",
    )
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS per vLLM engine")
    p.add_argument("--timeout", type=float, default=None, help="seconds per served method before it is killed")
    p.add_argument(
        "--reuse-served",
        action="store_true",
        help="read back served cells already under --out that match this request (same target, prompts, "
        "k, length, temperature, seed, methods and head dirs) instead of re-running vLLM",
    )
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        result = run_matrix(
            args.target,
            [w for w in args.workloads.split(",") if w],
            args.methods,
            dict(args.head),
            args.ks,
            [float(t) for t in args.temperatures.split(",")],
            args.max_tokens,
            args.num_prompts,
            args.out,
            seed=args.seed,
            served=not args.no_served,
            reference=not args.no_reference,
            chat_file=args.prompts,
            reuse_served=args.reuse_served,
            oracle=not args.no_oracle,
            hybrid=not args.no_hybrid,
            ngram_min=ENGINE_DEFAULTS["ngram_min"],
            ngram_max=ENGINE_DEFAULTS["ngram_max"],
            threads=args.threads,
            timeout_s=args.timeout,
        )
    except (PromptFileError, FileNotFoundError, ValueError) as e:
        print(f"draftsmith eval matrix: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}/matrix.json, report.md and {len(result.get('plots') or {})} plots")
    failed = [c for c in result["cells"] if c.get("status") != "ok"]
    return 1 if failed else 0

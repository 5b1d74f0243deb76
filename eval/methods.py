"""What each method's engine is in `draftsmith eval acceptance` (and the matrix, the HTTP bench): its exact
`speculative_config`, the extra LLM(...) arguments a head or a hybrid needs, and the drafting mode a head may be
served in. eval/acceptance_plan.py checks a run before it starts, eval/acceptance.py runs the engines,
eval/acceptance_rows.py turns their results into rows and eval/acceptance_report.py writes the tables."""

from __future__ import annotations

from pathlib import Path

from draftsmith.serve.recipe import head_method, head_speculative_config

BASELINES = ("none", "ngram", "suffix")


def check_parallel_drafting(name: str, head_dir: str, wanted: bool) -> None:
    """Refuse to serve a head in the drafting mode it was not trained for (both load in vLLM and serve wrongly)."""
    method = head_method(str(Path(head_dir).resolve()))
    if method == "mlp_speculator":
        raise ValueError(f"head {name} ({head_dir}) is an MLP speculator: parallel_drafting is for EAGLE-3 heads")
    if method == "dflash":
        if not wanted:
            raise ValueError(
                f"head {name} ({head_dir}) is a DFlash head: it drafts its whole block in one forward (vLLM method "
                "dflash) and has no step-by-step form; leave parallel drafting on (or auto)"
            )
        return
    parallel = method == "peagle"
    if wanted and not parallel:
        raise ValueError(
            f"head {name} ({head_dir}) was trained to draft step by step (family eagle3): with parallel_drafting "
            "vLLM would feed its steps 2..k mask slots it never saw (and refuse it: no mask_hidden). Train a "
            "parallel head with conf=peagle_smollm2 or head.family=peagle, or serve this one without parallel drafting"
        )
    if parallel and not wanted:
        raise ValueError(
            f"head {name} ({head_dir}) is a P-EAGLE head: its steps 2..k read mask slots, not the step before, so "
            "drafting it step by step proposes tokens it was never trained to; serve it with parallel drafting"
        )


def speculative_config(name: str, k: int, heads: dict[str, str], ngram_min: int, ngram_max: int) -> dict | None:
    """The exact `speculative_config` vLLM gets for one method (None = no speculation)."""
    if name == "none":
        return None
    if name == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": ngram_min,
            "prompt_lookup_max": ngram_max,
        }
    if name == "suffix":
        # suffix decoding proposes up to k tokens (a tree walk of dynamic length)
        return {"method": "suffix", "num_speculative_tokens": k}
    return head_speculative_config(heads[name], k)


def hybrid_stats_path(runs_dir: Path, name: str) -> Path:
    return runs_dir / f"{name}.hybrid_stats.json"


def head_engine_kwargs(
    name: str,
    heads: dict[str, str],
    hybrid_of: dict[str, str] | None = None,
    runs_dir: Path | None = None,
    force: dict[str, str | None] | None = None,
) -> dict:
    """Extra LLM(...) arguments a head needs: an MLP speculator's directory travels in additional_config, and so
    does a hybrid's policy (with the file its per-source counts go to)."""
    if hybrid_of and name in hybrid_of:
        from draftsmith.serve.hybrid import hybrid_kwargs

        head = hybrid_of[name]
        stats = str(hybrid_stats_path(runs_dir, name)) if runs_dir else None
        kw = hybrid_kwargs(heads[head], force=(force or {}).get(head), stats=stats)
        return {"additional_config": kw["additional_config"]}
    if name not in heads or head_method(str(Path(heads[name]).resolve())) != "mlp_speculator":
        return {}
    from draftsmith.serve.plugin import speculative_kwargs

    return {"additional_config": speculative_kwargs(heads[name])["additional_config"]}

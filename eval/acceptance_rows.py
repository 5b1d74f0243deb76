"""A served-acceptance run's figures (eval/acceptance.py): from each method's child result (vLLM's spec-decode counters,
the outputs, the timings) to its row of the report, against no speculation's outputs and speed; the rounds of a
repeated sweep merged into one cell."""

from __future__ import annotations

import functools
import statistics
from pathlib import Path

from draftsmith.serve.runner import counter_sum


def acceptance_metrics(counters: dict) -> dict:
    """α, τ and per-position acceptance from vLLM's spec-decode counters (all None without speculation)."""
    if not counters:
        return {"acceptance_rate": None, "mean_acceptance_length": None, "per_position_acceptance": None}
    drafts = counters.get("num_drafts", 0)
    draft_tokens = counters.get("num_draft_tokens", 0)
    accepted = counters.get("num_accepted_tokens", 0)
    per_pos = counters.get("num_accepted_tokens_per_pos", [])
    return {
        "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        # no draft at all: every step emitted exactly one token
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts else 1.0,
        "per_position_acceptance": [a / drafts for a in per_pos] if drafts else None,
    }


@functools.lru_cache(maxsize=None)
def exported_draft_vocab(model_dir: str):
    """The draft vocab a head's export records (its `d2t` and `t2d`), read once per directory; None for a head without
    one (a training-free method, a head drafting over the whole vocab) or a directory that is not there."""
    from safetensors import safe_open

    from draftsmith.train.data.vocab import vocab_from_d2t

    for path in sorted(Path(model_dir).glob("*.safetensors")) if Path(model_dir).is_dir() else ():
        with safe_open(str(path), "pt") as f:
            if {"d2t", "t2d"} <= set(f.keys()):
                return vocab_from_d2t(f.get_tensor("d2t"), f.get_tensor("t2d").numel())
    return None


def vocab_coverage(vocab, outputs: list[list[int]]) -> float | None:
    """The share of `outputs`' tokens (no speculation's) inside a draft vocab (`DraftVocab.coverage`): each one outside
    is a sure rejection."""
    import torch

    ids = torch.tensor([i for out in outputs for i in out], dtype=torch.long)
    if not ids.numel():
        return None
    known = ids[(ids >= 0) & (ids < vocab.vocab_size)]  # an id past the target's vocab counts as outside
    return vocab.coverage(torch.bincount(known, minlength=vocab.vocab_size)) * known.numel() / ids.numel()


def tokens_per_step(generated: int, accepted: int) -> float | None:
    """Tokens per target forward over all steps: each step emits 1 + its accepted draft tokens."""
    steps = generated - accepted
    return generated / steps if steps > 0 else None


def compare_outputs(outputs: list[list[int]], reference: list[list[int]]) -> tuple[float, list[dict]]:
    """Share of prompts whose token ids equal the reference, and where the others first differ."""
    mismatches = []
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        if out != ref:
            pos = next((j for j, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
            mismatches.append({"prompt": i, "first_diff_at": pos, "len": len(out), "len_ref": len(ref)})
    return 1.0 - len(mismatches) / max(1, len(reference)), mismatches


def summarize(name: str, child: dict, spec: dict | None, reference: list[list[int]] | None) -> dict:
    """One method's row of the report from its child's raw result."""
    row = {"speculative_config": spec, "log": child.get("log")}
    if "error" in child:
        return {**row, "status": "failed", "error": child["error"]}
    gen, gen_s, counters = child["generated_tokens"], child["generation_s"], child["counters"]
    row.update(
        status="ok",
        num_prompts=len(child["output_token_ids"]),
        prompt_tokens=child["prompt_tokens"],
        generated_tokens=gen,
        generation_s=gen_s,
        output_tokens_per_s=gen / gen_s if gen_s else None,
        engine_start_s=child["engine_start_s"],
        import_s=child["import_s"],
        process_s=child["process_s"],
        **acceptance_metrics(counters),
        tokens_per_target_step=tokens_per_step(gen, counters.get("num_accepted_tokens", 0)),
        counters=counters,
        counters_at_start=child["counters_at_start"],
        # wall time of vLLM's drafting call per engine step that drafted (whole batch), and its share of generation
        draft_ms_per_step=1e3 * child["draft_s"] / child["draft_calls"] if child.get("draft_calls") else None,
        draft_share=child["draft_s"] / gen_s if child.get("draft_calls") and gen_s else None,
        # where an engine step's time goes (serve/step_timer.py): target forward, draft, sampling, engine loop
        step_breakdown=child.get("step_breakdown") or None,
        torch_threads=child["torch_threads"],
        outputs=child["result_file"],
        match_vs_none=None,
    )
    if reference is not None and name != "none":
        row["match_vs_none"], row["mismatches"] = compare_outputs(child["output_token_ids"], reference)
    if child.get("rounds"):  # repeats: how many, and the rounds whose outputs differ from the first's
        row.update(rounds=child["rounds"], round_mismatches=child["round_mismatches"])
    return row


def rows_at(i: int | None, names, children: dict, spec: dict, temperature: float) -> dict:
    """Every method's row at sweep entry i (None: no sweep), its speed against no speculation's at that batch."""

    def at(child: dict) -> dict:
        return child if i is None or "error" in child else {**child, **child["sweep"][i]}

    none = at(children.get("none", {"error": "not run"}))
    reference = none.get("output_token_ids") if temperature == 0 else None
    rows = {name: summarize(name, at(children[name]), spec[name], reference) for name in names}
    for name, row in rows.items():  # how much of what the target says a head's draft vocab can say at all
        model = (spec[name] or {}).get("model")
        vocab = exported_draft_vocab(str(model)) if model and reference and row["status"] == "ok" else None
        if vocab is not None:
            row["draft_vocab_coverage"] = vocab_coverage(vocab, reference)
    ref_speed = rows.get("none", {}).get("output_tokens_per_s")
    ref_rounds = none.get("rounds_tok_s")
    for name, row in rows.items():
        speed = row.get("output_tokens_per_s")
        row["speedup_vs_none"] = speed / ref_speed if speed and ref_speed else None
        mine = at(children[name]).get("rounds_tok_s")
        if row["status"] == "ok" and mine and ref_rounds and len(mine) == len(ref_rounds) > 1:
            # repeats: each round's ratio to no speculation in the same round, and their median as the figure
            ratios = [a / b for a, b in zip(mine, ref_rounds)]
            row["speedup_rounds"] = ratios
            row["speedup_vs_none"] = statistics.median(ratios)
    return rows


def merge_rounds(parts: list[dict]) -> dict:
    """One sweep cell from its rounds: tokens, seconds, drafting and counters summed (a greedy round repeats the
    same outputs, so the counters are the first round's times the rounds), the first round's outputs (a round whose
    outputs differ from it is named in `round_mismatches`), and each round's tok/s for the paired ratios."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    merged = {**first, "rounds": len(parts), "rounds_tok_s": [p["generated_tokens"] / p["generation_s"] for p in parts]}
    for key in ("generation_s", "generated_tokens", "draft_s", "draft_calls", "process_s"):
        merged[key] = sum(p.get(key) or 0 for p in parts)
    merged["counters"] = functools.reduce(counter_sum, (p["counters"] for p in parts), {})
    same = first["output_token_ids"]
    merged["round_mismatches"] = [i + 1 for i, p in enumerate(parts) if p["output_token_ids"] != same]
    return merged

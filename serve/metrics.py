"""A vLLM server's Prometheus `/metrics`, read as the counters draftsmith reports: vLLM's spec-decode counters and the
hybrid drafter's per-source counts (serve/hybrid.py), summed over label sets (engines) as `serve/runner.py` sums
`LLM.get_metrics()`."""

from __future__ import annotations

import re

from draftsmith.serve.runner import SPEC_COUNTERS, counter_delta

HYBRID_PREFIX = "draftsmith:hybrid_"
# Prometheus text exposition: name{labels} value (a counter's samples end in _total; _created samples are skipped)
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+([-+0-9.eEinfINFNa]+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict:
    """{"spec": {num_drafts, num_draft_tokens, num_accepted_tokens, num_accepted_tokens_per_pos: [...]},
    "hybrid": {source: {steps, draft_tokens, accepted_tokens}}, "hybrid_head_skipped": n, "generation_tokens": n}."""
    spec: dict = {}
    per_pos: dict[int, int] = {}
    hybrid: dict[str, dict[str, int]] = {}
    out = {"spec": spec, "hybrid": hybrid, "hybrid_head_skipped": None, "generation_tokens": 0}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m or line.startswith("#"):
            continue
        name, labels, value = m[1], dict(LABEL.findall(m[2] or "")), float(m[3])
        if name.endswith("_created"):
            continue
        base = name[: -len("_total")] if name.endswith("_total") else name
        key = SPEC_COUNTERS.get(base)
        if key == "num_accepted_tokens_per_pos":
            pos = int(labels.get("position", 0))
            per_pos[pos] = per_pos.get(pos, 0) + int(value)
        elif key is not None:
            spec[key] = spec.get(key, 0) + int(value)
        elif base == "vllm:generation_tokens":
            out["generation_tokens"] += int(value)
        elif base == f"{HYBRID_PREFIX}head_skipped_steps":
            out["hybrid_head_skipped"] = (out["hybrid_head_skipped"] or 0) + int(value)
        elif base.startswith(HYBRID_PREFIX) and "source" in labels:
            field = base[len(HYBRID_PREFIX) :]
            src = hybrid.setdefault(labels["source"], {"steps": 0, "draft_tokens": 0, "accepted_tokens": 0})
            src[field] = src.get(field, 0) + int(value)
    if per_pos:
        spec["num_accepted_tokens_per_pos"] = [per_pos.get(i, 0) for i in range(max(per_pos) + 1)]
    return out


def delta(after: dict, before: dict) -> dict:
    """after - before of two `parse` results: what the requests in between did."""
    hybrid = {
        src: {k: v - before["hybrid"].get(src, {}).get(k, 0) for k, v in counts.items()}
        for src, counts in after["hybrid"].items()
    }
    skipped = after["hybrid_head_skipped"]
    return {
        "spec": counter_delta(after["spec"], before["spec"]),
        "hybrid": hybrid,
        "hybrid_head_skipped": None if skipped is None else skipped - (before["hybrid_head_skipped"] or 0),
        "generation_tokens": after["generation_tokens"] - before["generation_tokens"],
    }

"""MLP speculator stage 2 data: prompts cut from the training samples, continued by the frozen target.

Each prompt is the last `prompt_tokens` tokens before the start of a randomly chosen assistant turn (so
the target answers in the regime it is served in); the target's continuation (greedy and/or sampled,
one pass per temperature) becomes a sample whose generated tokens are all supervised. Generation goes
through `draftsmith.generate.cached_generate`: vLLM when installed, and cached, so a resumed run reads it back.
"""

from __future__ import annotations

import random
from dataclasses import replace

from draftsmith.errors import ConfigError
from draftsmith.train.data.render import Sample


def stage2_prompts(
    samples: list[Sample], num: int, prompt_tokens: int | None, seed: int
) -> list[tuple[str, list[int]]]:
    """(conv_id, prompt ids) for up to `num` samples, each ending right before an assistant turn begins."""
    rng = random.Random(f"draftsmith-stage2:{seed}")
    order = list(range(len(samples)))
    rng.shuffle(order)
    out = []
    for i in order:
        s = samples[i]
        starts = [t for t in range(1, len(s.loss_mask)) if s.loss_mask[t] and not s.loss_mask[t - 1]]
        if not starts:
            continue
        p = rng.choice(starts)
        out.append((s.conv_id, s.input_ids[max(0, p - prompt_tokens) if prompt_tokens else 0 : p]))
        if len(out) == num:
            break
    return out


def stage2_samples(prompts: list[tuple[str, list[int]]], outputs: list[list[int]], tag: str) -> list[Sample]:
    """prompt + continuation, the continuation supervised."""
    return [
        Sample(input_ids=ids + gen, loss_mask=[0] * len(ids) + [1] * len(gen), conv_id=f"{cid}@{tag}")
        for (cid, ids), gen in zip(prompts, outputs)
        if gen
    ]


def build_stage2_data(cfg, data, target_path: str, cache_root, log=print):
    """`data` with its training samples replaced by the target's continuations (held-out set unchanged)."""
    from draftsmith.generate import cached_generate

    s2 = cfg.stage2
    prompts = stage2_prompts(data.train, s2.num_prompts, s2.prompt_tokens, s2.seed)
    if not prompts:
        raise ConfigError("stage 2: no training sample has an assistant turn to cut a prompt before")
    train: list[Sample] = []
    for temp in s2.temperatures:
        outs = cached_generate(
            target_path,
            [p for _, p in prompts],
            s2.max_tokens,
            float(temp),
            s2.seed,
            cache_root / "generated",
            backend=s2.backend,
            log=log,
            batch_size=s2.batch_size,
        )
        train += stage2_samples(prompts, outs, f"t{temp:g}")
    gen_tokens = sum(sum(s.loss_mask) for s in train)
    log(
        f"stage 2: {len(prompts)} prompts x {len(s2.temperatures)} temperature(s) -> {len(train)} samples, "
        f"{gen_tokens} generated (supervised) tokens"
    )
    stats = {
        **data.stats,
        "stage2": {
            "prompts": len(prompts),
            "temperatures": list(s2.temperatures),
            "samples": len(train),
            "generated_tokens": gen_tokens,
        },
    }
    return replace(data, train=train, stats=stats)

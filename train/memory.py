"""Dry run: per-rank memory of a training run, from shapes alone (meta device: no weights, no download).

    python train/run.py conf=eagle3_llama8b dry_run=true                      # 8 processes (default)
    python train/run.py conf=eagle3_llama8b dry_run=true dry_run_processes=4

The target and the head are built on the meta device from the target's HF config (a local directory's
config.json, the embedded SmolLM2's converted copy, or `target.arch` in conf/target/*.yaml), so parameter
counts are exact. Activations are an upper-bound estimate for the largest batch the data config allows
(`max_tokens_per_batch` tokens, sequences of `max_length`), every position supervised.

Layouts: the frozen target is never given to accelerate (it is not trained), so it is whole on every rank;
with data.features=offline or stream a rank loads only its ends (train/target.py TargetEnds: the embedding, the
final norm and the draft vocab's lm_head rows; held-out eval reads stored features or asks the stream producer),
which is what is counted then. A stream rank's producer process holds the whole target: reported on its own line.
The head and its AdamW state are replicated under DDP;
ZeRO-1 shards the optimizer state, ZeRO-2 (and FSDP SHARD_GRAD_OP) also the gradients, ZeRO-3 (and FSDP
FULL_SHARD) also the parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.errors import ConfigError
from draftsmith.train.heads import families
from draftsmith.train.heads.eagle3 import freeze_output_side, layer_attr

GiB = 1024**3
LAYOUTS = {  # what each layout shards over the processes: (params, grads, optimizer state)
    "ddp": (False, False, False),
    "zero1": (False, False, True),
    "zero2 / fsdp SHARD_GRAD_OP": (False, True, True),
    "zero3 / fsdp FULL_SHARD": (True, True, True),
}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class Shapes:
    target_params: int
    head_trainable: int
    head_frozen: int  # the EAGLE-3 head's copy of the target embedding
    config: object  # the target's HF config


def target_config(cfg):
    """The target's HF config without loading weights or touching the network."""
    from transformers import AutoConfig

    from draftsmith.assets import EMBEDDED_TARGETS, SMOLLM2_NAME, cache_dir

    path = Path(str(cfg.name_or_path)).expanduser()
    if cfg.name_or_path in EMBEDDED_TARGETS:
        path = cache_dir() / "targets" / SMOLLM2_NAME
    if (path / "config.json").is_file():
        return AutoConfig.from_pretrained(path)
    if not cfg.get("arch"):
        raise ConfigError(
            f"dry run: no local config.json for target {cfg.name_or_path!r} and no target.arch in the "
            f"preset; add the architecture numbers to conf/target/*.yaml (see llama3_8b.yaml)"
        )
    arch = dict(cfg.arch)
    return AutoConfig.for_model(
        arch.pop("model_type"),
        hidden_size=cfg.hidden_size,
        vocab_size=cfg.vocab_size,
        num_hidden_layers=cfg.num_hidden_layers,
        **arch,
    )


def count_shapes(cfg) -> Shapes:
    """Exact parameter counts of the target and the head, both built on the meta device."""
    from transformers import AutoModelForCausalLM

    from draftsmith.train.target import default_aux_layer_ids

    tc = target_config(cfg.target)
    with torch.device("meta"):
        target = AutoModelForCausalLM.from_config(tc)
        target_params = sum(p.numel() for p in target.parameters())  # tied embeddings counted once
        aux = list(cfg.target.aux_layer_ids or default_aux_layer_ids(tc.num_hidden_layers))
        family = families.get(cfg.head.family)
        head = family.module(family.config.load().from_run(cfg.head, tc, aux))
        if "freeze_lm_head" in family.keys:
            freeze_output_side(head, cfg.head)
    unique = {id(p): p for p in head.parameters()}.values()  # tied stages share parameters
    trainable = sum(p.numel() for p in unique if p.requires_grad)
    frozen = sum(p.numel() for p in unique if not p.requires_grad)
    return Shapes(target_params, trainable, frozen, tc)


def batch_shape(cfg) -> tuple[int, int]:
    """(B, T) of the largest micro-batch the data config allows: full-length sequences, as many as fit."""
    T = min(cfg.data.max_length, cfg.data.max_tokens_per_batch)
    B = max(1, min(cfg.data.max_batch_size, cfg.data.max_tokens_per_batch // T))
    return B, T


def eagle3_activation_bytes(cfg, tc, act_bytes: int) -> tuple[float, float]:
    """(features, head activations kept for backward) of one micro-batch: the TTT unroll's K steps."""
    B, T = batch_shape(cfg)
    N = B * T
    H, I, nh = tc.hidden_size, tc.intermediate_size, tc.num_attention_heads
    hd = layer_attr(tc, "head_dim") or H // nh
    nkv = getattr(tc, "num_key_value_heads", nh)
    K, Vd, hI = cfg.head.ttt_steps, min(cfg.head.draft_vocab_size, tc.vocab_size), cfg.head.intermediate_size or I
    feats = N * (3 * H * act_bytes + Vd * (act_bytes + 4))  # aux states, draft-vocab logits, target softmax (fp32)
    per_layer = 2 * nh * hd + 2 * nkv * hd + 4 * H + 3 * hI
    layer = N * (2 * H * 2 + cfg.head.num_layers * per_layer) * act_bytes  # one draft step's layers
    vocab = N * Vd * 4 * 3  # fp32 logits, log-softmax, product with the target distribution
    # steps >= 1 attend with explicit scores [B, nh, T, T+k] (bf16 scores + fp32 softmax); step 0 is SDPA
    scores = cfg.head.num_layers * sum(B * nh * T * (T + k) * (act_bytes + 4) for k in range(1, K))
    return feats, K * (layer + vocab) + scores


def dflash_activation_bytes(cfg, tc, act_bytes: int) -> tuple[float, float]:
    """(features, head activations kept for backward) of one micro-batch: the context projection over every row,
    then head.anchors blocks of head.block_size rows per sequence over [context | blocks] keys."""
    B, T = batch_shape(cfg)
    N = B * T
    H, I, nh = tc.hidden_size, tc.intermediate_size, tc.num_attention_heads
    hd = layer_attr(tc, "head_dim") or H // nh
    nkv = getattr(tc, "num_key_value_heads", nh)
    Vd, hI, L = min(cfg.head.draft_vocab_size, tc.vocab_size), cfg.head.intermediate_size or I, cfg.head.num_layers
    feats = N * (3 * H * act_bytes + Vd * (act_bytes + 4))  # as EAGLE-3's: aux states, draft-vocab logits
    Q = min(cfg.head.anchors, T) * cfg.head.block_size  # block rows per sequence
    context = N * (2 * H + L * 2 * nkv * hd) * act_bytes  # fc output, its norm, every layer's keys and values
    per_layer = 2 * nh * hd + 2 * nkv * hd + 4 * H + 3 * hI
    rows = B * Q * (H + L * per_layer) * act_bytes
    scores = L * B * nh * Q * (T + Q) * (act_bytes + 4)
    vocab = B * Q * Vd * 4 * 3
    return feats, context + rows + scores + vocab


def mlp_activation_bytes(cfg, tc, act_bytes: int) -> tuple[float, float]:
    """(features, head activations kept for backward) of one micro-batch: n_predict stages over the draft vocab
    (head.draft_vocab_size, 0 = the target's)."""
    B, T = batch_shape(cfg)
    N = B * T
    n, D = cfg.head.n_predict, cfg.head.inner_dim or tc.hidden_size
    V = min(cfg.head.get("draft_vocab_size") or tc.vocab_size, tc.vocab_size)
    feats = N * tc.hidden_size * act_bytes
    return feats, n * N * (4 * D * act_bytes + V * 4 * 2)  # per stage: proj/ln/gelu states, fp32 logits + CE grad


def activation_bytes(cfg, tc, act_bytes: int) -> dict[str, float]:
    """Upper-bound activation memory of one micro-batch: target forward (no grad) and head (kept for backward)."""
    B, T = batch_shape(cfg)
    N = B * T
    H, L, I = tc.hidden_size, tc.num_hidden_layers, tc.intermediate_size
    # target: every layer's hidden state is returned (output_hidden_states), plus one layer's MLP at a time
    target = N * ((L + 1) * H + 3 * I) * act_bytes
    feats, head = families.get(cfg.head.family).memory(cfg, tc, act_bytes)  # the head family's own estimate
    return {"target forward (transient)": target, "features": feats, "head (kept for backward)": head}


def target_ends_params(cfg, tc) -> int:
    """What TargetEnds holds: the embedding, the final norm and the lm_head rows the objective reads."""
    # the draft vocab's lm_head rows (EAGLE-3, P-EAGLE); the MLP speculator reads none
    rows = min(cfg.head.draft_vocab_size, tc.vocab_size) if families.get(cfg.head.family).reads_target_logits else 0
    return (tc.vocab_size + 1 + rows) * tc.hidden_size


def estimate(cfg, processes: int) -> dict:
    """Per-rank GiB for each layout (see the module docstring)."""
    s = count_shapes(cfg)
    mp = cfg.mixed_precision
    tdtype = cfg.target.dtype if cfg.target.dtype != "auto" else ("bfloat16" if mp != "no" else "float32")
    act_bytes = 2 if mp in ("bf16", "auto") else 4  # "auto" is bf16 on every GPU this is meant for
    acts = activation_bytes(cfg, s.config, act_bytes)
    ends_only = cfg.data.get("features") in ("offline", "stream") and cfg.head.get("init") != "target"
    target_w = (target_ends_params(cfg, s.config) if ends_only else s.target_params) * DTYPE_BYTES[tdtype]
    if ends_only:
        acts["target forward (transient)"] = 0
    rows = {}
    for name, (shard_p, shard_g, shard_o) in LAYOUTS.items():
        div = lambda sharded: processes if sharded else 1
        parts = {
            "target weights": target_w,
            "head params (fp32)": 4 * (s.head_trainable + s.head_frozen) / div(shard_p),
            "grads (fp32)": 4 * s.head_trainable / div(shard_g),
            "AdamW state (2 x fp32)": 8 * s.head_trainable / div(shard_o),
            **acts,
        }
        rows[name] = {k: v / GiB for k, v in parts.items()} | {"total": sum(parts.values()) / GiB}
    return {
        "processes": processes,
        "batch": batch_shape(cfg),
        "target_params": s.target_params,
        "target_dtype": tdtype,
        "head_trainable_params": s.head_trainable,
        "head_frozen_params": s.head_frozen,
        "layouts": rows,
        # data.features=stream: each rank's producer process (the whole target and its forward, beside the rank)
        "stream_producer_gib": (s.target_params * DTYPE_BYTES[tdtype]) / GiB
        if cfg.data.get("features") == "stream"
        else None,
    }


def report(cfg, processes: int) -> str:
    """The dry run's printed table."""
    e = estimate(cfg, processes)
    B, T = e["batch"]
    cols = list(next(iter(e["layouts"].values())))
    lines = [
        f"dry run: {cfg.target.name_or_path} ({e['target_params'] / 1e9:.2f}B params, {e['target_dtype']}) + "
        f"{cfg.head.family} head ({e['head_trainable_params'] / 1e6:.1f}M trainable, "
        f"{e['head_frozen_params'] / 1e6:.1f}M frozen); micro-batch {B} x {T} tokens; {processes} processes",
        "GiB per rank (activations: upper-bound estimate)",
        "",
        "| layout | " + " | ".join(cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for name, row in e["layouts"].items():
        lines.append(f"| {name} | " + " | ".join(f"{row[c]:.1f}" for c in cols) + " |")
    if e["stream_producer_gib"] is not None:
        lines.append(
            f"\ndata.features=stream: beside each rank, its producer process holds the whole target "
            f"({e['stream_producer_gib']:.1f} GiB of weights, plus its forward's activations)"
        )
    return "\n".join(lines)

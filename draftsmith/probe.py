"""Timed probes of this machine: GEMM peak, the target's feature forward and the head's training step.

The quickstart plans its budget from them (`draftsmith/quickstart/plan.py`), and bench/train_step.py and
bench/extract.py report against them. Each probe takes seconds: a warm-up round, then the median of a few timed ones.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from draftsmith.train.config import OptimConfig


def cpu_flags() -> str:
    """The CPU flags that decide bf16 and GEMM speed here (avx2 when nothing wider), for every printed figure."""
    try:
        flags = open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split()
    except (OSError, IndexError):
        return "?"
    wide = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16") if f in flags]
    named = " ".join(wide) or ("avx2" if "avx2" in flags else "none")
    # what torch's kernels use: lower than the CPU's when ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA cap it (an AVX2
    # machine emulated on an AVX-512 one), which every figure must then say
    try:
        capability = torch.backends.cpu.get_cpu_capability().lower()
    except (AttributeError, RuntimeError):
        return named
    if wide and "avx512" not in capability:
        named += f"; torch kernels capped at {capability}" + (
            f", oneDNN at {os.environ['ONEDNN_MAX_CPU_ISA']}" if os.environ.get("ONEDNN_MAX_CPU_ISA") else ""
        )
    return named


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def timed(fn, repeats: int = 3) -> float:
    """Median seconds of `fn()` over `repeats` calls after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gemm_peak(precision: str, size: int = 2048):
    """A closure timing one [size x size] @ [size x size] matmul; returns its FLOPs."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    return lambda: (a @ b, 2 * size**3)[1]


def gemm_rate(precision: str, repeats: int = 9) -> float:
    """FLOP/s of a square matmul in `precision` at the current thread count: the machine's practical peak, so the
    fastest of `repeats` calls (a median let one neighbour's burst halve it: 223 against 396 GFLOP/s, same machine)."""
    fn = gemm_peak(precision)
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return 2 * 2048**3 / best


def forward_flops(tc, tokens: int, seq: int) -> float:
    """Matmul FLOPs of the target's feature forward (every decoder layer, no lm_head: extraction skips it)."""
    H, L = tc.hidden_size, tc.num_hidden_layers
    hd = getattr(tc, "head_dim", None) or H // tc.num_attention_heads
    nh, nkv, inter = tc.num_attention_heads, tc.num_key_value_heads, tc.intermediate_size
    per_token = L * (H * (nh + 2 * nkv) * hd + nh * hd * H + 3 * H * inter + nh * hd * seq)  # MACs; causal ~T/2 x 2
    return 2 * tokens * per_token


def target_forward_rate(target, batch: int = 4, seq: int = 512, repeats: int = 2) -> float:
    """Tokens/s of the target's feature forward (aux + final hidden states, no logits), as extraction runs it."""
    ids = torch.randint(0, target.config.vocab_size, (batch, seq))
    mask = torch.ones_like(ids)
    none = torch.zeros(0, dtype=torch.long)
    return batch * seq / timed(lambda: target.features(ids, mask, none), repeats)


def make_step(family: str, tc, tokens: int, vocab: int, ttt: int, optim: str = "adamw", tie_weights: bool = False,
              anchors: int = 64):  # fmt: skip
    """A closure running one full training step on random features shaped like the target's; returns (step, tokens
    per step, matmul FLOPs per step). step(precision) returns the seconds its optimizer step took."""
    from draftsmith.train.heads.eagle3 import Eagle3Config, Eagle3Head
    from draftsmith.train.heads.mlp_speculator import MLPSpeculator, MLPSpeculatorConfig
    from draftsmith.train.objective import per_head_loss
    from draftsmith.train.optim import build_optimizer
    from draftsmith.train.ttt.unroll import ttt_unroll

    torch.manual_seed(0)
    B, T = max(1, tokens // 512), min(tokens, 512)  # packed like data.max_tokens_per_batch, 512-token samples
    ids = torch.randint(0, tc.vocab_size, (B, T))
    mask = torch.ones(B, T, dtype=torch.long)
    if family == "eagle3":
        cfg = Eagle3Config.from_target(
            tc, vocab, [2, tc.num_hidden_layers // 2, tc.num_hidden_layers - 3], ttt_steps=ttt
        )
        head = Eagle3Head(cfg)
        head.set_vocab(torch.zeros(vocab, dtype=torch.long), torch.arange(tc.vocab_size) < vocab)
        aux = torch.randn(B, T, 3 * tc.hidden_size, dtype=torch.bfloat16)  # a bf16 target's states, as stored
        logits = torch.randn(B, T, vocab)  # the target's logits over the draft vocab

        def loss():
            return ttt_unroll(head, aux, logits, ids, mask, ttt, 0.8).loss
    elif family == "dflash":  # ttt = the drafts of a block (block_size - 1); anchors = blocks per sequence
        from draftsmith.train.block_loss import block_loss
        from draftsmith.train.heads.dflash import DFlashConfig, DFlashHead

        aux_ids = [2, tc.num_hidden_layers // 2, tc.num_hidden_layers - 3]
        head = DFlashHead(DFlashConfig.from_target(tc, vocab, aux_ids, mask_token_id=0, block_size=ttt + 1))
        head.set_vocab(torch.zeros(vocab, dtype=torch.long), torch.arange(tc.vocab_size) < vocab)
        aux = torch.randn(B, T, 3 * tc.hidden_size, dtype=torch.bfloat16)
        logits = torch.randn(B, T, vocab)

        def loss():
            return block_loss(head, aux, logits, ids, mask, anchors, 0.8).loss
    else:
        cfg = MLPSpeculatorConfig(
            emb_dim=tc.hidden_size,
            vocab_size=tc.vocab_size,
            n_predict=ttt,
            draft_vocab_size=min(vocab, tc.vocab_size),
            tie_weights=tie_weights,
        )
        head = MLPSpeculator(cfg)
        if cfg.reduced:
            head.set_vocab(torch.zeros(vocab, dtype=torch.long), torch.arange(tc.vocab_size) < vocab)
        last = torch.randn(B, T, tc.hidden_size, dtype=torch.bfloat16)

        def loss():
            return per_head_loss(head, last.float(), ids, mask, [0.8**i for i in range(ttt)]).loss

    params = [p for p in head.parameters() if p.requires_grad]
    opt = build_optimizer(OptimConfig(name=optim, lr=1e-4), head)

    def step(precision: str) -> float:
        ctx = (
            torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else torch.autocast("cpu", enabled=False)
        )
        with ctx:
            value = loss()
        value.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        t0 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    return step, B * T, step_flops(family, tc, B, T, vocab, ttt, anchors)


def step_flops(family: str, tc, B: int, T: int, vocab: int, ttt: int, anchors: int = 64) -> float:
    """Matmul FLOPs of one training step (forward + backward = 3x the forward), the way the code computes it:
    EAGLE-3 runs fc once and the layer + lm_head on every row at every TTT step (the lm_head and the vocab softmax
    only on supervised rows: all rows here), attention over all T step-0 keys at every step."""
    H, n = tc.hidden_size, B * T
    if family == "eagle3":
        hd = getattr(tc, "head_dim", None) or H // tc.num_attention_heads
        nh, nkv, inter = tc.num_attention_heads, tc.num_key_value_heads, tc.intermediate_size
        layer = 2 * H * (nh + 2 * nkv) * hd + nh * hd * H + 3 * H * inter + H * vocab  # MACs per row
        attn = 2 * T * nh * hd  # scores + weighted values per row, over T keys
        fwd = n * 3 * H * H + ttt * n * (layer + attn)
    elif family == "dflash":  # fc and the context keys/values on every row; the layer on the blocks' rows only
        hd = getattr(tc, "head_dim", None) or H // tc.num_attention_heads
        nh, nkv, inter = tc.num_attention_heads, tc.num_key_value_heads, tc.intermediate_size
        q = B * min(anchors, T) * (ttt + 1)  # block rows
        layer = 2 * H * (nh + 2 * nkv) * hd + nh * hd * H + 3 * H * inter + H * vocab
        fwd = n * (3 * H * H + 2 * H * nkv * hd) + q * (layer + 2 * (T + anchors * (ttt + 1)) * nh * hd)
    else:  # per head: proj (H -> H), its output rows (H -> the draft vocab, or the target's)
        fwd = ttt * n * (H * H + H * min(vocab, tc.vocab_size))
    return 3 * 2 * fwd


def head_step_rate(
    tc,
    tokens: int,
    vocab: int,
    ttt: int,
    optim: str,
    precision: str,
    repeats: int = 2,
    family: str = "eagle3",
    tie_weights: bool = False,
) -> float:
    """Tokens/s of one training step (forward, backward, clip, optimizer) on random stored features: an EAGLE-3
    head with `ttt` steps, a DFlash head drafting `ttt` tokens a block, or (family="mlp_speculator") an MLP
    speculator with `ttt` heads of `vocab` rows."""
    step, n, _ = make_step("eagle3" if family == "peagle" else family, tc, tokens, vocab, ttt, optim, tie_weights)
    return n / timed(lambda: step(precision), repeats)

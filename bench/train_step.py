"""Head training throughput: one optimizer step (forward, backward, clip, AdamW) per head family, precision and
thread count, on SmolLM2-135M-Instruct's shapes, with the target's features precomputed (what every epoch after
the first costs with data.features=memory|offline).

    python bench/train_step.py                       # eagle3 + mlp_speculator, fp32 vs bf16 autocast, 1 and 2 threads
    python bench/train_step.py --tokens 1024 --repeats 5 --families eagle3 --threads 1
    python bench/train_step.py --families eagle3 --optim adamw,muon --tokens 512,1024 --precisions fp32 --threads 2

All settings are timed in one process, interleaved round by round (A B A B ...), so a neighbour's load hits
each alike; the table reports the median step and its tok/s against the first setting of its family. It also
counts each step's matmul FLOPs (forward + backward = 3x the forward's, attention included; not the optimizer's)
and reports the achieved FLOP/s against the machine's GEMM peak, measured in the same rounds (a square matmul of
the same precision and threads), and the seconds of the step that the optimizer took (Muon's Newton-Schulz
iterations: a fixed cost per step, so larger batches spread it over more tokens).
Not a test: the figures depend on the machine (and print its CPU flags that matter).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoConfig

from draftsmith.probe import cpu_flags, gemm_peak, make_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2", help="a target name or HF dir whose config gives the shapes")
    ap.add_argument("--families", default="eagle3,mlp_speculator")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--tokens", default="1024", help="tokens per step, comma list (data.max_tokens_per_batch)")
    ap.add_argument(
        "--draft-vocab",
        type=int,
        default=8192,
        help="rows of EAGLE-3's lm_head and of each MLP speculator head (the target's vocab size for a full-vocab one)",
    )
    ap.add_argument("--ttt", type=int, default=3, help="TTT steps / speculator heads")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--optim", default="adamw", help="optim.name, comma list: adamw | muon (Muon's Newton-Schulz steps cost time)"
    )
    args = ap.parse_args()
    from draftsmith.train.build import resolve_target

    tc = AutoConfig.from_pretrained(resolve_target(args.target))
    # a step closure per family, optimizer and batch size; every setting adds a precision and a thread count
    kinds = [
        (f, o, int(n)) for f in args.families.split(",") for o in args.optim.split(",") for n in args.tokens.split(",")
    ]
    settings = [(k, p, int(t)) for k in kinds for t in args.threads.split(",") for p in args.precisions.split(",")]
    steps = {k: make_step(k[0], tc, k[2], args.draft_vocab, args.ttt, k[1]) for k in kinds}
    peaks = {p: gemm_peak(p) for p in args.precisions.split(",")}
    times: dict = {s: [] for s in settings}
    opt_times: dict = {s: [] for s in settings}
    peak_times: dict = {(p, int(t)): [] for p in peaks for t in args.threads.split(",")}
    for r in range(args.repeats + 1):  # round 0 warms up (allocator, oneDNN kernels) and is dropped
        for s in settings:
            kind, precision, threads = s
            torch.set_num_threads(threads)
            t0 = time.perf_counter()
            t_opt = steps[kind][0](precision)
            if r:
                times[s].append(time.perf_counter() - t0)
                opt_times[s].append(t_opt)
        for p, t in peak_times:
            torch.set_num_threads(t)
            t0 = time.perf_counter()
            flops = peaks[p]()
            if r:
                peak_times[p, t].append(flops / (time.perf_counter() - t0))
    peak = {k: statistics.median(v) for k, v in peak_times.items()}
    print(
        f"CPU flags: {cpu_flags()}; draft vocab "
        f"{args.draft_vocab}, TTT/heads {args.ttt}, median of {args.repeats} interleaved rounds"
    )
    print(
        "GEMM peak (2048^3 matmul): "
        + ", ".join(f"{p} {t} thread(s) {v / 1e9:.0f} GFLOP/s" for (p, t), v in sorted(peak.items()))
    )
    print(
        "| family | optimizer | tokens/step | precision | threads | s/step | of it the optimizer | tok/s "
        "| tok/s vs first of family | GFLOP/s | of GEMM peak |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    first = {}
    for s in settings:
        kind, precision, threads = s
        family, optim, tokens = kind
        med = statistics.median(times[s])
        tok_s = steps[kind][1] / med
        first.setdefault(family, tok_s)
        achieved = steps[kind][2] / med
        print(
            f"| {family} | {optim} | {tokens} | {precision} | {threads} | {med:.3f} "
            f"| {statistics.median(opt_times[s]):.3f} | {tok_s:.0f} "
            f"| {tok_s / first[family]:.2f}x | {achieved / 1e9:.1f} | {achieved / peak[precision, threads]:.0%} |"
        )


if __name__ == "__main__":
    main()

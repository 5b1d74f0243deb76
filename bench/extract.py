"""Feature extraction on the embedded default target: tokens/s against a plain HF forward, disk bytes per token
per head family and storage dtype, peak RSS.

    OMP_NUM_THREADS=1 python bench/extract.py --samples 32 --max-length 512 --out bench/results/2026-11-22/extract.md
    python bench/extract.py --samples 64 --max-length 1024 --vllm --out bench/results/2026-11-29/extract_vllm.md

`--vllm` adds `draftsmith extract --backend vllm` (the serving engine's prefill) on the same samples, run as the
user runs it, in its own process: its rate excludes the engine's start-up, which is reported beside it.

The samples are the first ShareGPT conversations rendered as `conf=eagle3_smollm2 data.path=sharegpt` renders
them. The plain forward is `model(input_ids, attention_mask)` (the HF causal LM with its full-vocab logits) and
the backbone alone (`model.model`, no lm_head) over the same length-sorted groups of samples; extraction is
`draftsmith extract` end to end after loading (target forward, slicing, safetensors packing, sha256, fsynced writes).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def plain_forward_rate(target, samples, groups, pad_id: int, backbone: bool) -> tuple[float, float]:
    """(tokens per wall second, tokens per CPU second) of HF forwards over `groups` of samples (after a warm-up)."""
    from draftsmith.train.data.dataset import collate

    model = target.model.model if backbone else target.model
    batches = [collate([samples[i] for i in g], pad_id) for g in groups]
    with torch.no_grad():
        model(input_ids=batches[0]["input_ids"], attention_mask=batches[0]["attention_mask"])
        start, cpu = time.perf_counter(), time.process_time()
        for b in batches:
            model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    tokens = sum(len(s.input_ids) for s in samples)
    return tokens / elapsed, tokens / cpu


def vllm_extract(overrides: list[str], out: Path, store: str) -> dict:
    """`draftsmith extract --backend vllm` in its own process: its summary line's figures and the engine start-up."""
    import re
    import subprocess

    cmd = [sys.executable, "-m", "draftsmith.cli", "extract", "--backend", "vllm", "--dtype", store, "--out", str(out)]
    p = subprocess.run([*cmd, *overrides], capture_output=True, text=True)
    log = p.stdout + p.stderr
    if p.returncode != 0:
        raise RuntimeError(f"draftsmith extract --backend vllm failed:\n{log[-3000:]}")
    m = re.search(r"extract: \d+ samples / (\d+) tokens in ([\d.]+) s = (\d+) tok/s", log)
    start = re.search(r"vLLM engine ready in (\d+) s", log)
    manifest = json.loads((out / "manifest.json").read_text())
    tokens, seconds = int(m.group(1)), float(m.group(2))
    return {"store": store, "tok_per_s": tokens / seconds, "start_s": float(start.group(1)), "bytes": manifest["bytes"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=32, help="training conversations to extract")
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--out", default=None, help="also write the markdown here")
    p.add_argument("--vllm", action="store_true", help="also time draftsmith extract --backend vllm")
    args = p.parse_args(argv)

    from draftsmith.train.build import build_run
    from draftsmith.train.config import compose_config as compose
    from draftsmith.train.features.extract import extract, forward_groups

    base = [
        "conf=eagle3_smollm2",
        "data.path=sharegpt",
        "data.also=[]",
        f"data.num_conversations={args.samples}",
        "data.heldout=8",
        f"data.max_length={args.max_length}",
        "data.max_tokens_per_batch=2048",
        "wandb.mode=disabled",
    ]
    cfg = compose(base)
    quiet = lambda *a: None  # noqa: E731
    inputs = build_run(cfg, torch.device("cpu"), None, log=quiet)  # loaded once, reused by every extraction
    target, data = inputs[0], inputs[2]
    samples = data.train
    tokens = sum(len(s.input_ids) for s in samples)
    groups = forward_groups(samples, list(range(len(samples))), cfg.data.max_tokens_per_batch, cfg.data.max_batch_size)
    dtype = str(next(target.model.parameters()).dtype).replace("torch.", "")
    from draftsmith.probe import cpu_flags, cpu_name, forward_flops, gemm_rate

    peak = gemm_rate("bf16" if dtype == "bfloat16" else "fp32")  # the machine's matmul rate at this precision
    mean_len = tokens / max(1, len(samples))
    flops_per_token = forward_flops(target.config, 1, int(mean_len))
    hf_logits = plain_forward_rate(target, samples, groups, target.pad_id, backbone=False)
    hf_backbone = plain_forward_rate(target, samples, groups, target.pad_id, backbone=True)

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-extract-") as tmp:
        for family, head in (("eagle3", []), ("mlp_speculator", ["head=mlp"])):
            for store in ("bf16", "fp32"):
                s = extract(
                    compose(base + head), Path(tmp) / f"{family}-{store}", dtype=store, log=quiet, inputs=inputs
                )
                rows.append((family, store, s))
        engine = (
            vllm_extract(base, Path(tmp) / "vllm", "bf16" if dtype == "bfloat16" else "fp32") if args.vllm else None
        )
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    lines = [
        f"# Feature extraction, {date.today().isoformat()}",
        "",
        f"Target SmolLM2-135M-Instruct ({dtype}, CPU, {torch.get_num_threads()} torch thread(s)); "
        f"{len(samples)} ShareGPT "
        f"training samples, {tokens} tokens (max length {args.max_length}); forward groups of <= "
        f"{cfg.data.max_tokens_per_batch} padded tokens. Command: `python bench/extract.py --samples {args.samples} "
        f"--max-length {args.max_length}`.",
        "",
        "Rates per CPU second of this process (other jobs shared the 2 cores: wall-clock rates are shown but",
        "depend on how much CPU the bench got; CPU time leaves out waiting for fsync).",
        "",
        f"CPU: {cpu_name()} ({cpu_flags()}); GEMM peak (2048^3 matmul, {dtype}, these threads): "
        f"{peak / 1e9:.0f} GFLOP/s; the backbone forward is {flops_per_token / 1e6:.0f} MFLOP/token at the mean "
        f"length {mean_len:.0f} (matmuls and attention, draftsmith.probe.forward_flops); share of peak = wall "
        "tok/s x that / peak.",
        "",
        "| what | tokens / CPU s | plain HF forward / this (CPU) | tokens / wall s | share of GEMM peak |",
        "|---|---|---|---|---|",
        f"| plain HF forward (causal LM, full-vocab logits) | {hf_logits[1]:.0f} | 1.00 | {hf_logits[0]:.0f} | — |",
        f"| HF backbone forward (no lm_head) | {hf_backbone[1]:.0f} | {hf_logits[1] / hf_backbone[1]:.2f} | "
        f"{hf_backbone[0]:.0f} | {hf_backbone[0] * flops_per_token / peak:.0%} |",
    ]
    for family, store, s in rows:
        cpu_rate = s["new_tokens"] / max(s["cpu_seconds"], 1e-9)
        lines.append(
            f"| `draftsmith extract`, {family}, {store} | {cpu_rate:.0f} | {hf_logits[1] / cpu_rate:.2f} | "
            f"{s['tok_per_s']:.0f} | {s['tok_per_s'] * flops_per_token / peak:.0%} |"
        )
    if engine is not None:
        lines.append(
            f"| `draftsmith extract --backend vllm`, eagle3, {engine['store']} (engine start-up "
            f"{engine['start_s']:.0f} s not counted; the engine's threads are not this process's) | — | — | "
            f"{engine['tok_per_s']:.0f} | "
            f"{engine['tok_per_s'] * flops_per_token / peak:.0%} |"
        )
    lines += [
        "",
        "| head family | stored per token | dtype | disk bytes/token | shards, bytes |",
        "|---|---|---|---|---|",
    ]
    for family, store, s in rows:
        what = "aux [3·H] + last [H] + id + mask" if family == "eagle3" else "last [H] + id + mask"
        lines.append(f"| {family} | {what} | {store} | {s['bytes_per_token']:.0f} | {s['bytes']} |")
    lines += ["", f"Peak RSS of the whole bench process: {peak_mb:.0f} MB."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        from draftsmith.paths import portable

        Path(args.out).write_text(portable(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())

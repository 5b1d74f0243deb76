"""Peak memory of a training rank: the whole target in memory (online) against its ends only (offline features).

    python bench/offline_rss.py --out bench/results/2026-11-25/offline_rss.md

Trains the same few steps of an EAGLE-3 head on SmolLM2-135M-Instruct twice, each in its own process: with
data.features=online (the target's decoder layers run every batch) and with data.features=offline from features
extracted beforehand (the rank loads only the embedding, the final norm and the draft vocab's lm_head rows,
train/target.py TargetEnds). Reports each process's peak RSS (ru_maxrss) and their ratio; not a test: figures
depend on the machine, the allocator and the libraries loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEAK = (
    "import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
    "print('peak_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(p.returncode)"
)


def overrides(out: Path, *extra: str) -> list[str]:
    return [
        "conf=eagle3_smollm2",
        "data.path=sharegpt",
        "data.also=[]",
        "data.num_conversations=48",
        "data.heldout=8",
        "data.max_length=256",
        "data.max_tokens_per_batch=1024",
        "optim.max_steps=4",
        "optim.max_minutes=null",
        "eval_every=0",
        "log_every=1",
        "save_every=0",
        "eval_batches=2",
        "wandb.mode=disabled",
        "target.dtype=float32",
        "mixed_precision=no",
        f"output_dir={out}",
        *extra,
    ]


def peak_rss(cmd: list[str], env: dict) -> int:
    """Peak RSS in bytes of `cmd` (a child of a fresh process, so nothing else is counted)."""
    p = subprocess.run([sys.executable, "-c", PEAK, *cmd], capture_output=True, text=True, env=env, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed:\n{p.stderr[-3000:]}")
    return int(p.stdout.strip().splitlines()[-1].split()[1]) * 1024


def measure(work: Path) -> dict:
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    run = [sys.executable, str(ROOT / "train" / "run.py")]
    feats = work / "features"
    subprocess.run(
        [sys.executable, "-m", "draftsmith.cli", "extract", "--out", str(feats), *overrides(work / "x")],
        check=True,
        env=env,
        cwd=ROOT,
        capture_output=True,
    )
    online = peak_rss(run + overrides(work / "online", "data.features=online"), env)
    offline = peak_rss(run + overrides(work / "offline", "data.features=offline", f"data.features_dir={feats}"), env)
    losses = {}
    for name in ("online", "offline"):
        rows = [json.loads(x) for x in (work / name / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [r["loss"] for r in rows if "loss" in r]
    return {
        "online_peak_bytes": online,
        "offline_peak_bytes": offline,
        "ratio": offline / online,
        "saved_bytes": online - offline,
        "losses": losses,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="also write the markdown here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="draftsmith-rss-") as tmp:
        r = measure(Path(tmp))
    mib = lambda b: f"{b / 2**20:,.0f} MiB"  # noqa: E731
    text = (
        "Peak RSS of one training process, SmolLM2-135M-Instruct fp32 (538 MB of weights, 113 MB of them the "
        "embedding), EAGLE-3 head, 4 steps of 1,024 tokens, one torch thread\n\n"
        "| features | what the rank loads | peak RSS |\n|---|---|---|\n"
        f"| online | the whole target | {mib(r['online_peak_bytes'])} |\n"
        f"| offline | embedding, final norm, 8,192 lm_head rows | {mib(r['offline_peak_bytes'])} |\n\n"
        f"offline / online = {r['ratio']:.2f} ({mib(r['saved_bytes'])} less); losses online "
        f"{[round(x, 4) for x in r['losses']['online']]}, offline {[round(x, 4) for x in r['losses']['offline']]}\n"
    )
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

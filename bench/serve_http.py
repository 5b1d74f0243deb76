"""One head and one prompt set served two ways, side by side: over HTTP by live vLLM servers, and in-process by
`draftsmith eval acceptance` (the runner every earlier figure came from).

    python bench/serve_http.py --head outputs/quickstart/exported --prompts outputs/quickstart/heldout_prompts.jsonl \
        --out bench/results/DAY/serve_http

Over HTTP, one server at a time on loopback, a fresh one per --levels concurrency (as in process: suffix decoding
and the prefix cache remember what an earlier level served), each measured by `draftsmith eval live`:
`none`, `ngram`, `suffix` through vLLM's server module (the speculative_config eval acceptance gives them), the head
alone through `draftsmith serve --no-hybrid` and `hybrid(head)` through `draftsmith serve` (k from hybrid.json). In
process: `draftsmith eval acceptance` with the same methods, prompts, max_tokens and k, with `--batch-sizes` equal to
the levels (a fresh engine per method and batch size). Every server and engine gets the same environment: float32,
--enforce-eager (eval acceptance's default), OMP_NUM_THREADS and VLLM_CPU_KVCACHE_SPACE as below. Writes
serve_http.json and serve_http.md (tok/s over none's at each level, TTFT / ITL percentiles, tokens per target step,
outputs equal to none's) to --out. Then --load requests of bench/serve_load.py (10 cancelled mid-stream, 10
malformed, concurrency 16, 32 tokens) go to the hybrid's server before it stops.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve_load beside this file
from draftsmith.paths import make_portable  # noqa: E402
from draftsmith.serve.cli import healthy  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "VLLM_CPU_KVCACHE_SPACE": "2"}
FLAGS = ["--enforce-eager", "--dtype", "float32", "--max-num-seqs", "16"]


def serve(argv: list[str], url: str, log: Path, timeout: float = 900.0) -> subprocess.Popen:
    proc = subprocess.Popen(
        argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=ENV, cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}); see {log}")
        if healthy(url) and ("draftsmith serve" not in " ".join(argv) or "ready at" in log.read_text()):
            return proc
        time.sleep(2)
    proc.kill()
    raise RuntimeError(f"server not ready in {timeout} s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--head", required=True, help="an exported head with hybrid.json beside it")
    p.add_argument("--prompts", required=True)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--levels", default="1,8", help="concurrency levels = in-process batch sizes")
    p.add_argument("--port", type=int, default=8300)
    p.add_argument("--load", type=int, default=200, help="then this many requests of load and faults on the hybrid")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    from draftsmith.eval.acceptance import run_acceptance
    from draftsmith.eval.live import measure
    from draftsmith.eval.methods import speculative_config
    from draftsmith.eval.prompts import load_prompts
    from draftsmith.serve.recipe import plan

    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    levels = [int(x) for x in args.levels.split(",")]
    recipe = plan(args.head)
    k, target, url = recipe.k, recipe.target, f"http://127.0.0.1:{args.port}"
    head = str(Path(args.head).resolve())
    plain = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", target, "--port", str(args.port)]
    ours = [sys.executable, "-m", "draftsmith.cli", "serve", head, "--port", str(args.port)]
    servers = {
        "none": plain + FLAGS,
        "ngram": plain + ["--speculative-config", json.dumps(speculative_config("ngram", k, {}, 2, 5))] + FLAGS,
        "suffix": plain + ["--speculative-config", json.dumps(speculative_config("suffix", k, {}, 2, 5))] + FLAGS,
        "head": ours + ["--no-hybrid", "--k", str(k), "--", *FLAGS],
        "hybrid(head)": ours + ["--", *FLAGS],
    }
    record: dict = {
        "head": args.head, "prompts": args.prompts, "num_prompts": args.num_prompts, "max_tokens": args.max_tokens,
        "k": k, "levels": levels, "env": {k_: ENV[k_] for k_ in ("OMP_NUM_THREADS", "VLLM_CPU_KVCACHE_SPACE")},
        "server_flags": FLAGS, "http": {}, "in_process": {},
    }  # fmt: skip
    for name, cmd in servers.items():
        for level in levels:  # a fresh server per level, as in process: suffix decoding (the hybrid's member too)
            # and the prefix cache would otherwise serve a level the answers an earlier level produced
            print(f"serve_http: {name} over HTTP at concurrency {level} ...", flush=True)
            proc = serve(cmd, url, out / "logs" / f"{name}-c{level}.log")
            try:
                got = measure(url, args.prompts, [level], args.max_tokens, num_prompts=args.num_prompts)
                if name not in record["http"]:
                    record["http"][name] = got
                else:
                    record["http"][name]["levels"].update(got["levels"])
                if name == "hybrid(head)" and level == levels[-1] and args.load:  # load and faults (serve_load.py)
                    from serve_load import run as load

                    prompts = load_prompts(args.prompts, 64)
                    record["load"] = load(url, prompts, args.load, 16, 10, 10, 32)
                    print(f"serve_http: load {args.load} requests at concurrency 16: passed={record['load']['passed']}")
            finally:
                stop(proc)
    print("serve_http: in process (eval acceptance) ...", flush=True)
    result = run_acceptance(
        target, args.prompts, ["none", "ngram", "suffix"], {"head": head}, k=k, max_tokens=args.max_tokens,
        num_prompts=args.num_prompts, out_dir=str(out / "in_process"), batch_sizes=levels, hybrids=["head"],
    )  # fmt: skip
    for entry in result["sweep"]:
        record["in_process"][str(entry["batch_size"])] = {
            n: {
                key: r.get(key)
                for key in ("output_tokens_per_s", "speedup_vs_none", "tokens_per_target_step", "match_vs_none")
            }
            for n, r in entry["methods"].items()
        }
    for level in map(str, levels):  # greedy: every server's outputs against no speculation's, prompt by prompt
        ref = record["http"]["none"]["levels"][level]["output_sha1"]
        for res in record["http"].values():
            row = res["levels"][level]
            row["match_vs_none"] = sum(a == b for a, b in zip(row["output_sha1"], ref)) / len(ref)
    (out / "serve_http.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "serve_http.md").write_text(table(record))
    make_portable(out)  # committed records name no machine's paths
    print(table(record))
    return 0


def _f(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(record: dict) -> str:
    lines = [
        f"k={record['k']}, {record['num_prompts']} prompts, max_tokens {record['max_tokens']}, env {record['env']}",
        "",
        "| method | level | HTTP tok/s (vs none) | TTFT p50 / p90 | ITL p50 / p90 | HTTP tok/step "
        "| HTTP outputs = none's | in-process tok/s vs none | in-process tok/step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ms = lambda s: "-" if s is None else f"{s * 1000:.0f} ms"  # noqa: E731
    for level in map(str, record["levels"]):
        none = record["http"]["none"]["levels"][level]["output_tok_s"]
        for name, res in record["http"].items():
            r = res["levels"][level]
            ip = record["in_process"].get(level, {}).get(name, {})
            lines.append(
                f"| {name} | {level} | {r['output_tok_s']} ({r['output_tok_s'] / none:.2f}×) | "
                f"{ms(r['ttft_s']['p50'])} / {ms(r['ttft_s']['p90'])} | "
                f"{ms(r['itl_s']['p50'])} / {ms(r['itl_s']['p90'])} | "
                f"{r.get('tokens_per_target_step') or '-'} | {r['match_vs_none']:.0%} | "
                f"{_f(ip.get('speedup_vs_none'))} | "
                f"{_f(ip.get('tokens_per_target_step'))} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

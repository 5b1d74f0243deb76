"""Load and faults against a live vLLM server (draftsmith serve, or any OpenAI-compatible one) on loopback.

    python bench/serve_load.py --server http://127.0.0.1:8000 --prompts outputs/quickstart/heldout_prompts.jsonl \
        --requests 200 --concurrency 16 --cancel 10 --malformed 10 --max-tokens 32 --out bench/results/DAY/serve_load

`--requests` requests in all, `--concurrency` in flight: `--cancel` of them are streamed and dropped after their
first chunk (the client goes away mid-answer), `--malformed` are bad on purpose (cycling through: a body that is
not JSON, an unknown model, a negative max_tokens, a prompt longer than the model's context), the rest are ordinary
streamed chat completions. Afterwards /health and one more ordinary request must still succeed. Prints and writes
load.json: per kind the HTTP statuses seen, the ordinary requests' output tok/s and latency, the server's spec-decode
and hybrid counters over the run, and whether it kept serving. Exit status 1 if a malformed request got anything but
a 4xx, an ordinary one failed, or the server stopped serving.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MALFORMED = ("not_json", "unknown_model", "negative_max_tokens", "over_long_prompt")


def plan(requests: int, cancel: int, malformed: int) -> list[str]:
    """The kind of each request, spread evenly through the run: ok | cancel | one of MALFORMED."""
    kinds = ["ok"] * requests
    special = ["cancel"] * cancel + [MALFORMED[i % len(MALFORMED)] for i in range(malformed)]
    step = max(1, requests // max(1, len(special)))
    for i, kind in enumerate(special):
        kinds[min(requests - 1, i * step + step // 2)] = kind
    return kinds


def one(client, url: str, model: str, kind: str, messages: list[dict], max_tokens: int) -> dict:
    t0 = time.perf_counter()
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "stream": True}
    if kind == "not_json":
        r = client.post(f"{url}/v1/chat/completions", content=b'{"model": "x", "messages": [', headers={
            "content-type": "application/json"})  # fmt: skip
        return {"kind": kind, "status": r.status_code, "s": time.perf_counter() - t0}
    if kind == "unknown_model":
        body["model"] = "no-such-model"
    elif kind == "negative_max_tokens":
        body["max_tokens"] = -5
    elif kind == "over_long_prompt":
        body["messages"] = [{"role": "user", "content": "word " * 200_000}]
    tokens = 0
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        status = r.status_code
        if status != 200:
            r.read()
            return {"kind": kind, "status": status, "s": time.perf_counter() - t0}
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    tokens += 1
            if kind == "cancel" and tokens:
                break  # leaving the `with` closes the connection mid-stream
    return {"kind": kind, "status": status, "chunks": tokens, "s": time.perf_counter() - t0}


def run(url: str, prompts: list[dict], requests: int, concurrency: int, cancel: int, malformed: int, max_tokens: int):
    import httpx

    from draftsmith.eval.live import scrape, server_model
    from draftsmith.serve.metrics import delta

    kinds = plan(requests, cancel, malformed)
    with httpx.Client(timeout=httpx.Timeout(600.0, connect=10.0)) as client:
        model = server_model(client, url)
        before = scrape(client, url)

        def job(i: int) -> dict:
            try:
                return one(client, url, model, kinds[i], prompts[i % len(prompts)]["messages"], max_tokens)
            except Exception as e:  # noqa: BLE001 - a transport failure is a finding, reported per request
                return {"kind": kinds[i], "status": None, "error": f"{type(e).__name__}: {e}"}

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            results = list(pool.map(job, range(requests)))
        wall = time.perf_counter() - t0
        health = client.get(f"{url}/health").status_code
        after = one(client, url, model, "ok", prompts[0]["messages"], max_tokens)
        counters = delta(scrape(client, url), before)
    statuses: dict = collections.defaultdict(collections.Counter)
    for r in results:
        statuses[r["kind"]][str(r["status"])] += 1
    ok = [r for r in results if r["kind"] == "ok"]
    latencies = sorted(r["s"] for r in ok if r["status"] == 200)
    bad = [r for r in results if r["kind"] in MALFORMED and not (r["status"] and 400 <= r["status"] < 500)]
    failed = [r for r in results if r["kind"] in ("ok", "cancel") and r["status"] != 200]
    summary = {
        "server": url,
        "model": model,
        "requests": requests,
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "wall_s": round(wall, 2),
        "statuses": {k: dict(v) for k, v in statuses.items()},
        "ok_latency_s": {"p50": latencies[len(latencies) // 2] if latencies else None, "max": max(latencies or [0])},
        "ok_output_tok_s": round(counters["generation_tokens"] / wall, 2),
        "counters": counters,
        "malformed_not_4xx": bad,
        "ordinary_failed": failed[:10],
        "health_after": health,
        "request_after": after["status"],
    }
    summary["kept_serving"] = health == 200 and after["status"] == 200
    summary["passed"] = summary["kept_serving"] and not bad and not failed
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--cancel", type=int, default=10)
    p.add_argument("--malformed", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--out", default=None, help="directory for load.json")
    args = p.parse_args(argv)
    from draftsmith.eval.prompts import load_prompts

    prompts = load_prompts(args.prompts, 64)
    summary = run(
        args.server.rstrip("/"), prompts, args.requests, args.concurrency, args.cancel, args.malformed,
        args.max_tokens,
    )  # fmt: skip
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "load.json").write_text(text + "\n")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

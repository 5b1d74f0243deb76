"""`draftsmith eval live`: measure a running OpenAI-compatible vLLM server as its clients see it.

    draftsmith serve exported/eagle3_smollm2 --port 8000 &            # or any vLLM server, yours or ours
    draftsmith eval live --server http://127.0.0.1:8000 --prompts chat.jsonl --concurrency 1,8 \
        --baseline http://127.0.0.1:8001 --out runs/live

Each prompt goes as a streamed /v1/chat/completions request (greedy unless --temperature), `--concurrency` at a
time, once per concurrency level. From the client: time to first token, inter-token latency (the gaps between
streamed chunks; a speculative step streams several tokens at once), time per output token, output tok/s over the
level's wall time, percentiles. From the server's Prometheus /metrics (counter deltas around each level): drafts,
accepted tokens, per-position acceptance, tokens per target step, and the hybrid drafter's per-source counts when it
serves one. `--baseline URL` (a server without speculation, same target) answers the same prompts: each output is
compared with it (greedy speculation must not change a token). Writes live.json and live.md to --out.

The levels run one after another on the same server: suffix decoding (alone or as the hybrid's member) and vLLM's
prefix cache remember what an earlier level served, so a later level of the same prompts drafts from those answers.
To compare levels, measure each on a freshly started server (bench/serve_http.py does).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from draftsmith.argtypes import positive_int
from draftsmith.atomic import atomic_write, atomic_write_json
from draftsmith.errors import ConfigError, DraftsmithError
from draftsmith.eval.acceptance_rows import tokens_per_step
from draftsmith.eval.prompts import load_prompts


class LiveError(DraftsmithError):
    """The server cannot be measured (unreachable, no model, a request refused)."""


def _client(timeout: float):
    import httpx

    return httpx.Client(timeout=httpx.Timeout(timeout, connect=10.0))


def server_model(client, url: str) -> str:
    """The model the server serves (the first of /v1/models)."""
    try:
        r = client.get(f"{url}/v1/models")
        r.raise_for_status()
        return r.json()["data"][0]["id"]
    except Exception as e:  # noqa: BLE001 - any failure here means the same to the user
        raise LiveError(f"{url}: no OpenAI-compatible server answers /v1/models ({type(e).__name__}: {e})") from None


def scrape(client, url: str) -> dict:
    from draftsmith.serve.metrics import parse

    r = client.get(f"{url}/metrics")
    if r.status_code != 200:
        raise LiveError(f"{url}/metrics answered HTTP {r.status_code}; acceptance is read from it")
    return parse(r.text)


def stream_one(client, url: str, model: str, messages: list[dict], max_tokens: int, temperature: float, seed) -> dict:
    """One streamed chat completion: its text, completion tokens and the client's timings."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        **({"seed": seed} if seed is not None else {}),
    }
    t0 = time.perf_counter()
    chunks, text, tokens = [], [], None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            r.read()
            raise LiveError(f"{url}: HTTP {r.status_code} for a chat request: {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"].get("completion_tokens")
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    chunks.append(time.perf_counter() - t0)
                    text.append(piece)
    end = time.perf_counter() - t0
    n = tokens if tokens is not None else len(chunks)
    return {
        "text": "".join(text),
        "tokens": n,
        "ttft_s": chunks[0] if chunks else end,
        "itl_s": [b - a for a, b in zip(chunks, chunks[1:])],
        "tpot_s": (chunks[-1] - chunks[0]) / (n - 1) if chunks and n > 1 else None,
        "latency_s": end,
    }


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def run_level(client, url, model, prompts, concurrency, max_tokens, temperature, seed) -> tuple[list[dict], float]:
    """Every prompt, `concurrency` requests in flight; (per-prompt results in prompt order, wall seconds)."""
    results: list = [None] * len(prompts)
    errors: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            results[i] = stream_one(client, url, model, prompts[i]["messages"], max_tokens, temperature, seed)
        except Exception as e:  # noqa: BLE001 - reported below, with the prompt
            with lock:
                errors.append(f"prompt {prompts[i]['id']}: {e}")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, range(len(prompts))))
    wall = time.perf_counter() - t0
    if errors:
        raise LiveError(f"{url}: {len(errors)} of {len(prompts)} requests failed; first: {errors[0]}")
    return results, wall


def summarize(results: list[dict], wall: float, counters: dict) -> dict:
    spec = counters["spec"]
    drafts, accepted = spec.get("num_drafts", 0), spec.get("num_accepted_tokens", 0)
    per_pos = spec.get("num_accepted_tokens_per_pos") or []
    itl = [g for r in results for g in r["itl_s"]]
    tokens = sum(r["tokens"] for r in results)
    row = {
        "requests": len(results),
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "output_tok_s": round(tokens / wall, 2) if wall else None,
        "ttft_s": {f"p{q}": pct([r["ttft_s"] for r in results], q) for q in (50, 90, 99)},
        "itl_s": {f"p{q}": pct(itl, q) for q in (50, 90, 99)},
        "tpot_s_mean": statistics.fmean([r["tpot_s"] for r in results if r["tpot_s"] is not None] or [0.0]),
        "counters": spec,
        "drafts": drafts,
        # as eval acceptance counts it: generated tokens over the target's steps (1.00 without speculation)
        "tokens_per_target_step": _round(tokens_per_step(counters["generation_tokens"], accepted)),
        "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,  # over drafting steps
        "per_position_acceptance": [round(a / drafts, 4) for a in per_pos] if drafts else [],
    }
    if counters["hybrid"]:
        row["hybrid_sources"] = counters["hybrid"]
        row["hybrid_head_skipped"] = counters["hybrid_head_skipped"]
    return row


def measure(
    url: str,
    prompts_path: str,
    concurrency: list[int],
    max_tokens: int = 128,
    temperature: float = 0.0,
    seed: int | None = None,
    num_prompts: int | None = None,
    baseline: str | None = None,
    timeout: float = 600.0,
    log=print,
) -> dict:
    """The measurement (see the module docstring) as a dict: per concurrency level a row, plus the baseline's."""
    url, baseline = url.rstrip("/"), baseline.rstrip("/") if baseline else None
    prompts = load_prompts(prompts_path, num_prompts)
    out: dict = {"server": url, "prompts": prompts_path, "num_prompts": len(prompts), "max_tokens": max_tokens}
    out.update(temperature=temperature, seed=seed, levels={})
    with _client(timeout) as client:
        model = out["model"] = server_model(client, url)
        ref_texts = None
        if baseline:
            base_model = server_model(client, baseline)
            if base_model != model:
                raise LiveError(f"--baseline {baseline} serves {base_model}, not {model}: outputs would differ anyway")
            log(f"live: baseline {baseline}, {len(prompts)} prompts at concurrency {max(concurrency)}")
            results, wall = run_level(client, baseline, model, prompts, max(concurrency), max_tokens, temperature, seed)
            ref_texts = [r["text"] for r in results]
            out["baseline"] = {"server": baseline, **summarize(results, wall, _empty())}
        for c in concurrency:
            before = scrape(client, url)
            results, wall = run_level(client, url, model, prompts, c, max_tokens, temperature, seed)
            from draftsmith.serve.metrics import delta

            row = summarize(results, wall, delta(scrape(client, url), before))
            row["output_sha1"] = [hashlib.sha1(r["text"].encode()).hexdigest()[:12] for r in results]  # comparable
            if ref_texts is not None:
                same = [r["text"] == t for r, t in zip(results, ref_texts)]
                row["match_vs_baseline"] = round(sum(same) / len(same), 4)
                row["mismatched_prompts"] = [p["id"] for p, s in zip(prompts, same) if not s][:20]
            out["levels"][str(c)] = row
            log(
                f"live: concurrency {c}: {row['output_tok_s']} tok/s, TTFT p50 {_ms(row['ttft_s']['p50'])}, "
                f"ITL p50 {_ms(row['itl_s']['p50'])}, tokens per target step {row['tokens_per_target_step']}"
                + (f", outputs equal to the baseline {row['match_vs_baseline']:.0%}" if ref_texts is not None else "")
            )
    return out


def _empty() -> dict:
    return {"spec": {}, "hybrid": {}, "hybrid_head_skipped": None, "generation_tokens": 0}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1000:.0f} ms"


def report(result: dict) -> str:
    lines = [
        f"# Live server: {result['server']} ({result['model']})",
        "",
        f"{result['num_prompts']} prompts from {result['prompts']}, max_tokens {result['max_tokens']}, "
        f"temperature {result['temperature']}",
        "",
        "| concurrency | output tok/s | TTFT p50 / p99 | ITL p50 / p99 | tokens / target step | vs baseline |",
        "|---|---|---|---|---|---|",
    ]
    rows = list(result["levels"].items())
    if "baseline" in result:
        rows.insert(0, ("baseline (no speculation)", result["baseline"]))
    for name, r in rows:
        match = r.get("match_vs_baseline")
        lines.append(
            f"| {name} | {r['output_tok_s']} | {_ms(r['ttft_s']['p50'])} / {_ms(r['ttft_s']['p99'])} | "
            f"{_ms(r['itl_s']['p50'])} / {_ms(r['itl_s']['p99'])} | {r.get('tokens_per_target_step') or '-'} | "
            f"{'-' if match is None else f'{match:.0%} equal'} |"
        )
    for name, r in result["levels"].items():
        if r.get("hybrid_sources"):
            src = ", ".join(
                f"{s} {v['steps']} steps / {v['accepted_tokens']} accepted" for s, v in r["hybrid_sources"].items()
            )
            lines += ["", f"hybrid sources at concurrency {name}: {src}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="draftsmith eval live", description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--prompts", required=True, help="prompt JSONL (as eval acceptance reads)")
    p.add_argument("--num-prompts", type=positive_int, default=None, help="the first N prompts (default: all)")
    p.add_argument("--concurrency", default="1", help="requests in flight, one level per value: 1,8 (default 1)")
    p.add_argument("--max-tokens", type=positive_int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="per-request sampling seed (T > 0)")
    p.add_argument("--baseline", default=None, help="a server without speculation to compare outputs with")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--out", required=True, help="directory for live.json and live.md")
    args = p.parse_args(argv)
    try:
        levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise ConfigError(f"--concurrency {args.concurrency!r}: comma-separated whole numbers >= 1, e.g. 1,8")
    if not args.temperature >= 0:
        raise ConfigError(f"--temperature {args.temperature}: >= 0 (0 = greedy)")
    result = measure(
        args.server, args.prompts, levels, args.max_tokens, args.temperature, args.seed, args.num_prompts,
        args.baseline, args.timeout,
    )  # fmt: skip
    out = Path(args.out)
    atomic_write_json(out / "live.json", result)
    atomic_write(out / "live.md", report(result).encode())
    print(report(result))
    print(f"wrote {out / 'live.json'} and {out / 'live.md'}")
    return 0

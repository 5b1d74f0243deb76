"""One method in one process: build a vLLM engine, generate every prompt, write counters + outputs as JSON.

    python -m draftsmith.serve.runner JOB.json RESULT.json

The parent (`draftsmith.eval.acceptance`) writes JOB.json and starts one of these per method, so an
engine never leaks memory into the next and one crash is reported instead of ending the run. Lines
on stdout that start with `@draftsmith-eval ` are JSON progress events for the parent; everything
else (vLLM's own logs) goes to the method's log file.

JOB.json: {"name", "target", "speculative_config" (null = no speculation), "prompt_token_ids",
"sampling": {"temperature", "max_tokens", "seed"}, "engine": {LLM(...) keyword arguments},
"batch_size", "warmup_tokens", "stream_outputs" (emit each batch's token ids as an `outputs` event), "heartbeat_s"
(emit the tokens generated so far that often: long generation jobs)}.

A batch-size sweep starts one of these per batch size: an engine that has served the prompts once would serve them
again from its prefix cache, and suffix decoding would draft from the answers it saw (2.1x no speculation at batch
4 in one engine, measured, against its own 1.56x at batch 1).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

from draftsmith.atomic import atomic_write
from draftsmith.serve import step_timer

EVENT = "@draftsmith-eval "
HYBRID_KEY = "draftsmith_hybrid"  # serve/hybrid.py KEY: additional_config names a hybrid under it
HYBRID_KEYS = ("hybrid_sources", "hybrid_seconds", "hybrid_head_skipped")  # a hybrid's stats in a result
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "num_accepted_tokens_per_pos",
}


_EMIT = threading.Lock()


def emit(event: str, **fields) -> None:
    """One event line, written in one call: print() writes the text and its newline apart, and vLLM's logger (its
    stats line every few seconds, same stdout) once landed in between, so the parent read the event with a log line
    glued to it (the heartbeat thread and the main thread emit too, hence the lock)."""
    line = EVENT + json.dumps({"event": event, **fields}) + "\n"
    with _EMIT:
        sys.stdout.write(line)
        sys.stdout.flush()


def parse_event(line: str) -> dict | None:
    """The event in a line of a runner's output, or None (a log line). Found wherever it starts in the line and read
    to its closing brace: another writer's text (a print() of the engine's, written in two parts) can still land
    before it or after it on the same line."""
    at = line.find(EVENT)
    if at < 0:
        return None
    try:
        event, _ = json.JSONDecoder().raw_decode(line, at + len(EVENT))
    except ValueError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


def read_spec_counters(llm) -> dict:
    """The spec-decode counters, summed over label sets (engines); {} when the engine has none."""
    counters: dict = {}
    for m in llm.get_metrics():
        key = SPEC_COUNTERS.get(m.name)
        if key is not None:  # num_accepted_tokens_per_pos is a Vector metric: one integer counter per draft position
            value = [int(v) for v in m.values] if key == "num_accepted_tokens_per_pos" else int(m.value)
            counters = counter_sum(counters, {key: value})
    return counters


def counter_sum(a: dict, b: dict) -> dict:
    """a + b key by key; a per-position vector adds element by element (the shorter one padded with zeros)."""
    out = dict(a)
    for key, value in b.items():
        prev = out.get(key)
        if isinstance(value, list):
            prev = prev or []
            width = max(len(prev), len(value))
            out[key] = [(prev[i] if i < len(prev) else 0) + (value[i] if i < len(value) else 0) for i in range(width)]
        else:
            out[key] = (prev or 0) + value
    return out


def counter_delta(after: dict, before: dict) -> dict:
    """after - before, so only the timed generation counts (whatever the engine did at start-up)."""
    delta = {}
    for key, value in after.items():
        prev = before.get(key)
        if isinstance(value, list):
            prev = prev or [0] * len(value)
            delta[key] = [a - b for a, b in zip(value, prev)]
        else:
            delta[key] = value - (prev or 0)
    return delta


def _hybrid_active(worker) -> bool:
    """Whether this worker's model runner built the hybrid drafter at load (serve/hybrid.py)."""
    return getattr(worker.model_runner, "_draftsmith_hybrid_state", None) is not None


def versions() -> dict:
    import torch
    import transformers
    import vllm

    out = {"vllm": vllm.__version__, "torch": torch.__version__, "transformers": transformers.__version__}
    try:  # present only where `suffix` can run
        out["arctic_inference"] = metadata.version("arctic_inference")
    except metadata.PackageNotFoundError:
        out["arctic_inference"] = None
    return out


def run(job: dict) -> dict:
    t0 = time.perf_counter()
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    import_s = time.perf_counter() - t0
    emit("imported", seconds=round(import_s, 2))

    t0 = time.perf_counter()
    llm = LLM(
        model=job["target"], speculative_config=job["speculative_config"], disable_log_stats=False, **job["engine"]
    )
    engine_start_s = time.perf_counter() - t0
    emit("engine_ready", seconds=round(engine_start_s, 2))
    from draftsmith.serve import fixes

    fixes.apply()  # the plugin applied them at start-up (on a CPU build); again here for a vLLM without our plugin
    patches = fixes.active()
    extra = job["engine"].get("additional_config") or {}
    if extra.get(HYBRID_KEY) and not all(llm.collective_rpc(_hybrid_active)):
        raise RuntimeError(
            "the hybrid drafter's wrap is not active in this engine (draftsmith's vLLM plugin did not load: is "
            "VLLM_PLUGINS set without draftsmith_mlp_speculator?); it would serve plain speculative decoding"
        )
    try:  # every method's step, the drafter's calls among them (serve/step_timer.py)
        llm.collective_rpc(step_timer.install)
    except Exception as e:  # noqa: BLE001 - the timer is a figure, not a reason to fail the method
        print(f"step timer not installed: {e}", flush=True)

    s = job["sampling"]
    params = SamplingParams(temperature=s["temperature"], max_tokens=s["max_tokens"], seed=s["seed"])
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompt_token_ids"]]
    batch = max(1, int(job.get("batch_size", 1)))

    if job.get("warmup_tokens"):
        # One short untimed request first: the first generate() pays one-off set-up (~1 s on CPU) that
        # would otherwise be billed to the first prompt. Its drafts fall outside the counter difference.
        warm = TokensPrompt(prompt_token_ids=job["prompt_token_ids"][0][: job["warmup_tokens"]])
        llm.generate([warm], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)

    hybrid_before = _read_json(job.get("hybrid_stats"))
    generated = generate_all(
        llm, prompts, params, batch, stream=job.get("stream_outputs", False), heartbeat_s=job.get("heartbeat_s")
    )
    hybrid_after = _read_json(job.get("hybrid_stats"))

    return {
        "name": job["name"],
        "versions": versions(),
        "import_s": import_s,
        "engine_start_s": engine_start_s,
        **generated,
        **_hybrid_delta(hybrid_before, hybrid_after),
        "prompt_tokens": sum(map(len, job["prompt_token_ids"])),
        "torch_threads": torch.get_num_threads(),
        "vllm_patches": patches,
        "env": {
            k: os.environ.get(k)
            for k in (
                "VLLM_ENABLE_V1_MULTIPROCESSING",
                "VLLM_CPU_KVCACHE_SPACE",
                "OMP_NUM_THREADS",
                "NUMBA_NUM_THREADS",
                "LD_PRELOAD",
            )
        },
    }


def generated_tokens(llm) -> int:
    """Output tokens the engine has generated so far (its `vllm:generation_tokens` counter; 0 without one)."""
    return int(sum(m.value for m in llm.get_metrics() if m.name == "vllm:generation_tokens"))


def heartbeat(llm, every_s: float) -> threading.Event:
    """Emit a `heartbeat` event (tokens generated so far) every `every_s` seconds until the returned event is set:
    a batch of long answers runs for minutes without a finished request, and the parent's bar must still move."""
    stop = threading.Event()

    def beat():
        while not stop.wait(every_s):
            try:
                emit("heartbeat", tokens=generated_tokens(llm))
            except Exception:  # noqa: BLE001 - a figure for a progress bar, never a reason to fail the run
                emit("heartbeat", tokens=None)

    threading.Thread(target=beat, daemon=True).start()
    return stop


def generate_all(llm, prompts, params, batch: int, stream: bool = False, heartbeat_s: float | None = None) -> dict:
    """Every prompt, `batch` concurrent requests per generate() call: the timed generation, its counters (after -
    before, so nothing the engine did earlier counts) and outputs. `heartbeat_s`: emit the tokens generated so far
    that often (long generation jobs; never for timed evaluation, whose engine should run alone)."""
    stop = heartbeat(llm, heartbeat_s) if heartbeat_s else None
    try:
        return _generate_all(llm, prompts, params, batch, stream)
    finally:
        if stop is not None:
            stop.set()


def _generate_all(llm, prompts, params, batch: int, stream: bool) -> dict:
    before = read_spec_counters(llm)
    timed_before = step_timer.read(llm)
    outputs: list[list[int]] = []
    finish: list[str | None] = []
    generation_s = 0.0
    for start in range(0, len(prompts), batch):
        t0 = time.perf_counter()
        results = llm.generate(prompts[start : start + batch], params, use_tqdm=False)
        generation_s += time.perf_counter() - t0
        for r in results:
            outputs.append(list(r.outputs[0].token_ids))
            finish.append(r.outputs[0].finish_reason)
        if stream:  # the parent saves each batch as it lands (resumable regeneration)
            emit("outputs", start=start, token_ids=outputs[start:], finish_reasons=finish[start:])
        emit(
            "progress",
            done=len(outputs),
            total=len(prompts),
            tokens=sum(map(len, outputs)),
            seconds=round(generation_s, 2),
            batch_size=batch,
        )
    calls = step_timer.delta(step_timer.read(llm), timed_before)
    draft = calls.get("propose_draft_token_ids", [0.0, 0])
    return {
        "batch_size": batch,
        "generation_s": generation_s,
        # the engine's drafting calls (one per step that drafts, for the whole batch) and their wall time
        "draft_s": draft[0],
        "draft_calls": draft[1],
        "step_breakdown": step_timer.breakdown(calls, generation_s),
        "counters_at_start": before,
        "counters": counter_delta(read_spec_counters(llm), before),
        "generated_tokens": sum(map(len, outputs)),
        "output_token_ids": outputs,
        "finish_reasons": finish,
    }


def _hybrid_delta(before: dict | None, after: dict | None) -> dict:
    """A hybrid drafter's stats over the timed generation (its stats file after - before, like the counters):
    per-source counts, the wall time of its drafting parts (head chain, suffix, prompt lookup, the choice) and the
    steps whose head chain was skipped (no head draft could have been chosen). None each without a hybrid."""
    if not after:
        return dict.fromkeys(HYBRID_KEYS)
    before = before or {}
    base = before.get("sources", {})
    return {
        "hybrid_sources": {
            role: {key: v - base.get(role, {}).get(key, 0) for key, v in c.items()}
            for role, c in after["sources"].items()
        },
        "hybrid_seconds": {
            part: round(v - before.get("seconds", {}).get(part, 0.0), 3) for part, v in after["seconds"].items()
        },
        "hybrid_head_skipped": after["head_skipped"] - before.get("head_skipped", 0),
    }


def _read_json(path: str | None) -> dict | None:
    try:
        return json.loads(Path(path).read_text()) if path else None
    except FileNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m draftsmith.serve.runner JOB.json RESULT.json", file=sys.stderr)
        return 2
    job_path, result_path = argv
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    result = run(job)
    atomic_write(result_path, json.dumps(result).encode())  # the parent never reads a half-written result
    emit("done", generated_tokens=result["generated_tokens"], seconds=round(result["generation_s"], 2))
    return 0


if __name__ == "__main__":  # required: vLLM may spawn processes that re-import this module
    sys.exit(main())

"""Continuations from the frozen target: vLLM in a child process when installed, else the HF target.

    from draftsmith.generate import generate, cached_generate
    outs = generate("smollm2", [[1, 2, 3], [4, 5]], max_tokens=256, temperature=0.0, seed=0)
    outs = cached_generate(target, prompts, 256, 0.0, 0, cache_dir=cache_dir() / "generated")

`generate` returns one list of new token ids per prompt (ending with the eos token when the target
stopped). vLLM runs in its own process (`draftsmith.serve.runner`, no speculation), so an engine
never shares memory or OpenMP threads with a training process. `cached_generate` stores the result
under a key of (target weights, prompts, settings) and writes it atomically: a resumed run reads it back.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

from draftsmith.atomic import atomic_write_json

BACKENDS = ("auto", "vllm", "hf")


HEARTBEAT_S = 5.0  # seconds between the vLLM child's progress events (tokens generated so far)


def resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: expected one of {BACKENDS}")
    if backend == "auto":
        return "vllm" if find_spec("vllm") is not None else "hf"
    return backend


def _check(prompt_token_ids, max_tokens: int) -> list[list[int]]:
    prompts = [list(map(int, p)) for p in prompt_token_ids]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("generate: every prompt needs at least one token")
    if max_tokens < 1:
        raise ValueError(f"generate: max_tokens must be >= 1, got {max_tokens}")
    return prompts


def default_threads() -> int:
    """OpenMP threads for a batched generation engine: every core this process may use. Batched decoding scales
    with threads (measured: 1.71x on 2 cores, bench/regenerate.py); only batch-1 speculative decoding, whose engine
    loop the second thread fights, wants one (draftsmith eval sets its own)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def iter_vllm(
    target_path: str,
    prompts: list[list[int]],
    max_tokens: int,
    temperature: float,
    seed: int,
    batch_size: int = 64,
    threads: int | None = None,
    kv_cache_gib: int = 2,
    log_path: str | None = None,
    on_tokens=None,
):
    """Batched generation in a vLLM child process (no speculation).

    Yields (start, token_ids, finish_reasons) as each batch of `batch_size` prompts finishes, so a caller
    can save work as it lands (draftsmith regenerate resumes from there). `threads`: OpenMP threads of the
    engine (None: `default_threads()`, every core). `on_tokens(n)`: called every few seconds with the tokens the
    engine has generated so far (a batch of long answers finishes no request for minutes).
    """
    threads = threads or default_threads()
    from transformers import AutoConfig

    from draftsmith.serve.runner import parse_event

    longest = max(map(len, prompts)) + max_tokens + 1
    limit = getattr(AutoConfig.from_pretrained(target_path), "max_position_embeddings", None) or longest
    job = {
        "name": "generate",
        "target": target_path,
        "speculative_config": None,
        "prompt_token_ids": prompts,
        "sampling": {"temperature": temperature, "max_tokens": max_tokens, "seed": seed},
        "engine": {"dtype": "float32", "enforce_eager": True, "max_model_len": min(longest, limit), "seed": seed},
        "batch_size": batch_size,
        "warmup_tokens": 0,
        "stream_outputs": True,
        "heartbeat_s": HEARTBEAT_S if on_tokens else None,
    }
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "OMP_NUM_THREADS": str(threads),
        "NUMBA_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
    }
    with tempfile.TemporaryDirectory(prefix="draftsmith-generate-") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(job))
        log = Path(log_path) if log_path else Path(tmp) / "log"
        cmd = [sys.executable, "-m", "draftsmith.serve.runner", str(job_path), str(result_path)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1)
        try:
            with open(log, "w", encoding="utf-8") as f:
                for line in proc.stdout:
                    f.write(line)
                    ev = parse_event(line)
                    if ev is not None:
                        if ev["event"] == "outputs":
                            yield ev["start"], ev["token_ids"], ev["finish_reasons"]
                        elif ev["event"] == "heartbeat" and on_tokens and ev.get("tokens") is not None:
                            on_tokens(ev["tokens"])
        except BaseException:  # the consumer stopped early, or a kill/interrupt: the engine must not outlive us
            proc.kill()
            proc.wait()
            raise
        if proc.wait() != 0 or not result_path.is_file():
            tail = log.read_text(errors="replace").splitlines()[-15:]
            raise RuntimeError(f"vLLM generation failed (exit {proc.returncode}):\n" + "\n".join(tail))


def iter_hf(
    target_path: str, prompts: list[list[int]], max_tokens: int, temperature: float, seed: int, batch_size: int = 16
):
    """The same with the HF target: left-padded batches, cut after the first eos."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval()
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    gen = torch.Generator().manual_seed(seed)
    sample = temperature > 0
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(c)) + c for c in chunk])  # [B, W]
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in chunk])  # [B, W]
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))  # per-batch seed: deterministic
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_tokens,
                do_sample=sample,
                temperature=temperature if sample else None,
                top_p=None,
                top_k=None,
                pad_token_id=pad,
            )
        outs, finish = [], []
        for row in out[:, width:].tolist():
            cut = next((i for i, t in enumerate(row) if t in eos), None)
            outs.append(row if cut is None else row[: cut + 1])
            finish.append("length" if cut is None else "stop")
        yield start, outs, finish


def iter_generate(
    target_path: str,
    prompt_token_ids: list[list[int]],
    max_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    backend: str = "auto",
    **kw,
):
    """`generate`, batch by batch: yields (start, token_ids, finish_reasons) as each batch finishes."""
    from draftsmith.assets import resolve_target

    prompts = _check(prompt_token_ids, max_tokens)
    if not prompts:
        return
    path = resolve_target(str(target_path))
    if resolve_backend(backend) == "vllm":
        yield from iter_vllm(path, prompts, max_tokens, temperature, seed, **kw)
    else:
        yield from iter_hf(path, prompts, max_tokens, temperature, seed, **kw)


def generate(
    target_path: str,
    prompt_token_ids: list[list[int]],
    max_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    backend: str = "auto",
    **kw,
) -> list[list[int]]:
    """New token ids per prompt from the frozen target (greedy at temperature 0).

    Args:
        target_path: HF dir or hub id, or `smollm2` (the embedded default).
        backend: auto (vLLM when installed, else HF) | vllm | hf. Extra keywords go to the backend
            (vllm: batch_size, threads, kv_cache_gib, log_path; hf: batch_size).
    """
    return [
        ids
        for _, outs, _ in iter_generate(target_path, prompt_token_ids, max_tokens, temperature, seed, backend, **kw)
        for ids in outs
    ]


def target_fingerprint(target_path: str) -> dict:
    """What identifies a target's weights offline: its config and the size/mtime of its weight files."""
    p = Path(target_path)
    if not p.is_dir():
        return {"name": str(target_path)}
    files = sorted(f for f in p.iterdir() if f.suffix in (".safetensors", ".bin", ".json"))
    return {"path": str(p.resolve()), "files": [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]}


def cache_key(
    target_path: str, prompts: list[list[int]], max_tokens: int, temperature: float, seed: int, backend: str
) -> str:
    h = hashlib.sha1()
    h.update(
        json.dumps(
            {
                "target": target_fingerprint(target_path),
                "max_tokens": max_tokens,
                "temperature": temperature,
                "seed": seed,
                "backend": backend,
            },
            sort_keys=True,
        ).encode()
    )
    for p in prompts:
        h.update(json.dumps(p).encode())
    return h.hexdigest()


def cached_generate(
    target_path: str,
    prompt_token_ids: list[list[int]],
    max_tokens: int,
    temperature: float,
    seed: int,
    cache_dir: str | os.PathLike,
    backend: str = "auto",
    log=print,
    **kw,
) -> list[list[int]]:
    """`generate`, memoised on disk as cache_dir/<key>.json (atomic write; the key covers every input)."""
    from draftsmith.assets import resolve_target

    prompts = _check(prompt_token_ids, max_tokens)
    path = resolve_target(str(target_path))
    backend = resolve_backend(backend)  # vLLM and HF greedy outputs can differ in rare ties: part of the key
    key = cache_key(path, prompts, max_tokens, temperature, seed, backend)
    file = Path(cache_dir) / f"{key}.json"
    if file.is_file():
        try:
            blob = json.loads(file.read_text())
            if blob.get("key") == key and len(blob["outputs"]) == len(prompts):
                log(f"generate: {len(prompts)} continuations read from cache {file}")
                return blob["outputs"]
        except (json.JSONDecodeError, KeyError):
            pass  # a damaged cache is regenerated, never trusted
    import time

    from tqdm import tqdm

    t0 = time.perf_counter()
    # tokens against the most there can be (every answer max_tokens long): the ETA is an upper bound
    bar = tqdm(total=len(prompts) * max_tokens, desc="generate", unit="tok", unit_scale=True, mininterval=5)

    def on_tokens(n: int) -> None:
        bar.update(max(0, n - bar.n))

    if backend == "vllm":
        kw = {**kw, "on_tokens": on_tokens}
    outs: list[list[int]] = []
    try:
        for _, batch, _ in iter_generate(path, prompts, max_tokens, temperature, seed, backend, **kw):
            outs += batch
            bar.set_postfix_str(f"{len(outs)}/{len(prompts)} prompts", refresh=False)
            on_tokens(max(bar.n, sum(map(len, outs))))
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    n = sum(map(len, outs))
    log(
        f"generate: {len(prompts)} prompts -> {n} tokens with {backend} in {seconds:.0f} s "
        f"({n / max(seconds, 1e-9):.0f} tok/s)"
    )
    record = {
        "key": key,
        "backend": backend,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "seconds": seconds,
        "outputs": outs,
    }
    atomic_write_json(file, record, indent=None)  # a kill mid-write leaves no half cache
    return outs

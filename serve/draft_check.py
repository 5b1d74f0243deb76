"""The draft head an engine is asked to serve, checked against the method it is asked to serve it with, before vLLM
builds its config: a DFlash head under another method (vLLM answers with its whole registry of ~400 architecture
names), or method dflash on a head that is not one, gets one paragraph instead.

    from draftsmith.serve.draft_check import method_problem
    method_problem({"method": "eagle3", "model": "exported/dflash"})   # -> "... is a DFlash head ..." or None

Installed by the plugin (serve/plugin.py) around `EngineArgs.create_speculative_config`, which every engine (our
runner, `draftsmith serve`, a plain `vllm serve` with draftsmith installed) goes through.
"""

from __future__ import annotations

import json
from pathlib import Path

DFLASH_ARCH = "DFlashDraftModel"


def is_dflash(config: dict) -> bool:
    """Whether a draft's config.json is a DFlash head's (vLLM's DFlashDraftModel, or a dflash_config)."""
    return DFLASH_ARCH in (config.get("architectures") or []) or bool(config.get("dflash_config"))


def _draft_config(model) -> dict | None:
    path = Path(str(model)) / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # a hub id, or no draft directory: vLLM's own checks speak
    return data if isinstance(data, dict) else None


def method_problem(spec: dict | None) -> str | None:
    """Why `spec` (a speculative_config dict) cannot serve its draft directory, or None."""
    if not isinstance(spec, dict) or not spec.get("model"):
        return None
    config = _draft_config(spec["model"])
    if config is None:
        return None
    method = spec.get("method")
    dflash = is_dflash(config)
    if dflash and method not in (None, "dflash"):
        return (
            f"{spec['model']} is a DFlash head (architectures {DFLASH_ARCH}: it drafts its whole block in one "
            f"forward over the target's states), but speculative_config asks for method {method!r}: serve it with "
            '"method": "dflash" and num_speculative_tokens at most its block size - 1 (draftsmith serve HEAD picks '
            "both)"
        )
    if method == "dflash" and not dflash:
        return (
            f'speculative_config method "dflash" needs a DFlash head (architectures {DFLASH_ARCH} and a '
            f"dflash_config); {spec['model']} is {config.get('architectures') or 'no draft head'}: serve it with "
            "its own method (draftsmith serve HEAD picks it)"
        )
    return None


def install() -> None:
    """Check each engine's speculative_config before vLLM turns it into a SpeculativeConfig (idempotent)."""
    from draftsmith.serve.compat import internal

    EngineArgs = internal("vllm.engine.arg_utils", "EngineArgs")
    internal("vllm.engine.arg_utils", "EngineArgs", "create_speculative_config")
    original = EngineArgs.create_speculative_config
    if getattr(original, "_draftsmith_checked", False):
        return

    def create_speculative_config(self, *args, **kwargs):
        problem = method_problem(self.speculative_config)
        if problem:
            raise ValueError(problem)
        return original(self, *args, **kwargs)

    create_speculative_config._draftsmith_checked = True
    EngineArgs.create_speculative_config = create_speculative_config

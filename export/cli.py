"""`draftsmith export --format vllm CKPT OUT`: a training checkpoint -> a vLLM-loadable directory.

    draftsmith export --format vllm outputs/eagle3_smollm2 exported/eagle3_smollm2
    draftsmith export --format vllm CKPT OUT --dialect native --target meta-llama/Llama-3.1-8B-Instruct
    draftsmith export --format vllm outputs/mlp_smollm2_stage2 exported/mlp_smollm2   # an MLP speculator run

OUT is replaced as a whole, so it must be new, empty or a previous export (--force replaces any other
directory with everything in it); a file, or the checkpoint's own directory or one containing it, is refused.
"""

from __future__ import annotations

import argparse
import os
import sys

from draftsmith.argtypes import positive_int
from draftsmith.export.destination import check_export_destination
from draftsmith.export.vllm import ExportError
from draftsmith.lock import acquire_beside
from draftsmith.train.checkpoint import load_head, resolve_checkpoint, training_data
from draftsmith.train.heads import families


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="draftsmith export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("checkpoint", help="a checkpoint dir (checkpoints/step_N) or a run dir (uses its latest)")
    p.add_argument("out", help="output directory: new, empty or a previous export (replaced atomically)")
    p.add_argument("--format", default="vllm", choices=["vllm"], help="serving engine format")
    p.add_argument(
        "--dialect",
        default="speculators",
        choices=["speculators", "native"],
        help="speculators (vllm serve DIR works alone) or native LlamaForCausalLMEagle3",
    )
    p.add_argument(
        "--target",
        default=None,
        help="target to check the head against and record as verifier (default: the one trained on)",
    )
    p.add_argument("--k", type=positive_int, default=None, help="speculative tokens to record (default: the TTT depth)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an OUT that is a non-empty directory but not a previous export, deleting "
        "everything in it (never allowed for the checkpoint's own directory or one containing it)",
    )
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    return export(args)  # a project error reaches draftsmith/cli.py's handler: one paragraph, no traceback


def _target_config(verifier: str):
    """The target's HF config, or None when it cannot be read (a hub id offline: the check is skipped)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(verifier)
    except OSError as e:
        print(
            f"draftsmith export: warning: cannot read target config {verifier!r} ({e}); target check skipped",
            file=sys.stderr,
        )
        return None


def export(args) -> int:
    """Resolve the checkpoint, check OUT before anything is loaded or written, export, validate."""
    ckpt = resolve_checkpoint(args.checkpoint)
    sources = [args.checkpoint, ckpt]  # the run dir given and the checkpoint it resolves to: neither may be OUT
    check_export_destination(sources, args.out, force=args.force)
    meta, state = load_head(ckpt)
    family = families.get(meta.get("family", families.UNRECORDED), where=ckpt / "head.json")
    cfg = family.config(**meta["config"])
    verifier = args.target or cfg.target.get("name_or_path") or ""
    target_config = None
    if verifier:
        from draftsmith.assets import resolve_target

        verifier = resolve_target(verifier)
        if os.path.isdir(verifier):  # recorded for eval's check and `vllm serve DIR`: valid from any directory
            verifier = os.path.abspath(verifier)
        target_config = _target_config(verifier)
    options = {k: getattr(args, k) for k in family.export_options}  # EAGLE-3: --dialect, --k
    acquire_beside(args.out, f"exporting {ckpt} into {args.out}")  # one export into OUT at a time
    try:
        out = family.exporter(
            state,
            cfg,
            args.out,
            verifier=verifier,
            dtype=args.dtype,
            target_config=target_config,
            source=sources,
            force=args.force,
            trained_on=training_data(ckpt),
            **options,
        )
    except ExportError as e:
        raise ExportError(f"{ckpt}: {e}") from None
    kind = ", ".join([family.name] + [f"{k}={v}" for k, v in options.items() if v is not None])
    print(f"exported {ckpt} -> {out} ({kind}, contracts checked)")
    rows = getattr(cfg, "draft_vocab_size", None)
    if family.draft_vocab_optional and rows and rows < cfg.vocab_size:
        print(
            f"  its heads predict over a draft vocab of {rows} of the target's {cfg.vocab_size} tokens: the map is "
            "draft_vocab.safetensors beside the HF files; draftsmith's vLLM plugin applies it (a loader of the "
            "published HF MLPSpeculator format reads full-vocab heads only: train with head.draft_vocab_size=0 for one)"
        )
    return 0

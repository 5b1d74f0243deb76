"""`draftsmith export --format vllm CKPT OUT`: a training checkpoint -> a vLLM-loadable directory.

    draftsmith export --format vllm outputs/eagle3_smollm2 exported/eagle3_smollm2
    draftsmith export --format vllm CKPT OUT --dialect native --target meta-llama/Llama-3.1-8B-Instruct
    draftsmith export --format vllm outputs/mlp_smollm2_stage2 exported/mlp_smollm2   # an MLP speculator run
"""

from __future__ import annotations

import argparse
import sys

from draftsmith.export.mlp import export_mlp_speculator
from draftsmith.export.vllm import ExportError, export_eagle3
from draftsmith.train.checkpoint import load_head, resolve_checkpoint
from draftsmith.train.heads.eagle3 import Eagle3Config
from draftsmith.train.heads.mlp_speculator import MLPSpeculatorConfig


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="draftsmith export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a checkpoint dir (checkpoints/step_N) or a run dir (uses its latest)")
    p.add_argument("out", help="output directory (replaced atomically)")
    p.add_argument("--format", default="vllm", choices=["vllm"], help="serving engine format")
    p.add_argument("--dialect", default="speculators", choices=["speculators", "native"],
                   help="speculators (vllm serve DIR works alone) or native LlamaForCausalLMEagle3")
    p.add_argument("--target", default=None,
                   help="target to check the head against and record as verifier (default: the one trained on)")
    p.add_argument("--k", type=int, default=None, help="speculative tokens to record (default: the TTT depth)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = p.parse_args(argv)

    ckpt = resolve_checkpoint(args.checkpoint)
    meta, state = load_head(ckpt)
    family = meta.get("family")
    if family not in ("eagle3", "mlp_speculator"):
        print(f"draftsmith export: {ckpt} holds a {family!r} head; expected eagle3 | mlp_speculator", file=sys.stderr)
        return 2
    cfg = Eagle3Config(**meta["config"]) if family == "eagle3" else MLPSpeculatorConfig(**meta["config"])
    verifier = args.target or cfg.target.get("name_or_path") or ""
    target_config = None
    if verifier:
        from transformers import AutoConfig

        from draftsmith.assets import resolve_target

        verifier = resolve_target(verifier)
        try:
            target_config = AutoConfig.from_pretrained(verifier)
        except OSError as e:  # hub id without network: export still works, the check is skipped with a warning
            print(f"draftsmith export: warning: cannot read target config {verifier!r} ({e}); target check skipped",
                  file=sys.stderr)
    try:
        if family == "mlp_speculator":  # the HF MLPSpeculatorPreTrainedModel directory (one dialect)
            out = export_mlp_speculator(state, cfg, args.out, verifier=verifier, dtype=args.dtype,
                                        target_config=target_config)
        else:
            out = export_eagle3(state, cfg, args.out, verifier=verifier, dialect=args.dialect, k=args.k,
                                dtype=args.dtype, target_config=target_config)
    except ExportError as e:
        print(f"draftsmith export: {ckpt}: {e}", file=sys.stderr)
        return 1
    print(f"exported {ckpt} -> {out} ({args.dialect + ' dialect' if family == 'eagle3' else 'MLPSpeculatorPreTrainedModel'}, "
          "contracts checked)")
    return 0

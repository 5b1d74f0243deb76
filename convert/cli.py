r"""`draftsmith convert SRC OUT`: a draft head in any layout in use -> a draftsmith run, a vLLM export, or theirs.

    draftsmith convert EAGLE3-LLaMA3.1-Instruct-8B runs/eagle3_llama8b --target meta-llama/Llama-3.1-8B-Instruct
    draftsmith convert specforge_out/epoch_9 exported/mine --to vllm --from specforge --target Qwen/Qwen3-8B
    draftsmith convert outputs/eagle3_smollm2 /tmp/for_sglang --to specforge

SRC layouts (--from; detected when the files say which): draftsmith, speculators (eagle3 / peagle), eagle3 (the
EAGLE-3 release, SpecForge on default layers), specforge and vllm (a LlamaForCausalLMEagle3 config whose
eagle_config records aux ids, in SpecForge's or vLLM's numbering), mlp (IBM's MLPSpeculator). EAGLE-1/2 and HASS
heads are recognised and refused (no draftsmith family has their shape).

--to run (default) writes a run directory: continue training from it with head.init_from=OUT (the overrides that
give the run the head's shape are printed), export it, adapt it. --to vllm writes what `draftsmith export` writes;
--to specforge / eagle3 write those projects' layouts. Every mapping applied is printed and kept in
OUT/converted.json; what cannot be mapped is refused, naming the file and key. `draftsmith doctor` checks a head
against its target and measures it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from draftsmith.argtypes import positive_int
from draftsmith.convert.layouts import LAYOUTS, ConvertError, ForeignHead, read_any
from draftsmith.convert.write import TARGETS, write_eagle3, write_run, write_specforge, write_vllm


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="draftsmith convert", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("src", help="the head's directory (config.json + weights, or a draftsmith run / export)")
    p.add_argument("out", help="output directory: new or empty (written whole, atomically)")
    p.add_argument("--from", dest="layout", choices=LAYOUTS, default=None, help="SRC's layout (default: detected)")
    p.add_argument("--to", choices=TARGETS, default="run", help="what to write (default: run)")
    p.add_argument("--target", default=None, help="the target the head drafts for (default: the one SRC records)")
    p.add_argument("--dialect", choices=["speculators", "native"], default="speculators", help="--to vllm's dialect")
    p.add_argument("--k", type=positive_int, default=None, help="--to vllm: speculative tokens to record")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--force", action="store_true", help="replace a non-empty OUT that is not a previous export")
    return p


def recorded_target(src: Path) -> str | None:
    """The target SRC names: an export's or a speculators head's verifier (`serve.recipe.recorded_target`), or a
    draftsmith run's recorded target."""
    from draftsmith.serve.recipe import recorded_target as exported_target

    found = exported_target(src)
    if found or (src / "config.json").is_file():
        return found
    try:
        from draftsmith.train.checkpoint import load_head

        return (load_head(src)[0].get("config", {}).get("target") or {}).get("name_or_path") or None
    except Exception:  # not a run dir: nothing recorded
        return None


def resolve(src: Path, target: str | None):
    """(target path, its HF config), or ConvertError asking for --target."""
    from transformers import AutoConfig

    from draftsmith.assets import resolve_target

    name = target or recorded_target(src)
    if not name:
        raise ConvertError(f"{src} records no target: name the model it drafts for with --target")
    path = resolve_target(name)
    if os.path.isdir(path):
        path = os.path.abspath(path)
    try:
        return path, AutoConfig.from_pretrained(path)
    except OSError as e:
        raise ConvertError(f"target {name!r}: its config cannot be read ({e})") from None


def check_fits(head: ForeignHead, target_config, src: Path) -> None:
    from draftsmith.train.heads import families

    problems = families.get(head.family).target_problems(head.config, target_config)
    if problems:
        raise ConvertError(f"{src}: this head does not fit the target: " + "; ".join(problems))


def init_overrides(head: ForeignHead) -> list[str]:
    """The training overrides that give a run this head's shape (what head.init_from compares)."""
    c = head.config
    if head.family == "mlp_speculator":
        reduced = c["draft_vocab_size"] if c["draft_vocab_size"] < c["vocab_size"] else 0
        keys = {"n_predict": c["n_predict"], "inner_dim": c["inner_dim"], "tie_weights": c["tie_weights"],
                "scale_input": c["scale_input"], "draft_vocab_size": reduced}  # fmt: skip
        return ["head.family=mlp_speculator", *(f"head.{k}={json.dumps(v)}" for k, v in keys.items())]
    keys = {k: c[k] for k in ("draft_vocab_size", "intermediate_size", "num_layers", "norm_before_residual",
                              "norm_before_fc", "fc_norm", "norm_output")}  # fmt: skip
    out = [f"head.family={head.family}", f"target.aux_layer_ids=[{','.join(map(str, c['aux_layer_ids']))}]"]
    return out + [f"head.{k}={json.dumps(v)}" for k, v in keys.items()]


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    src, out = Path(args.src), Path(args.out)
    if not src.is_dir():
        raise ConvertError(f"{src}: no such directory")
    target, target_config = resolve(src, args.target)
    head = read_any(src, target_config, args.layout)
    check_fits(head, target_config, src)
    head.config.setdefault("target", {})["name_or_path"] = target
    positions = getattr(target_config, "max_position_embeddings", None)
    if head.family != "mlp_speculator" and positions and head.config["max_position_embeddings"] < positions:
        # positions only bound the rope table: the target's, so vLLM serves its whole context (and a run continues)
        head.notes.append(
            f"max_position_embeddings {head.config['max_position_embeddings']} -> the target's {positions}"
        )
        head.config["max_position_embeddings"] = positions
    provenance = {"converted_from": {"path": str(src.resolve()), "layout": head.layout, "target": target}}
    from draftsmith.export.destination import check_export_destination

    check_export_destination([src], out, force=args.force)
    if args.to == "run":
        write_run(head, out, provenance)
    elif args.to == "vllm":
        write_vllm(head, out, verifier=target, target_config=target_config, dialect=args.dialect, k=args.k,
                   dtype=args.dtype, force=args.force, source=[src])  # fmt: skip
    elif args.to == "specforge":
        write_specforge(head, out, target, args.dtype)
    else:
        write_eagle3(head, out, args.dtype)
    print(f"converted {src} ({head.layout} layout, {head.family}) -> {out} ({args.to})")
    for note in head.notes:
        print(f"  {note}")
    if head.extra.get("embed_tokens.weight") is not None:
        print(
            "  embed_tokens.weight left out: a draftsmith head borrows the target's (draftsmith doctor compares them)"
        )
    if args.to == "run":
        print("continue training from it (the overrides give the run this head's shape):")
        print(f"  draftsmith train conf=<preset> target.name_or_path={target} head.init_from={out} "
              + " ".join(init_overrides(head)))  # fmt: skip
        print(f"or serve it: draftsmith export --format vllm {out} <dir>; check it: draftsmith doctor {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

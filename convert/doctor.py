r"""`draftsmith doctor HEAD --target T`: why a head accepts less than it should, checked and measured.

    draftsmith doctor EAGLE3-LLaMA3.1-Instruct-8B --target meta-llama/Llama-3.1-8B-Instruct
    draftsmith doctor specforge_out/epoch_9 --target Qwen/Qwen3-8B --write-fixed runs/fixed

HEAD is in any layout `draftsmith convert` reads (--from names it when the files cannot). First the static checks,
against the target's files: the checkpoint's own embed_tokens (vLLM loads it when present) against the target's, the
vocab, draft-vocab and hidden widths, the d2t / t2d maps, aux layer ids, rope type and scaling, a shipped tokenizer
or chat template, dtypes. Then the measurement: the reference decoder (eval/reference_decoder.py, greedy, the textbook
rule) drafts --num-prompts prompts with the head as vLLM would serve it, and with each candidate fix: the target's
embeddings, the aux ids one layer earlier and later (the SpecForge / vLLM numbering slip), the other
norm_before_residual, the target's rope. A candidate that gives clearly more tokens per target step is named as the
likely cause. --write-fixed OUT writes the head with the failed static checks fixed and the measured winner applied,
as a run directory (`draftsmith export` serves it).

Exit status 0: nothing failed; 1: a finding failed; 2: the head could not be read at all.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.argtypes import positive_int
from draftsmith.convert.checks import Finding, aux_ids, dtypes, embeddings, rope, tokenizer, verifier, widths
from draftsmith.convert.layouts import LAYOUTS, ConvertError, ForeignHead, detect, read_any

# a candidate fix is named as the cause when it gives this much more: relative and absolute tokens per target step
GAIN_REL, GAIN_ABS = 1.10, 0.05


@dataclass
class Variant:
    name: str  # "as served", "target's embed_tokens", "aux ids -1", ...
    head: ForeignHead
    embed: torch.Tensor | None  # the embeddings the draft layer reads (None: the target's)
    fixes: list[str] = field(default_factory=list)
    result: dict | None = None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="draftsmith doctor", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("head", help="the head's directory, in any layout draftsmith convert reads")
    p.add_argument("--target", default=None, help="the target it drafts for (default: the one the head records)")
    p.add_argument("--from", dest="layout", choices=LAYOUTS, default=None, help="the head's layout (default: detected)")
    p.add_argument("--prompts", default="mtbench", help="workload for the measurement: mtbench, code or a JSONL file")
    p.add_argument("--num-prompts", type=positive_int, default=8)
    p.add_argument("--max-tokens", type=positive_int, default=48)
    p.add_argument("--k", type=positive_int, default=3)
    p.add_argument("--no-measure", action="store_true", help="the static checks only (no target weights loaded)")
    p.add_argument("--write-fixed", default=None, metavar="OUT", help="write the fixed head as a run directory")
    p.add_argument("--force", action="store_true", help="let --write-fixed replace a non-empty OUT (and all in it)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the findings and figures as JSON")
    return p


def read(src: Path, target_config, layout: str | None) -> tuple[ForeignHead | None, list[Finding], str | None]:
    """The head as vLLM would serve it, and the reading to try beside it (aux ids in the other numbering)."""
    try:
        found = layout or detect(src)
    except ConvertError as e:
        if "can be read two ways" not in str(e):
            return None, [Finding("fail", "layout", str(e))], None
        # vLLM serves the ids as written; SpecForge meant one layer later: measure both
        found = "vllm"
        note = Finding("warn", "aux_layer_ids", "config.json records eagle_config aux ids without saying whose "
                       "numbering: read as vLLM serves them, and measured in SpecForge's (+1) too")  # fmt: skip
        try:
            return read_any(src, target_config, found), [note], "specforge"
        except ConvertError as e2:
            return None, [note, Finding("fail", "layout", str(e2))], None
    try:
        head = read_any(src, target_config, found)
    except ConvertError as e:
        key = next((k for k in ("d2t", "t2d", "embed_tokens", "tensors") if k in str(e)), "layout")
        return None, [Finding("fail", key, str(e))], None
    if head.layout == "modelopt":  # vLLM reads its ids as vLLM's own: one layer early (the "aux ids -1" row)
        ids = head.config["aux_layer_ids"]
        return head, [Finding("warn", "aux_layer_ids", f"a Model-Optimizer export records the layers it hooks (the "
                              f"output of layer i); vLLM reads those ids as its own numbering (the input of layer "
                              f"i) and drafts one layer early; read here as {ids}, and `draftsmith convert --to vllm` "
                              f"writes them so")], None  # fmt: skip
    return head, [], None


def static_checks(src: Path, head: ForeignHead, target: str, target_config, target_embed) -> list[Finding]:
    return [
        *widths(head, target_config),
        *embeddings(head, target_embed),
        *aux_ids(head, target_config),
        *rope(head, target_config),
        *tokenizer(src, target),
        *dtypes(src, head),
        *verifier(src, head, target),
    ]


def variants(head: ForeignHead, other_reading: ForeignHead | None, target_config, target_embed) -> list[Variant]:
    """The head as served, then each candidate fix on its own."""
    own = head.extra.get("embed_tokens.weight")
    own = own if own is not None and tuple(own.shape) == tuple(target_embed.shape) else None
    out = [Variant("as served", head, own)]
    if head.family == "mlp_speculator":
        return out

    def changed(name: str, fix: str, **config) -> Variant:
        h = copy.copy(head)
        h.config = {**head.config, **config}
        return Variant(name, h, own, [fix])

    if own is not None:
        out.append(Variant("target's embed_tokens", head, None, ["embed_tokens: the target's"]))
    n = target_config.num_hidden_layers
    ids = head.config["aux_layer_ids"]
    if other_reading is not None:
        out.append(Variant("SpecForge's numbering (+1)", other_reading, own, ["aux ids: SpecForge's numbering"]))
    for d in (-1, 1):
        moved = [i + d for i in ids]
        if all(0 <= i < n for i in moved) and (other_reading is None or moved != other_reading.config["aux_layer_ids"]):
            out.append(changed(f"aux ids {d:+d}", f"aux ids {moved}", aux_layer_ids=moved))
    nbr = not head.config["norm_before_residual"]
    out.append(
        changed(f"norm_before_residual={str(nbr).lower()}", f"norm_before_residual {nbr}", norm_before_residual=nbr)
    )
    from draftsmith.train.heads.eagle3 import Eagle3Config

    theirs = Eagle3Config.from_target(target_config, 1, [0])
    if (theirs.rope_theta, theirs.rope_scaling) != (head.config["rope_theta"], head.config.get("rope_scaling")):
        out.append(
            changed(
                "target's rope", "rope: the target's", rope_theta=theirs.rope_theta, rope_scaling=theirs.rope_scaling
            )
        )
    return out


def measure(target: str, vs: list[Variant], args, log=print) -> None:
    """Each variant's greedy reference-decoder figures on the same prompts (`result`: decode_prompts' summary)."""
    from transformers import AutoTokenizer

    from draftsmith.eval.prompts import load_workload, render_prompts
    from draftsmith.eval.reference_decoder import decode_prompts, generation_stop_ids
    from draftsmith.train.checkpoint import head_from_state
    from draftsmith.train.heads import families
    from draftsmith.train.target import Target

    tok = AutoTokenizer.from_pretrained(target)
    _, prompts, source = load_workload(args.prompts, args.num_prompts)
    ids = render_prompts(tok, prompts)
    stop = generation_stop_ids(tok, target)
    model = Target.from_pretrained(target, aux_layer_ids=[0]).model
    log(f"doctor: drafting {len(ids)} prompts of {source}, {args.max_tokens} tokens, k={args.k}, per variant")
    for v in vs:
        family = families.get(v.head.family)
        tgt = Target(model, v.head.config.get("aux_layer_ids") or [0])
        module = head_from_state(family, v.head.config, v.head.state, v.name)
        module.attach_target(tgt)
        if v.embed is not None:
            with torch.no_grad():
                module.embed_tokens.weight.copy_(v.embed.float())
        drafter = family.drafter(module, draft_sampling="greedy", name=v.name)
        _, v.result = decode_prompts(tgt, drafter, ids, k=args.k, max_tokens=args.max_tokens, stop_ids=stop)
        pos = ", ".join(f"{a:.2f}" for a in v.result["per_position_acceptance"] or [])
        log(f"  {v.name:<28} {v.result['tokens_per_target_step']:.3f} tokens per target step; acceptance by "
            f"position [{pos}]")  # fmt: skip


def judge(vs: list[Variant]) -> list[Finding]:
    base = vs[0].result["tokens_per_target_step"]
    out = []
    for v in vs[1:]:
        got = v.result["tokens_per_target_step"]
        if got >= base * GAIN_REL and got >= base + GAIN_ABS:
            out.append(Finding("fail", "measured", f"{v.name}: {got:.3f} tokens per target step against {base:.3f} "
                               f"as served ({got / base:.2f}x): the likely cause"))  # fmt: skip
    if not out:
        out.append(Finding("ok", "measured", f"{base:.3f} tokens per target step as served; no candidate fix gives "
                           f"{GAIN_REL:.2f}x"))  # fmt: skip
    return out


def fixed_head(head: ForeignHead, static: list[Finding], vs: list[Variant]) -> tuple[ForeignHead, list[str]]:
    """The head with its embeddings fixed (a draftsmith head never carries its own) and the best measured variant's
    config change applied when it won."""
    fixes = []
    if any(f.key == "embed_tokens" and f.level == "fail" for f in static):
        fixes.append("embed_tokens: the target's (the checkpoint's copy dropped)")
    best = max(vs, key=lambda v: v.result["tokens_per_target_step"]) if vs and vs[0].result else None
    base = vs[0].result["tokens_per_target_step"] if best else 0
    if best and best.fixes and best.result["tokens_per_target_step"] >= max(base * GAIN_REL, base + GAIN_ABS):
        head = best.head
        fixes += [f for f in best.fixes if not f.startswith("embed_tokens")]
    return head, fixes


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    from draftsmith.convert.cli import resolve
    from draftsmith.convert.write import target_embeddings, write_run

    src = Path(args.head)
    if not src.is_dir():
        raise ConvertError(f"{src}: no such directory")
    if args.write_fixed:  # OUT is replaced whole: refused before anything runs unless it is new, empty or --force
        from draftsmith.export.destination import check_export_destination

        check_export_destination([src], args.write_fixed, force=args.force)
    target, target_config = resolve(src, args.target)
    head, findings, other = read(src, target_config, args.layout)
    report: dict = {"head": str(src), "target": target, "findings": [], "measured": {}}
    if head is None:
        for f in findings:
            print(f.line())
        report["findings"] = [f.__dict__ for f in findings]
        _write_json(args.json, report)
        return 2
    print(f"doctor: {src} ({head.layout} layout, {head.family}) against {target}")
    target_embed = target_embeddings(target)
    findings += static_checks(src, head, target, target_config, target_embed)
    for f in findings:
        print(f.line())
    vs: list[Variant] = []
    if not args.no_measure and not any(f.level == "fail" and f.key in ("widths", "tokenizer") for f in findings):
        other_head = read_any(src, target_config, other) if other else None
        vs = variants(head, other_head, target_config, target_embed)
        measure(target, vs, args)
        measured = judge(vs)
        for f in measured:
            print(f.line())
        findings += measured
        report["measured"] = {v.name: v.result for v in vs}
    report["findings"] = [f.__dict__ for f in findings]
    if args.write_fixed:
        fixed, fixes = fixed_head(head, findings, vs)
        write_run(fixed, Path(args.write_fixed), {"converted_from": {"path": str(src.resolve()), "layout": head.layout,
                                                                     "target": target, "fixes": fixes}})  # fmt: skip
        print(f"doctor: wrote {args.write_fixed} ({'; '.join(fixes) or 'no fix needed'}); serve it with "
              f"draftsmith export --format vllm {args.write_fixed} <dir>")  # fmt: skip
    _write_json(args.json, report)
    failed = [f for f in findings if f.level == "fail"]
    print(f"doctor: {len(failed)} finding(s) failed" if failed else "doctor: nothing found that lowers acceptance")
    return 1 if failed else 0


def _write_json(path: str | None, report: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=1, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The `draftsmith` command: one console script, one verb per stage.

draftsmith train conf=eagle3_smollm2       # = python train/run.py / accelerate launch train/run.py ...
draftsmith prepare-target smollm2          # convert the embedded GGUF target once
draftsmith export --format vllm CKPT OUT   # vLLM-loadable checkpoint, contract-checked
draftsmith eval acceptance ...             # real vLLM speculative decoding + baselines
draftsmith regenerate --out regen.jsonl    # the target's own answers as training data
draftsmith extract --out DIR conf=NAME     # target features once, as shards (data.features=offline)
draftsmith quickstart                      # the README's main job, end to end
draftsmith adapt RUN --traffic F --out DIR  # fit a head to its traffic, promoted only when it wins
draftsmith serve exported/eagle3_smollm2   # vLLM's OpenAI server with the head (and its hybrid), as measured
draftsmith convert SRC OUT --target T      # a head from another project -> a draftsmith run (or an export)
draftsmith doctor HEAD --target T          # why a head accepts less than it should, measured
"""

from __future__ import annotations

import importlib
import os
import sys

from draftsmith.errors import handle_errors

# verb -> "module" with a `main(argv)` (or "module:function"); imported lazily so `draftsmith --help` never loads
# torch or vLLM
VERBS = {
    "train": (
        "draftsmith.train.run:cli",
        "train a draft head: Hydra overrides as for train/run.py (conf=NAME key=value ...)",
    ),
    "export": (
        "draftsmith.export.cli",
        "write a vLLM checkpoint (EAGLE-3 speculators/native dialect) from a training checkpoint",
    ),
    "eval": (
        "draftsmith.eval.cli",
        "measure acceptance in real vLLM speculative decoding (`draftsmith eval acceptance --help`)",
    ),
    "extract": (
        "draftsmith.train.features.extract",
        "write a run's target features once as safetensors shards (resumable, sharded, "
        "disk-budgeted); --validate DIR checks them",
    ),
    "regenerate": (
        "draftsmith.train.data.regenerate",
        "re-answer a dataset's first user turns with the target (vLLM or HF), resumable",
    ),
    "serve": (
        "draftsmith.serve.cli",
        "vLLM's OpenAI server with an exported head (and its hybrid), as measured (`draftsmith serve --help`)",
    ),
    "quickstart": (
        "draftsmith.quickstart",
        "install-time main job: prepare, train, export, serve and measure on the embedded default",
    ),
    "adapt": (
        "draftsmith.adapt",
        "fit a trained head to the traffic it serves; export it only if it wins (`draftsmith adapt --help`)",
    ),
    "convert": (
        "draftsmith.convert.cli",
        "read a head from another project (EAGLE-3 release, SpecForge, speculators, IBM MLP) as a run or an export",
    ),
    "doctor": (
        "draftsmith.convert.doctor",
        "check a head in any layout against its target, name what lowers acceptance, measure it (and the fix)",
    ),
    "prepare-target": ("draftsmith.prepare", "convert the embedded SmolLM2 GGUF target to a safetensors HF directory"),
}


def _usage() -> str:
    lines = ["usage: draftsmith <verb> [args] [--debug]", "", "verbs:"]
    lines += [f"  {verb:<15} {text}" for verb, (_, text) in VERBS.items()]
    lines += ["", "A problem prints as one message; --debug (or DRAFTSMITH_DEBUG=1) shows the full traceback."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"draftsmith: unknown verb {verb!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if "--debug" in rest:  # full tracebacks, also in the training subprocess the quickstart starts
        rest = [a for a in rest if a != "--debug"]
        os.environ["DRAFTSMITH_DEBUG"] = "1"
    module, _, function = VERBS[verb][0].partition(":")
    return handle_errors(
        f"draftsmith {verb}", lambda: getattr(importlib.import_module(module), function or "main")(rest)
    )


if __name__ == "__main__":
    sys.exit(main())

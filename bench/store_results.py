"""Store prompt files of committed benchmark records once: bench/results/prompts/<sha256[:16]>.jsonl.

Every A/B serves the same held-out prompts, and each record used to carry its own copy. This moves each prompt
JSONL under bench/results (a run's `prompts.jsonl`, `bench_prompts/workloads/*.jsonl`, ...) into the store by
content hash and leaves `<name>.sha256` in its place: one line, the sha256 and the stored file's path relative to the
repository. `--restore DIR` puts the copies back for a record (e.g. to re-serve it with the harness).

    python bench/store_results.py                      # every record under bench/results
    python bench/store_results.py --restore bench/results/2026-11-28/bs2048_code_60
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
STORE = RESULTS / "prompts"


def prompt_files(root: Path) -> list[Path]:
    """Prompt JSONLs of the records under `root`: named *prompts*.jsonl or under a bench_prompts/ dir."""
    out = []
    for p in sorted(root.rglob("*.jsonl")):
        if STORE in p.parents:
            continue
        rel = p.relative_to(root).parts
        if "prompts" in p.name or "bench_prompts" in rel:
            out.append(p)
    return out


def store(path: Path) -> Path:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    kept = STORE / f"{digest[:16]}.jsonl"
    if not kept.exists():
        STORE.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, kept)
    pointer = path.with_name(path.name + ".sha256")
    pointer.write_text(f"{digest} {kept.relative_to(ROOT)}\n")
    path.unlink()
    return kept


def restore(root: Path) -> int:
    n = 0
    for pointer in sorted(root.rglob("*.jsonl.sha256")):
        digest, rel = pointer.read_text().split()
        src = ROOT / rel
        if hashlib.sha256(src.read_bytes()).hexdigest() != digest:
            raise SystemExit(f"{src}: its sha256 differs from {pointer}")
        shutil.copyfile(src, pointer.with_suffix(""))
        n += 1
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--restore", metavar="DIR", help="put a record's prompt files back from the store")
    args = ap.parse_args()
    if args.restore:
        print(f"restored {restore(Path(args.restore))} prompt files")
        return 0
    files = prompt_files(RESULTS)
    before = sum(p.stat().st_size for p in files)
    kept = {store(p) for p in files}
    after = sum(p.stat().st_size for p in kept)
    print(f"{len(files)} prompt files ({before / 2**20:.1f} MiB) -> {len(kept)} stored ({after / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

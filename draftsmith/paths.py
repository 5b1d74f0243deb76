"""Machine-independent paths for results that get committed: the repo becomes relative, home `~`, temp `<tmp>`."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEXT_SUFFIXES = {".json", ".jsonl", ".md", ".yaml", ".yml", ".log", ".txt", ".csv", ".sh", ".py"}
# an absolute path under a machine's own directories, as it would appear in a results file
MACHINE_PATH = re.compile(r"(?<![\w.~<>-])/(?:root|home|Users|work|tmp|private/var)/[^\s\"',)\]}]+")


def portable(text: str, repo: str | os.PathLike = REPO) -> str:
    """`text` with the repo's absolute path made relative, the home directory as ~ and the temp dir as <tmp>."""
    repo = str(Path(repo).resolve())
    for prefix, repl in (
        (repo + "/", ""),
        (repo, "."),
        (str(Path.home()), "~"),
        (tempfile.gettempdir(), "<tmp>"),
        ("/tmp", "<tmp>"),
    ):
        if prefix not in ("/", ""):
            text = text.replace(prefix, repl)
    return text


def make_portable(root: str | os.PathLike, repo: str | os.PathLike = REPO) -> list[Path]:
    """Rewrite every text file under `root` with `portable` paths; returns the files changed."""
    changed = []
    for path in sorted(Path(root).rglob("*")):
        if path.is_file() and path.suffix in TEXT_SUFFIXES:
            text = path.read_text(errors="surrogateescape")
            new = portable(text, repo)
            if new != text:
                path.write_text(new, errors="surrogateescape")
                changed.append(path)
    return changed


def is_prompt_data(path: Path) -> bool:
    """Prompt and workload files hold users' text, which may quote any path: data, not our provenance."""
    return path.suffix == ".jsonl" and (
        "prompt" in path.name or "heldout" in path.name or "workloads" in path.parts or "prompts" in path.parts
    )  # bench/results/prompts/: the store of prompt files by hash (bench/store_results.py)


def machine_paths(root: str | os.PathLike) -> dict[str, list[str]]:
    """{file: the absolute machine paths it holds} for the text files under `root` (prompt data aside)."""
    found = {}
    for path in sorted(Path(root).rglob("*")):
        if path.is_file() and path.suffix in TEXT_SUFFIXES and not is_prompt_data(path):
            hits = MACHINE_PATH.findall(path.read_text(errors="surrogateescape"))
            if hits:
                found[str(path)] = sorted(set(hits))[:3]
    return found

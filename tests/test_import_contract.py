"""The house rules of the `draftsmith.*` modules: which room may import which, and no import cycles.

Read from the source (every import statement, at module level or inside a function), so a forbidden
arrow fails here before it becomes a tangle.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {
    "draftsmith": "draftsmith",
    "train": "draftsmith.train",
    "export": "draftsmith.export",
    "eval": "draftsmith.eval",
    "serve": "draftsmith.serve",
    "convert": "draftsmith.convert",
}
# the ground floor: what every other room may use, and which uses nothing above it
GROUND = {
    f"draftsmith.{m}"
    for m in ("assets", "atomic", "errors", "paths", "generate", "serve.runner", "serve.fixes", "serve.step_timer")
}
# (importer prefix, imported prefix, why not)
FORBIDDEN = [
    ("draftsmith.train.heads", "draftsmith.train.target", "a head is a plain module: it gets tensors, not the target"),
    ("draftsmith.train.heads", "draftsmith.train.loop", "a head knows nothing of training"),
    ("draftsmith.train.data", "draftsmith.train.heads", "data is head-agnostic"),
    ("draftsmith.export", "draftsmith.train.loop", "export reads checkpoints, it does not train"),
    ("draftsmith.eval", "draftsmith.train.loop", "eval reads heads, it does not train"),
    ("draftsmith.train.target", "draftsmith.train.heads", "the target knows nothing of heads"),
    ("draftsmith.serve", "draftsmith.eval", "eval depends on the serving seam, never the reverse"),
]


def modules() -> dict[str, Path]:
    """Every module of the package, by import name (the folders are mapped as pyproject's package-dir does)."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the draftsmith modules it imports anywhere in its source."""
    mods = modules()
    graph = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("draftsmith"):
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("draftsmith"))
        graph[name] = {d for d in deps if d in mods and d != name and not name.startswith(d + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_no_forbidden_arrow():
    graph = import_graph()
    bad = [
        f"{a} -> {b}: {why}"
        for a, deps in graph.items()
        for b in deps
        for src, dst, why in FORBIDDEN
        if within(a, src) and within(b, dst)
    ]
    bad += [
        f"{a} -> {b}: the ground floor imports only the ground floor"
        for a in GROUND
        for b in graph[a]
        if b not in GROUND and b != "draftsmith"
    ]
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_checker_sees_real_arrows():
    """The rules would fail if broken: the graph holds the arrows we know exist, and a cycle is found."""
    graph = import_graph()
    assert "draftsmith.train.features.sources" in graph["draftsmith.train.loop"]
    assert "draftsmith.train.heads.eagle3" in graph["draftsmith.export.vllm"]
    assert "draftsmith.serve.policy" in graph["draftsmith.eval.hybrid"]
    assert GROUND <= set(graph)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

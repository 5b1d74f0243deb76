"""The pycode: data source: code-completion prompts read from an installed Python tree."""

from __future__ import annotations

import textwrap

import pytest

from draftsmith.train.data import code_prompts as cp
from draftsmith.train.data.conversations import DataError, read_conversations

MODULE = '''
def documented(a, b=1):
    """Add two numbers.

    Returns their sum.
    """
    return a + b


def one_line_doc(x):
    """Too short a docstring to ask about."""
    return x


def _private(x):
    """Private.

    Not asked.
    """
    return x


def only_docstring():
    """A body with nothing but the docstring.

    Nothing to complete.
    """


@staticmethod
def decorated(x):
    """Decorated.

    Left out: the cut would drop the decorator's meaning.
    """
    return x


class Public:
    def method(self, n):
        """Repeat n times.

        Returns a list.
        """
        return [self] * n

    def _hidden(self):
        """Hidden.

        Not asked.
        """
        return 1


class _Private:
    def method(self):
        """In a private class.

        Not asked.
        """
        return 1
'''


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text(MODULE)
    (root / "tests").mkdir()
    (root / "tests" / "helpers.py").write_text(MODULE)  # a test directory: skipped
    (root / "test_things.py").write_text(MODULE)  # a test module: skipped
    (root / "broken.py").write_text("def f(:\n")  # not Python 3 source: skipped, not fatal
    many = "".join(
        f'def f{i}(x):\n    """Function {i}.\n\n    Returns x.\n    """\n    return x\n\n\n' for i in range(10)
    )
    (root / "many.py").write_text(many)
    return root


def test_picks_documented_public_functions_and_methods(tree):
    prompts = dict(cp.code_prompts("stdlib", tree))
    mod = {k for k in prompts if k.startswith("stdlib:pkg.mod.")}
    assert mod == {"stdlib:pkg.mod.documented", "stdlib:pkg.mod.Public.method"}
    assert not any("tests" in k or "test_things" in k or "broken" in k for k in prompts)
    # the prompt is the signature and docstring, dedented, without the body
    head = prompts["stdlib:pkg.mod.Public.method"]
    assert head.startswith("def method(self, n):\n") and head.rstrip().endswith('"""')
    assert "return" not in head
    # at most PER_MODULE functions from one module
    assert sum(k.startswith("stdlib:many.") for k in prompts) == cp.PER_MODULE


def test_order_is_fixed_and_n_keeps_a_prefix(tree):
    every = [r for r, _ in cp.pycode_records("pycode:stdlib", tree)]
    again = [r for r, _ in cp.pycode_records("pycode:stdlib", tree)]
    assert every == again and len(every) == 2 + cp.PER_MODULE
    first3 = [r for r, _ in cp.pycode_records("pycode:stdlib:3", tree)]
    assert first3 == every[:3]
    rec = every[0]
    assert rec["messages"][0]["role"] == "user" and len(rec["messages"]) == 1
    assert rec["messages"][0]["content"] == cp.ASK.format(dict(cp.code_prompts("stdlib", tree))[rec["id"]])


def test_read_conversations_reads_the_source_as_prompts(tree, monkeypatch):
    monkeypatch.setattr(cp, "root_dir", lambda name: tree)
    convs = list(read_conversations("pycode:site-packages:4", questions=True))
    assert len(convs) == 4 and all(c.id.startswith("site-packages:") for c in convs)
    assert all([m["role"] for m in c.messages] == ["user"] for c in convs)
    # without questions=True a prompt with no answer is no training conversation
    assert list(read_conversations("pycode:site-packages:4")) == []


@pytest.mark.parametrize(
    "path,match",
    [
        ("pycode:", "ROOT one of stdlib, site-packages"),
        ("pycode:lib", "ROOT one of"),
        ("pycode:stdlib:0", "N must be a positive integer"),
        ("pycode:stdlib:ten", "N must be a positive integer"),
        ("pycode:stdlib:1:2", "expected pycode:ROOT"),
    ],
)
def test_bad_source_names_are_refused_at_the_call(path, match):
    with pytest.raises(DataError, match=match):
        read_conversations(path, questions=True)


def test_a_tree_without_functions_is_an_error_naming_it(tmp_path, monkeypatch):
    (tmp_path / "empty.py").write_text(textwrap.dedent("X = 1\n"))
    monkeypatch.setattr(cp, "root_dir", lambda name: tmp_path)
    with pytest.raises(DataError, match=f"pycode:stdlib: no documented public function found under {tmp_path}"):
        read_conversations("pycode:stdlib", questions=True)
    monkeypatch.setattr(cp, "root_dir", lambda name: tmp_path / "missing")
    with pytest.raises(DataError, match="is not a directory"):
        read_conversations("pycode:stdlib", questions=True)


def test_installing_a_package_moves_no_other_packages_prompts(tree):
    """site-packages prompts are ranked by their own ids: a new package only inserts its own prompts, so a shipped
    pool's answers keep matching (one shuffle over every file reordered everything after the new package)."""
    before = [fid for fid, _ in cp.code_prompts("site-packages", tree)]
    new = tree / "aaa_new_package"  # sorts before every other file: the old shuffle would shift all of them
    new.mkdir()
    (new / "__init__.py").write_text(MODULE)
    after = [fid for fid, _ in cp.code_prompts("site-packages", tree)]
    added = [fid for fid in after if fid.startswith("site-packages:aaa_new_package.")]
    assert len(added) == 2
    assert [fid for fid in after if fid not in added] == before
    # the order is each prompt's rank, not the order of the files
    assert sorted(after, key=lambda fid: cp.rank((fid, ""))) == after

"""Every command in the README works as written: training commands compose and pass the config checks, every
`draftsmith` command line parses with its verb's own parser (and any overrides compose), accelerate config files and
make targets exist, Python blocks compile, `--help` lines run. The long ones (make quickstart, make test) are run by
CI and by the quickstart bench records; the README stays under 300 lines."""

import argparse
import importlib
import json
import re
import shlex
from pathlib import Path

import pytest

from draftsmith.cli import VERBS
from draftsmith.train.config import compose_config, validate_config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def commands(lang: str) -> list[str]:
    """The README's `lang` code blocks as commands: continuation lines joined, comments and blank lines dropped."""
    out = []
    for kind, body in BLOCK.findall(README):
        if kind != lang:
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if line:
                out.append(line)
    return out


class Parsed(Exception):
    def __init__(self, args):
        self.args_ = args


@pytest.fixture
def parse_only(monkeypatch):
    """Stop every verb right after argparse accepted its command line (nothing runs)."""
    real = argparse.ArgumentParser.parse_args

    def parse(self, args=None, namespace=None):
        raise Parsed(real(self, args, namespace))

    def parse_intermixed(self, args=None, namespace=None):
        raise Parsed(real_intermixed(self, args, namespace))

    real_intermixed = argparse.ArgumentParser.parse_intermixed_args
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_intermixed_args", parse_intermixed)


def check_training(argv: list[str]) -> None:
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    cfg = compose_config(overrides)
    validate_config(cfg)


def test_the_readme_is_short():
    assert len(README.splitlines()) <= 300


def test_every_bash_command_works_as_written(parse_only):
    seen = set()
    makefile = (ROOT / "Makefile").read_text()
    for line in commands("bash"):
        argv = shlex.split(line)
        if argv[:1] == ["."]:
            continue
        if argv[0] == "make":
            assert re.search(rf"^{argv[1]}:", makefile, re.M), f"README: `{line}`: no make target {argv[1]}"
            seen.add("make")
            continue
        if argv[:2] == ["accelerate", "launch"]:
            if "--config_file" in argv:
                assert (ROOT / argv[argv.index("--config_file") + 1]).is_file(), line
            assert "train/run.py" in argv, line
            check_training(argv[argv.index("train/run.py") + 1 :])
            seen.add("train")
            continue
        assert argv[0] == "draftsmith", f"README: `{line}`: not a command this test knows how to check"
        verb = argv[1]
        module, _, function = VERBS[verb][0].partition(":")
        main = getattr(importlib.import_module(module), function or "main")
        try:
            rc = main(argv[2:])
        except Parsed as p:
            check_training(getattr(p.args_, "overrides", None) or [])
        except SystemExit as e:
            assert e.code in (0, None), f"README: `{line}` is refused by its parser (exit {e.code})"
        else:
            assert rc == 0, f"README: `{line}` exits {rc}"
        seen.add(verb)
    assert {"make", "train", "export", "eval", "regenerate", "extract", "adapt"} <= seen


def test_every_python_block_compiles():
    blocks = [body for kind, body in BLOCK.findall(README) if kind == "python"]
    assert blocks
    for body in blocks:
        compile(body, "README.md", "exec")


def test_the_files_it_names_exist():
    for path in set(re.findall(r"`((?:docs|bench|conf|train|export|eval|draftsmith|scripts|tests)/[\w./-]+)`", README)):
        if "quickstart_" in path:  # the bench record the headline quotes: checked below once it is committed
            continue
        assert (ROOT / path).exists(), f"README names {path}, which does not exist"


def table_rows(text: str, header_start: str) -> list[list[str]]:
    """The body rows (cells stripped) of the first markdown table in `text` whose header begins `header_start`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def figures(cells: list[str]) -> list[str]:
    return [re.sub(r"[*x×]", "", c) for c in cells]


def test_the_headline_table_is_the_quickstarts_own_output():
    """Each row of the README's headline table equals the summary table that `draftsmith quickstart` printed in the
    run it names (bench/results/.../quickstart.json): head, ngram, suffix, the ratio and the served speed, then the
    hybrid's three figures, or dashes for a record served without the hybrid."""
    rows = table_rows(README, "| 2-core machine")
    hybrids, record, quoted, served = set(), None, {}, {}  # quoted / served: the workloads per record
    for cells in rows:
        named = re.search(r"`(\d{4}-\d\d-\d\d/quickstart_\w+)/`", cells[0])
        record = named.group(1) if named else record
        assert record, f"headline row {cells} names no quickstart record"
        run = json.loads((ROOT / "bench" / "results" / record / "quickstart.json").read_text())
        assert run["command"].startswith("draftsmith quickstart"), record
        workload = {"chat": "chat", "MT-Bench": "mtbench", "HumanEval": "code"}[cells[1]]
        quoted.setdefault(record, []).append(workload)
        served[record] = run["plan"]["workloads"]
        own = next(r for r in table_rows(run["headline"], "| workload") if r[0] == workload)
        assert figures(cells[2:7]) == figures(own[1:6]), (record, workload)
        assert figures(cells[7:10]) == (figures(own[7:10]) or ["-"] * 3), (record, workload)
        if run.get("hybrid_fit"):
            hybrids.add(record)
    assert len(quoted) >= 3
    assert quoted == served  # every workload each run served, in its order, once
    assert len(hybrids) >= 2  # the default command fits and serves the hybrid: most records show it

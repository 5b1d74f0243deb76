"""`make setup` installs the pinned, tested versions (scripts/constraints.txt): a fresh clone gets what CI and the
shipped pycode:site-packages answers were made with, and the pins agree with what pyproject.toml asks."""

import importlib.metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "scripts" / "constraints.txt"


def pins() -> dict[str, str]:
    """{canonical name: version} of the lock, each line `name==version`."""
    out = {}
    for n, line in enumerate(LOCK.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and version and " " not in line, f"{LOCK.name}:{n}: expected name==version, got {line!r}"
        out[canonicalize_name(name)] = version
    return out


def test_the_pins_satisfy_every_requirement_setup_installs():
    """Each dependency of the extras setup installs is pinned, to a version its specifier admits: a pyproject change
    without `make lock` fails here in seconds instead of as a resolution conflict in every fresh set-up."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    asked = [Requirement(r) for r in project["dependencies"] + extras["serving"] + extras["test"]]
    locked = pins()
    unpinned = [str(r) for r in asked if canonicalize_name(r.name) not in locked]
    refused = [
        f"{r} (pinned {v})"
        for r in asked
        if (v := locked.get(canonicalize_name(r.name))) and not r.specifier.contains(v, prereleases=True)
    ]
    assert not unpinned and not refused, f"unpinned {unpinned}, pins outside pyproject's range {refused}: `make lock`"


def test_setup_installs_under_the_pins_and_this_installation_has_them():
    """setup.sh passes the lock to every install, and the installation these tests run in holds exactly its
    versions (a hand-upgraded package, or a set-up that ignored the lock, is named here)."""
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "-c scripts/constraints.txt" in setup and "scripts/constraints.txt | sha1sum" in setup
    differ = []
    for name, version in pins().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            differ.append(f"{name}: not installed, pinned {version}")
            continue
        if Version(installed).public != Version(version).public:
            differ.append(f"{name}: {installed} installed, pinned {version}")
    assert not differ, f"this installation is not the pinned one: {differ[:10]}; `make setup` (or `make lock`)"

"""A non-editable install (a wheel) carries conf/ and runs `draftsmith train` from any directory."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_the_configs_and_trains_from_any_directory(tmp_path):
    src = tmp_path / "src"  # a clean copy: setuptools builds in-tree (build/), never in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    import tomllib

    folders = {d.split("/")[0] for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"].values()}  # fmt: skip
    for name in sorted(folders):  # every folder pyproject maps into the package
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    p = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    wheel = next(wheels.glob("draftsmith-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "draftsmith/conf/config.yaml",
        "draftsmith/conf/conf/eagle3_smollm2.yaml",
        "draftsmith/conf/head/eagle3.yaml",
        "draftsmith/train/run.py",
        "draftsmith/serve/plugin.py",  # the vLLM entry point's module
        "draftsmith/convert/cli.py",
        "draftsmith/data/regen/pools.json",  # the embedded default's regenerated answers (draftsmith/shipped.py)
        "draftsmith/data/regen/regen-smollm2-sharegpt.jsonl.xz",
    } <= names

    # a fresh venv that sees this environment's packages (torch, transformers, hydra) but not the editable checkout
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    deps = [q for q in sys.path if q.endswith("site-packages")]
    (site / "deps.pth").write_text("\n".join(deps) + "\n")
    with zipfile.ZipFile(wheel) as z:  # installing a wheel is unpacking it (no pip in this venv, no network)
        z.extractall(site)
    py = venv / "bin" / "python"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (
        "import sys, draftsmith.train.run as r; from draftsmith.cli import main; "
        "print(r.__file__); sys.exit(main(['train', 'conf=eagle3_llama8b', 'dry_run=true']))"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONNOUSERSITE": "1", "HF_HUB_OFFLINE": "1"}
    p = subprocess.run(
        [str(py), "-S", "-c", f"import site; site.addsitedir({str(site)!r}); " + code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=elsewhere,
        env=env,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert p.stdout.splitlines()[0].startswith(str(site))  # the installed copy, not the checkout
    assert "dry run: meta-llama/Llama-3.1-8B-Instruct" in p.stdout and "| ddp |" in p.stdout

"""Nothing lost, nothing silent: a shard overwritten on disk is refused before its data is used (checksum on first
read), a deleted one is extracted again, and a --max-disk too small for one shard fails instead of writing nothing."""

import re
from pathlib import Path

import pytest
import torch
from test_extract import _feature_source, data_file, overrides, run_extract, train_in_process  # noqa: F401

import draftsmith.train.features.shards as shards
from draftsmith.train.features.shards import ShardError, ShardStore, load_manifest, parse_size, validate


def _compose(args):
    from draftsmith.train.config import compose_config as compose

    return compose(args)


def overwrite_middle(path, n: int = 64) -> None:
    """Flip n bytes in the middle of a file, keeping its size (what a bad disk or a stray writer does)."""
    blob = bytearray(path.read_bytes())
    mid = len(blob) // 2
    blob[mid : mid + n] = bytes(b ^ 0x5A for b in blob[mid : mid + n])
    path.write_bytes(bytes(blob))


def test_fmt_size_up_never_rounds_below():
    for n in (1, 1000, 1023, 1024, 1025, 60_000, 1_048_575, 1_048_577, 5 * 2**30 + 1, 3 * 2**40 + 7):
        assert parse_size(shards.fmt_size_up(n)) >= n, n


@pytest.mark.parametrize("dtype, compression", [("fp32", "none"), ("bf16", "zlib")])
def test_overwritten_shard_is_refused_before_its_data_is_used(
    tiny_target_dir, data_file, tmp_path, monkeypatch, dtype, compression
):
    args = overrides(tiny_target_dir, data_file, tmp_path / "x")
    out = tmp_path / "f"
    run_extract(args, out, shard_size="96K", dtype=dtype, compression=compression)
    m = load_manifest(out)
    assert len(m["shards"]) >= 3
    hashed, opened = [], []
    real_hash, real_open = shards.file_sha256, shards.safe_open
    monkeypatch.setattr(shards, "file_sha256", lambda p: hashed.append(p.name) or real_hash(p))
    monkeypatch.setattr(shards, "safe_open", lambda p, **kw: opened.append(p) or real_open(p, **kw))

    # untouched: every sample reads back, each shard hashed once per process however often it is (re)opened
    store = ShardStore(out, max_open=1)
    clean = {i: store.get(i) for i in range(32)}
    clean.update({i: store.get(i) for i in range(32)})
    ShardStore(out).get(0)
    assert sorted(hashed) == sorted(s["name"] for s in m["shards"])

    bad = m["shards"][1]
    overwrite_middle(out / bad["name"])
    # as a later run finds it: a new process (here, the same file clock tick could hide the rewrite from the cache)
    monkeypatch.setattr(shards, "_verified", {})
    opened.clear()
    fresh = ShardStore(out)
    with pytest.raises(ShardError) as e:
        fresh.get(bad["samples"][0])
    msg = str(e.value)
    assert str(out / bad["name"]) in msg and f"features directory {out}" in msg
    assert re.search(rf"sha256 [0-9a-f]{{64}}, but the manifest .* recorded {bad['sha256']}", msg)
    assert f"draftsmith extract --validate {out}" in msg and "\n" not in msg  # one paragraph, what to do
    assert str(out / bad["name"]) not in opened  # refused before its bytes were read as tensors
    good = m["shards"][0]["samples"][0]
    assert torch.equal(fresh.get(good)["last"], clean[good]["last"])  # the other shards still read
    assert any(bad["name"] in p and "sha256 differs" in p for p in validate(out)[1])

    # the advice works: delete the bad shard, the same extraction redoes just its samples
    (out / bad["name"]).unlink()
    with pytest.raises(ShardError, match=r"1 shard\(s\) the manifest lists are missing"):
        _feature_source(_compose(args + ["data.features=offline", f"data.features_dir={out}"]))
    summary = run_extract(args, out, shard_size="96K", dtype=dtype, compression=compression)
    assert summary["complete"] and summary["new_samples"] == len(bad["samples"])
    assert validate(out)[1] == []
    again = ShardStore(out)
    for i in bad["samples"]:
        assert torch.equal(again.get(i)["input_ids"], clean[i]["input_ids"])
        torch.testing.assert_close(again.get(i)["last"], clean[i]["last"], rtol=0, atol=1e-5)


def test_offline_training_stops_on_an_overwritten_shard(tiny_target_dir, data_file, tmp_path):
    """The run that would have trained on changed bytes (losses moving, no warning) stops with the shard's name."""
    args = overrides(tiny_target_dir, data_file, tmp_path / "x")
    out = tmp_path / "f"
    run_extract(args, out, shard_size="1M")
    names = [s["name"] for s in load_manifest(out)["shards"]]
    for name in names:  # every shard, so the first batch meets one whichever samples it holds
        overwrite_middle(out / name)
    with pytest.raises(ShardError, match=rf"{out}/shard-r00000-\d{{6}}\.safetensors: sha256 .* none of its data"):
        train_in_process(
            overrides(
                tiny_target_dir,
                data_file,
                tmp_path / "run",
                "data.features=offline",
                f"data.features_dir={out}",
                "optim.max_steps=2",
            )
        )


def test_max_disk_too_small_for_one_shard_fails_and_writes_nothing(tiny_target_dir, data_file, tmp_path, capsys):
    from draftsmith.cli import main

    args = overrides(tiny_target_dir, data_file, tmp_path / "x")
    out = tmp_path / "f"
    assert main(["extract", "--out", str(out), "--max-disk", "16K", *args]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if "draftsmith extract: error:" in x]
    assert len(lines) == 1 and lines[0].startswith(
        "draftsmith extract: error: --max-disk 16K (16,384 bytes) is too "
        "small to write even one shard, so nothing was written"
    ), lines
    err = lines[0]
    need = int(
        re.search(r"smallest first shard \(one sample, with its manifest entries\) needs ([\d,]+) bytes", err)
        .group(1)
        .replace(",", "")
    )
    smallest = re.search(r"the smallest --max-disk that lets extraction start is (\S+);", err).group(1)
    assert need > 16 * 1024 and re.search(r"bytes/token x [\d,]+ tokens", err)
    assert not out.exists()  # a directory this run made is removed again: no manifest, parts/ or stats left

    # the suggested budget does start it: at least one sample, within the budget, stopped part way (exit 0)
    assert main(["extract", "--out", str(out), "--max-disk", smallest, *args]) == 0
    m = load_manifest(out)
    assert m["covered_samples"] >= 1 and m["stopped"] and not m["complete"]
    assert sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) <= parse_size(smallest)
    assert validate(out)[1] == []


def test_offline_cache_redoes_deleted_shards_and_refuses_an_incomplete_extraction(
    tiny_target_dir, data_file, tmp_path, monkeypatch
):
    """data.features=offline without a dir: a shard deleted from the cache is extracted again by the next run; an
    extraction that covers fewer samples than the run has stops it with one paragraph, not a traceback."""
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    import draftsmith.train.features.extract as extract_mod
    from draftsmith.train.build import build_data_and_vocab, build_target
    from draftsmith.train.features.sources import ensure_offline_features

    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))
    cfg = _compose(overrides(tiny_target_dir, data_file, tmp_path / "run", "data.features=offline"))
    accelerator = Accelerator(mixed_precision="no", cpu=True)
    target, path = build_target(cfg.target, accelerator.device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    data, vocab = build_data_and_vocab(cfg, tokenizer, tmp_path / "run", log=lambda *a: None)
    logged = []

    def ensure():
        return ensure_offline_features(cfg, target, tokenizer, data, vocab, accelerator, log=logged.append)

    root = ensure()
    shard = load_manifest(root)["shards"][0]
    (Path(root) / shard["name"]).unlink()
    logged.clear()
    assert ensure() == root and any("extracting" in x for x in logged)
    assert load_manifest(root)["complete"] and validate(root)[1] == []
    logged.clear()
    assert ensure() == root and any("extracted earlier" in x for x in logged)

    (Path(root) / shard["name"]).unlink()
    real = extract_mod.extract
    monkeypatch.setattr(
        extract_mod,
        "extract",
        lambda *a, **kw: {**real(*a, **kw), "complete": False, "covered_samples": 0, "stopped": None},
    )
    with pytest.raises(
        ShardError,
        match=r"covered 0 of 32 training samples \(the extraction stopped early\), so "
        r"training did not start\. Run the same command again",
    ) as e:
        ensure()
    assert "\n" not in str(e.value)

"""Feature shards: `draftsmith extract` (resume, ranks, disk budget, validation) and training from them
(data.features=offline | stream) with the same losses as online and memory modes."""

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from safetensors.torch import save as st_save
from test_train import conversations

from draftsmith.train.features.shards import ShardError, load_manifest, validate

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "chats.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in conversations(40)))
    return path


def overrides(tiny_target_dir, data_file, out_dir, *extra) -> list[str]:
    """The tiny run of tests/test_train.py, in fp32 (no autocast) so every mode can be compared number for number."""
    return [
        "conf=eagle3_smollm2",
        f"target.name_or_path={tiny_target_dir}",
        "target.hidden_size=128",
        "target.num_hidden_layers=6",
        "target.vocab_size=49152",
        "target.aux_layer_ids=[1,3,4]",
        "target.dtype=float32",
        "mixed_precision=no",
        "data.features=online",
        f"data.path={data_file}",
        "data.also=[]",  # not the preset's code sets
        "data.num_conversations=32",
        "data.heldout=4",
        "data.max_length=96",
        "data.max_tokens_per_batch=512",
        "data.max_batch_size=4",
        "head.draft_vocab_size=512",
        "optim.max_steps=12",
        "optim.warmup_steps=2",
        "optim.max_minutes=null",
        "log_every=1",
        "eval_every=0",
        "save_every=0",
        "eval_batches=1",
        "wandb.mode=disabled",
        f"output_dir={out_dir}",
        *extra,
    ]


def train_in_process(args: list[str]) -> list[dict]:
    """train/run.py's build sequence and the one loop, in this process; returns the logged step records."""
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from draftsmith.train.build import build_data_and_vocab, build_head, build_target
    from draftsmith.train.config import compose_config as compose
    from draftsmith.train.loop import train

    cfg = compose(args)
    torch.manual_seed(cfg.seed)
    accelerator = Accelerator(mixed_precision="no", cpu=True)
    target, path = build_target(cfg.target, accelerator.device)
    data, vocab = build_data_and_vocab(
        cfg, AutoTokenizer.from_pretrained(path), Path(cfg.output_dir), log=lambda *a: None
    )
    train(cfg, build_head(cfg.head, target, vocab), target, data, accelerator)
    return [
        r for r in map(json.loads, (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()) if "loss" in r
    ]


def run_extract(args: list[str], out, **kw) -> dict:
    from draftsmith.train.config import compose_config as compose
    from draftsmith.train.features.extract import extract

    return extract(compose(args), out, log=lambda *a: None, **kw)


def sample_features(root) -> dict[int, dict]:
    """sample index -> its stored tensors, over every shard of a features dir."""
    out = {}
    for s in load_manifest(root)["shards"]:
        t = load_file(Path(root) / s["name"])
        off = t["offsets"].tolist()
        for r, i in enumerate(t["sample_index"].tolist()):
            out[i] = {k: t[k][off[r] : off[r + 1]] for k in ("input_ids", "loss_mask", "aux", "last")}
    return out


def test_every_feature_mode_trains_the_same_losses(tiny_target_dir, data_file, tmp_path):
    """online, memory, offline and stream give the same batch the same features, so the same losses.

    stream runs the target on the very batch the online loop would (same padding, same kernels): bit for bit.
    memory and offline run each sample once inside another group of samples (memory: the batch's unseen
    samples; offline: the extraction's length-sorted groups). A GEMM over another batch shape may sum in
    another order when it uses several threads, which moves fp32 features by ~1e-7 relative (with one
    thread they came out exact here). The losses follow the features about linearly: storing the features in
    bf16 (~4e-3 relative) moved them by ~5e-6 (the control below), so fp32 reordering stays ~4 orders of
    magnitude under atol=1e-6, while a bf16-sized perturbation, a wrong sample or a shifted position fails.
    """
    args = lambda name, *extra: overrides(tiny_target_dir, data_file, tmp_path / name, *extra)  # noqa: E731
    feats, feats_bf16 = tmp_path / "features", tmp_path / "features_bf16"
    summary = run_extract(args("x"), feats, shard_size="96K")
    assert summary["complete"] and summary["covered_samples"] == 32 and summary["new_tokens"] > 0
    assert len(load_manifest(feats)["shards"]) > 2  # several shards, so reads cross shard boundaries
    run_extract(args("x"), feats_bf16, shard_size="1M", dtype="bf16")

    online = train_in_process(args("online"))
    memory = train_in_process(args("memory", "data.features=memory"))
    offline = train_in_process(args("offline", "data.features=offline", f"data.features_dir={feats}"))
    budget = 2500 * 1024  # about two of the largest batches (512 tokens x 2 KB in fp32): the producer waits
    stream = train_in_process(args("stream", "data.features=stream", f"data.max_disk={budget}"))
    control = train_in_process(args("bf16", "data.features=offline", f"data.features_dir={feats_bf16}"))

    assert len(online) == 12 and max(r["epoch"] for r in online) >= 1  # the second epoch re-reads every sample
    loss = {
        name: torch.tensor([r["loss"] for r in recs], dtype=torch.float64)
        for name, recs in (
            ("online", online),
            ("memory", memory),
            ("offline", offline),
            ("stream", stream),
            ("bf16", control),
        )
    }
    assert torch.equal(loss["stream"], loss["online"])
    for name in ("memory", "offline"):
        torch.testing.assert_close(loss[name], loss["online"], rtol=0, atol=1e-6, msg=name)
    assert (loss["bf16"] - loss["online"]).abs().max() > 1e-6  # the tolerance does see a bf16-sized change
    assert offline[-1]["target_tokens"] == 0  # offline never ran the target on a training batch

    stats = json.loads((tmp_path / "stream" / "stream_features" / "rank-00000" / "stream_stats.json").read_text())
    assert stats["shards"] >= 11 and stats["resyncs"] == 0
    assert 0 < stats["peak_disk_bytes"] <= budget  # measured on the file system after every write
    assert not list((tmp_path / "stream" / "stream_features" / "rank-00000").glob("stream-*"))  # consumed and deleted


def test_extract_resumes_after_a_kill_without_duplicates(tiny_target_dir, data_file, tmp_path):
    args = overrides(tiny_target_dir, data_file, tmp_path / "x")
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    run_extract(args, clean, shard_size="64K")
    reference = sample_features(clean)

    # a real SIGKILL mid-extraction (one sample per shard, so the run is long enough to be hit)
    cmd = [sys.executable, "-m", "draftsmith.cli", "extract", "--out", str(killed), "--shard-size", "1K", *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    part = killed / "parts" / "rank-00000.json"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if part.is_file() and len(json.loads(part.read_text())["shards"]) >= 3:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert part.is_file(), proc.stderr.read().decode()[-2000:]
    # and the states a kill can leave that polling may not hit: a shard renamed into place but not yet in the
    # manifest (an orphan), and a torn temporary file
    body = json.loads(part.read_text())
    if len(body["shards"]) > 1:
        body["shards"] = body["shards"][:-1]
        (part).write_text(json.dumps(body))
        (killed / "manifest.json").write_text(
            json.dumps({**json.loads((killed / "manifest.json").read_text()), "shards": []})
        )
    (killed / ".tmp-shard-r00000-999999.safetensors-1").write_bytes(b"torn")
    before = load_manifest(killed)["covered_samples"]
    assert before < 32

    summary = run_extract(args, killed, shard_size="16K")
    assert summary["complete"] and summary["new_samples"] == 32 - before
    m = load_manifest(killed)
    listed = sorted(i for s in m["shards"] for i in s["samples"])
    assert listed == list(range(32))  # every sample exactly once
    assert {p.name for p in killed.glob("shard-*")} == {s["name"] for s in m["shards"]}  # orphan removed
    assert not list(killed.glob(".tmp-*"))
    got = sample_features(killed)
    for i, ref in reference.items():
        assert torch.equal(got[i]["input_ids"], ref["input_ids"]), i
        torch.testing.assert_close(got[i]["aux"], ref["aux"], rtol=0, atol=1e-5)  # other forward groups
        torch.testing.assert_close(got[i]["last"], ref["last"], rtol=0, atol=1e-5)
    assert validate(killed)[1] == []


def test_max_disk_stops_before_the_budget_records_coverage_and_resumes(tiny_target_dir, data_file, tmp_path):
    args = overrides(tiny_target_dir, data_file, tmp_path / "x")
    out = tmp_path / "f"
    budget = 1500 * 1024  # the full extraction in bf16 is ~3.1M (3k tokens x 1 KB)
    s = run_extract(args, out, max_disk=f"{budget // 1024}K", dtype="bf16", shard_size="64K")
    used = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert used <= budget and not s["complete"] and 0 < s["covered_samples"] < 32
    m = load_manifest(out)
    assert m["covered_samples"] == s["covered_samples"] and "--max-disk 1500K" in json.dumps(m["stopped"])
    assert m["dtype"] == "bf16" and m["bytes"] / m["covered_tokens"] < 2 * (3 * 128 + 128) + 16  # bf16 + ids/mask

    # training refuses an incomplete directory, and says how far it got
    from draftsmith.train.config import compose_config as compose

    with pytest.raises(
        ShardError, match=rf"covers {s['covered_samples']} of 32 training samples \(stopped: --max-disk"
    ):
        _feature_source(compose(args + ["data.features=offline", f"data.features_dir={out}"]))

    s2 = run_extract(args, out, max_disk="10M", dtype="bf16", shard_size="64K")
    assert s2["complete"] and s2["new_samples"] == 32 - s["covered_samples"] and not s2["stopped"]
    assert validate(out)[1] == []


def _feature_source(cfg):
    """build_feature_source for a composed run, without training."""
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from draftsmith.train.build import build_data_and_vocab, build_head, build_target
    from draftsmith.train.features.sources import build_feature_source
    from draftsmith.train.objective import build_objective

    accelerator = Accelerator(mixed_precision="no", cpu=True)
    target, path = build_target(cfg.target, accelerator.device)
    data, vocab = build_data_and_vocab(
        cfg, AutoTokenizer.from_pretrained(path), Path(cfg.output_dir), log=lambda *a: None
    )
    objective = build_objective(cfg.head)
    head = build_head(cfg.head, target, vocab)
    return build_feature_source(cfg, target, objective.vocab_ids(head), data, objective.family, accelerator)


def test_offline_refuses_features_of_another_run_naming_what_differs(tiny_target_dir, data_file, tmp_path):
    from draftsmith.train.config import compose_config as compose

    args = overrides(tiny_target_dir, data_file, tmp_path / "x")
    out = tmp_path / "f"
    run_extract(args + ["head=mlp", "head.ttt_decay=0.8"], out)  # an MLP speculator's: final hidden states only
    assert load_manifest(out)["fields"] == ["last"]
    use = ["data.features=offline", f"data.features_dir={out}"]
    mlp = _feature_source(compose(args + use + ["head=mlp"]))
    assert mlp.mode == "offline" and mlp.disk.manifest["complete"]
    cases = {
        "aux layer ids: extracted \\[1, 3, 4\\], this run uses \\[1, 2, 4\\]": [
            "target.aux_layer_ids=[1,2,4]",
            "head=mlp",
        ],
        "target dtype: extracted with a float32 target, this run's is bfloat16": ["target.dtype=bfloat16", "head=mlp"],
        "training samples: .*max_length: 96 -> 64": ["data.max_length=64", "head=mlp"],
        "head family: extracted for mlp_speculator .* also needs \\['aux'\\]": [],  # an EAGLE-3 run needs aux
    }
    for message, extra in cases.items():
        with pytest.raises(ShardError, match=message):
            _feature_source(compose(args + use + extra))
    # the command line says the same from `draftsmith extract --validate DIR <overrides>`
    from draftsmith.train.features.extract import run_validate

    assert run_validate(str(out), args + ["head=mlp"]) == 0
    assert run_validate(str(out), args + ["head=mlp", "data.max_length=64"]) == 1


def test_validate_names_the_bad_shard_and_sample(tiny_target_dir, data_file, tmp_path, capsys):
    args = overrides(tiny_target_dir, data_file, tmp_path / "x")
    out = tmp_path / "f"
    run_extract(args, out, shard_size="1M")
    m = load_manifest(out)
    assert validate(out)[1] == [] and len(m["shards"][1]["samples"]) > 2
    first, second = m["shards"][0], m["shards"][1]

    # a flipped byte: the checksum names the shard
    path = out / first["name"]
    blob = bytearray(path.read_bytes())
    blob[-5] ^= 0xFF
    path.write_bytes(bytes(blob))
    # a NaN written by a broken extraction (checksum consistent with the manifest): named down to the sample
    t = load_file(out / second["name"])
    row = 2
    t["aux"][t["offsets"][row] + 3, 7] = float("nan")
    meta = safe_open(str(out / second["name"]), "pt").metadata()
    new = st_save(t, metadata=meta)
    (out / second["name"]).write_bytes(new)
    for part in (out / "parts").glob("rank-*.json"):
        body = json.loads(part.read_text())
        for s in body["shards"]:
            if s["name"] == second["name"]:
                s["sha256"], s["bytes"] = hashlib.sha256(new).hexdigest(), len(new)
        part.write_text(json.dumps(body))

    from draftsmith.cli import main

    assert main(["extract", "--validate", str(out)]) == 1
    printed = capsys.readouterr().out
    assert f"{out / first['name']}: sha256 differs" in printed
    sample, conv = second["samples"][row], json.loads(meta["conv_ids"])[row]
    assert f"{out / second['name']}: sample {sample} (conversation {conv}) has non-finite aux at token 3" in printed
    assert "2 problem(s)" in printed


@pytest.mark.slow
def test_extract_under_accelerate_launch_two_cpu_processes(tiny_target_dir, data_file, tmp_path):
    """Two gloo processes: rank r extracts samples i % 2 == r into its own shards, and the manifest merges them."""
    args = overrides(tiny_target_dir, data_file, tmp_path / "x")
    out = tmp_path / "two"
    # `accelerate launch --cpu` starts one process whatever --num_processes says; torchrun + ACCELERATE_USE_CPU
    # gives gloo processes (on GPUs: accelerate launch --num_processes N -m draftsmith.cli extract ...)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "draftsmith.cli",
        "extract",
        "--out",
        str(out),
        "--shard-size",
        "32K",
        *args,
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    m = load_manifest(out)
    assert m["complete"] and {s["rank"] for s in m["shards"]} == {0, 1}
    for s in m["shards"]:
        assert all(i % 2 == s["rank"] for i in s["samples"]) and s["name"].startswith(f"shard-r{s['rank']:05d}-")
    assert sorted(i for s in m["shards"] for i in s["samples"]) == list(range(32))
    assert "tok/s (2 processes)" in proc.stdout + proc.stderr
    assert validate(out)[1] == []
    single = tmp_path / "one"
    run_extract(args, single)
    a, b = sample_features(out), sample_features(single)
    for i in range(32):
        torch.testing.assert_close(a[i]["aux"], b[i]["aux"], rtol=0, atol=1e-5)


def test_compressed_shards_read_back_exactly_and_train_the_same(tiny_target_dir, data_file, tmp_path):
    """--compress zlib: smaller on disk, bit for bit the same features when read (so the same losses), validated."""
    from draftsmith.train.features.shards import ShardStore, compress_field, decompress_field

    t = torch.randn(5, 7).to(torch.bfloat16)
    assert torch.equal(decompress_field(compress_field(t), [5, 7], torch.bfloat16), t)  # bit for bit

    args = overrides(tiny_target_dir, data_file, tmp_path / "x")
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    run_extract(args, plain, dtype="bf16")
    summary = run_extract(args, packed, dtype="bf16", compression="zlib")
    assert summary["complete"]
    m_plain, m_packed = load_manifest(plain), load_manifest(packed)
    assert m_packed["compression"] == "zlib" and m_plain["compression"] == "none"
    print(
        f"\nbf16 features: {m_plain['bytes']} bytes plain, {m_packed['bytes']} compressed "
        f"({m_packed['bytes'] / m_plain['bytes']:.3f})"
    )
    assert m_packed["bytes"] < 0.95 * m_plain["bytes"]
    a, b = ShardStore(plain), ShardStore(packed)
    for i in range(32):
        x, y = a.get(i), b.get(i)
        for k in ("input_ids", "loss_mask", "aux", "last"):
            assert torch.equal(x[k], y[k]), (i, k)
    assert validate(packed)[1] == []
    with pytest.raises(ShardError, match="compression: zlib there, none now"):  # no mixing in one directory
        run_extract(args, packed, dtype="bf16")

    # a damaged compressed field is named by validate
    name = m_packed["shards"][0]["name"]
    tensors = load_file(packed / name)
    with safe_open(str(packed / name), framework="pt") as h:
        meta = h.metadata()
    tensors["aux"] = tensors["aux"][: len(tensors["aux"]) // 2]
    blob = st_save(tensors, metadata=meta)
    (packed / name).write_bytes(blob)
    body = json.loads((packed / "parts" / "rank-00000.json").read_text())
    for s in body["shards"]:
        if s["name"] == name:
            s["bytes"], s["sha256"] = len(blob), hashlib.sha256(blob).hexdigest()
    (packed / "parts" / "rank-00000.json").write_text(json.dumps(body))
    problems = validate(packed)[1]
    assert any(name in p and "aux does not decompress" in p for p in problems), problems


def test_offline_without_a_dir_extracts_once_into_the_cache_then_reuses(tiny_target_dir, data_file, tmp_path):
    """data.features=offline and no features_dir: the run extracts its own features before its clock starts, keyed
    by target and samples under the cache; a second run with the same data reads them back and logs the same losses."""

    def run(name, *extra, cache="cache"):
        env = {**os.environ, "DRAFTSMITH_CACHE": str(tmp_path / cache), "WANDB_MODE": "disabled"}
        args = overrides(
            tiny_target_dir,
            data_file,
            tmp_path / name,
            "data.features=offline",
            "data.features_dtype=bf16",
            "optim.max_steps=4",
            *extra,
        )
        proc = subprocess.run(
            [sys.executable, str(ROOT / "train" / "run.py"), *args],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        recs = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return proc.stdout, [r for r in recs if "loss" in r]

    out_a, a = run("a")
    dirs = list((tmp_path / "cache" / "features").iterdir())
    assert len(dirs) == 1 and dirs[0].name.endswith("-eagle3-bf16"), dirs
    assert f"extracting the target's features for 32 training and 4 held-out samples once, into {dirs[0]}" in out_a
    manifest = load_manifest(dirs[0])
    assert manifest["complete"] and manifest["dtype"] == "bf16" and manifest["covered_samples"] == 32
    held = load_manifest(dirs[0] / "heldout")  # held-out features, with the target's argmax, beside them
    assert held["complete"] and held["covered_samples"] == 4 and "top" in held["fields"]
    out_b, b = run("b")
    assert f"features: extracted earlier, {dirs[0]}" in out_b and "extracting" not in out_b
    assert "loading the whole target" in out_a and "loading the whole target" not in out_b  # b: the ends only
    assert [r["loss"] for r in a] == [r["loss"] for r in b] and len(a) == 4
    assert a[-1]["target_tokens"] == 0 and b[-1]["target_tokens"] == 0
    assert f"features_dir: {dirs[0]}" in (tmp_path / "b" / "config.yaml").read_text()  # the run records where they were

    # an MLP speculator on the same samples reads the EAGLE-3 extraction (it holds the final hidden states) and
    # trains exactly as on an extraction of its own, which holds nothing else
    mlp = ("head=mlp", "head.inner_dim=64", "head.draft_vocab_size=512", "head.init=random")  # not the preset's output
    out_c, c = run("c", *mlp)
    assert f"features: extracted earlier for eagle3 heads, which store this head's too, {dirs[0]}" in out_c
    assert "extracting" not in out_c and c[-1]["target_tokens"] == 0
    out_d, d = run("d", *mlp, cache="cache_mlp")
    own = list((tmp_path / "cache_mlp" / "features").iterdir())
    assert "extracting" in out_d and len(own) == 1 and own[0].name.endswith("-mlp_speculator-bf16")
    assert load_manifest(own[0])["fields"] == ["last"]
    assert [r["loss"] for r in c] == pytest.approx([r["loss"] for r in d], rel=1e-5) and len(c) == 4


def test_features_of_more_aux_layers_train_a_run_on_some_of_them(tiny_target_dir, data_file, tmp_path):
    """One extraction with a superset of aux layers serves a run on any of them: the reader takes the run's columns,
    in the run's order, so its features, losses and held-out eval equal those of an extraction of exactly its
    layers; ids outside the superset, and resuming an extraction with other ids, are refused by name."""
    from draftsmith.train.config import compose_config as compose
    from draftsmith.train.features.shards import ShardStore

    args = lambda name, *extra: overrides(tiny_target_dir, data_file, tmp_path / name, *extra)  # noqa: E731
    wide, exact = tmp_path / "wide", tmp_path / "exact"
    run_extract(args("x", "target.aux_layer_ids=[0,1,2,3,4]"), wide, shard_size="96K")
    run_extract(args("x"), exact, shard_size="1M")  # the run's own ids, [1, 3, 4]
    assert load_manifest(wide)["aux_dim"] == 5 * 128 and load_manifest(exact)["aux_dim"] == 3 * 128
    for sub in ("", "heldout"):
        a, b = ShardStore(wide / sub, aux_layer_ids=[1, 3, 4]), ShardStore(exact / sub)
        assert a.where.keys() == b.where.keys() and len(a.where) in (32, 4)
        for i in a.where:
            assert torch.equal(a.get(i)["aux"], b.get(i)["aux"])
        assert not torch.equal(ShardStore(wide / sub, aux_layer_ids=[1, 2, 4]).get(0)["aux"], b.get(0)["aux"])

    with_eval = ("data.features=offline", "eval_every=6", "eval_batches=2")
    from_wide = train_in_process(args("wide_run", *with_eval, f"data.features_dir={wide}"))
    from_exact = train_in_process(args("exact_run", *with_eval, f"data.features_dir={exact}"))
    assert [r["loss"] for r in from_wide] == [r["loss"] for r in from_exact] and len(from_wide) == 12

    def evals(name):
        rows = map(json.loads, (tmp_path / name / "metrics.jsonl").read_text().splitlines())
        return [(r["step"], r["eval/loss"], r["eval/acc"]) for r in rows if "eval/acc" in r]

    assert evals("wide_run") == evals("exact_run") and len(evals("wide_run")) == 2
    assert from_wide[-1]["target_tokens"] == 0

    use = ["data.features=offline", f"data.features_dir={wide}"]
    with pytest.raises(ShardError, match=r"extracted \[0, 1, 2, 3, 4\], this run uses \[1, 3, 5\] \(features extr"):
        _feature_source(compose(args("y", *use, "target.aux_layer_ids=[1,3,5]")))
    with pytest.raises(ShardError, match=r"(?s)another extraction.*aux layer ids: extracted \[0, 1, 2, 3, 4\]"):
        run_extract(args("x"), wide)  # adding shards of other layers to it would mix widths


@pytest.mark.slow
def test_vllm_backend_writes_the_hf_backends_features(tiny_target_dir, data_file, tmp_path):
    """`draftsmith extract --backend vllm`: the serving engine's prefill gives the same shards as the HF forward (the
    same samples, fingerprint and token rows; the states equal within float rounding: vLLM's kernels sum in another
    order), held-out argmax included, and an offline run trains from them."""
    args = overrides(tiny_target_dir, data_file, tmp_path / "run")
    hf = tmp_path / "hf"
    run_extract(args, hf, shard_size="64K")
    vl = tmp_path / "vllm"
    env = {**os.environ, "OMP_NUM_THREADS": "2", "WANDB_MODE": "disabled"}
    cmd = [
        sys.executable,
        "-m",
        "draftsmith.cli",
        "extract",
        "--backend",
        "vllm",
        "--out",
        str(vl),
        "--shard-size",
        "64K",
    ]
    p = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert "vLLM engine ready" in p.stdout + p.stderr and ") with vllm;" in p.stdout + p.stderr
    for sub in ("", "heldout"):
        a, b = load_manifest(hf / sub), load_manifest(vl / sub)
        assert a["fingerprint"] == b["fingerprint"] and a["complete"] and b["complete"]
        assert a["covered_samples"] == b["covered_samples"] and a["covered_tokens"] == b["covered_tokens"]
    fa, fb = sample_features(hf), sample_features(vl)
    assert fa.keys() == fb.keys() and len(fa) == 32
    worst = {"aux": 0.0, "last": 0.0}
    for i in fa:
        assert torch.equal(fa[i]["input_ids"], fb[i]["input_ids"]) and torch.equal(
            fa[i]["loss_mask"], fb[i]["loss_mask"]
        )
        for k in worst:
            x, y = fa[i][k].float(), fb[i][k].float()
            worst[k] = max(worst[k], ((x - y).norm(dim=-1) / x.norm(dim=-1).clamp_min(1e-6)).max().item())
    print(f"\nlargest per-token relative difference, vLLM vs HF (fp32): {worst}")
    assert worst["aux"] < 1e-3 and worst["last"] < 1e-3, worst
    ta = torch.cat([load_file(hf / "heldout" / s["name"])["top"] for s in load_manifest(hf / "heldout")["shards"]])
    tb = torch.cat([load_file(vl / "heldout" / s["name"])["top"] for s in load_manifest(vl / "heldout")["shards"]])
    assert ta.shape == tb.shape and (ta == tb).float().mean().item() >= 0.99
    steps = train_in_process(args + ["data.features=offline", f"data.features_dir={vl}", "optim.max_steps=3"])
    assert len(steps) == 3 and all(math.isfinite(r["loss"]) for r in steps)


@pytest.mark.slow
def test_a_run_with_the_vllm_backend_extracts_in_a_child_and_trains_as_hf(tiny_target_dir, data_file, tmp_path):
    """data.features=offline, data.features_backend=vllm, no features_dir: the run's own extraction goes through vLLM
    in a process of its own (the engine would bind the training process's threads) and the run then trains the
    losses the HF backend's features give."""

    def run(name, backend):
        env = {**os.environ, "DRAFTSMITH_CACHE": str(tmp_path / f"cache_{backend}"), "WANDB_MODE": "disabled"}
        args = overrides(
            tiny_target_dir, data_file, tmp_path / name, "data.features=offline", f"data.features_backend={backend}",
            "optim.max_steps=4",
        )  # fmt: skip
        p = subprocess.run(
            [sys.executable, str(ROOT / "train" / "run.py"), *args],
            capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
        recs = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in recs if "loss" in r], p.stdout + p.stderr

    vl, log = run("vllm", "vllm")
    assert "vLLM engine ready" in log and ") with vllm;" in log
    hf, _ = run("hf", "hf")
    assert len(vl) == len(hf) == 4
    assert vl == pytest.approx(hf, rel=1e-4), (vl, hf)


def test_vllm_calls_cut_a_shard_so_its_progress_moves():
    """A shard's samples go to vLLM in calls of about `tokens` tokens, in order, none lost or repeated (the bar moves
    after each call: a whole 58k-token shard took ~3 silent minutes on a slow 2-core machine)."""
    from types import SimpleNamespace

    from draftsmith.train.features.extract import call_groups

    lengths = [300, 900, 4000, 100, 100, 2000, 2100, 50]
    samples = [SimpleNamespace(input_ids=[0] * n) for n in lengths]
    indices = [7, 0, 1, 2, 3, 4, 5, 6]
    groups = call_groups(samples, indices, 2048)
    assert [i for g in groups for i in g] == indices
    assert groups == [[7, 0, 1], [2], [3, 4], [5], [6]]
    for g in groups:  # within the budget, or one sample that alone is longer
        assert sum(lengths[i] for i in g) <= 2048 or len(g) == 1
    assert call_groups(samples, [], 2048) == []

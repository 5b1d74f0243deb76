"""Offline training keeps the target off the training rank: only its embedding, final norm and the draft vocab's
lm_head rows are loaded (TargetEnds), held-out eval reads stored features, and every figure equals the run that
holds the whole target."""

import json
from pathlib import Path

import torch
from test_extract import data_file, overrides, run_extract  # noqa: F401 (data_file is a fixture)

from draftsmith.train.features.shards import load_manifest
from draftsmith.train.target import Target, TargetEnds


def train_logged(args: list[str], ends_only: bool) -> tuple[list[dict], object]:
    """train/run.py's sequence in this process (the target whole or its ends only); every logged record."""
    from accelerate import Accelerator

    from draftsmith.train.build import build_head, build_run
    from draftsmith.train.config import compose_config
    from draftsmith.train.loop import train

    cfg = compose_config(args)
    torch.manual_seed(cfg.seed)
    accelerator = Accelerator(mixed_precision="no", cpu=True)
    target, _, data, vocab = build_run(cfg, accelerator.device, Path(cfg.output_dir), lambda *a: None, ends_only)
    train(cfg, build_head(cfg.head, target, vocab), target, data, accelerator)
    return [json.loads(x) for x in (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()], target


def test_target_ends_read_the_same_tensors_and_fingerprint(tiny_target_dir):
    whole = Target.from_pretrained(str(tiny_target_dir), [1, 3, 4])
    ends = TargetEnds(str(tiny_target_dir), [1, 3, 4])
    ids = torch.tensor([7, 49151, 0, 300, 7])
    assert torch.equal(ends.output_weight(ids), whole.output_weight(ids))
    assert torch.equal(ends.embed_tokens.weight, whole.embed_tokens.weight)
    assert torch.equal(ends.norm.weight, whole.norm.weight)
    a, b = list(whole.weight_ends()), list(ends.weight_ends())
    assert [(n, s) for n, s, _ in a] == [(n, s) for n, s, _ in b] and all(
        torch.equal(x, y) for (*_, x), (*_, y) in zip(a, b)
    )
    held = sum(p.numel() for p in ends.parameters())
    assert held == whole.embed_tokens.weight.numel() + whole.norm.weight.numel()  # no decoder layer
    layers = sum(p.numel() for p in whole.model.model.layers.parameters())
    assert sum(p.numel() for p in whole.model.parameters()) - held == layers  # what stays off the rank


def test_offline_training_on_the_target_ends_equals_the_whole_target(tiny_target_dir, data_file, tmp_path):  # noqa: F811
    args = lambda name, *extra: overrides(tiny_target_dir, data_file, tmp_path / name, "eval_every=4", *extra)  # noqa: E731
    feats = tmp_path / "features"
    summary = run_extract(args("x"), feats)
    held = load_manifest(feats / "heldout")
    assert summary["heldout"]["complete"] and held["covered_samples"] == 4 and held["fields"] == ["aux", "last", "top"]

    offline = ["data.features=offline", f"data.features_dir={feats}"]
    online_logs, _ = train_logged(args("online"), ends_only=False)
    ends_logs, ends = train_logged(args("ends", *offline), ends_only=True)
    assert isinstance(ends, TargetEnds)

    def figures(logs, key):
        return torch.tensor([r[key] for r in logs if key in r], dtype=torch.float64)

    torch.testing.assert_close(figures(ends_logs, "loss"), figures(online_logs, "loss"), rtol=0, atol=1e-6)
    evals = [(r["eval/acc"], r["eval/loss"], r["eval/sim_accept_len"]) for r in online_logs if "eval/acc" in r]
    from_disk = [(r["eval/acc"], r["eval/loss"], r["eval/sim_accept_len"]) for r in ends_logs if "eval/acc" in r]
    assert len(evals) == len(from_disk) == 3  # steps 4, 8, 12
    for (acc_a, loss_a, sim_a), (acc_b, loss_b, sim_b) in zip(evals, from_disk):
        assert acc_a == acc_b  # the stored argmax is the target's
        assert abs(loss_a - loss_b) < 1e-5 and abs(sim_a - sim_b) < 1e-6
    assert ends_logs[-2]["target_tokens"] == 0


def test_stream_training_on_the_target_ends_equals_online_bit_for_bit(tiny_target_dir, data_file, tmp_path):  # noqa: F811
    """data.features=stream: the target runs in a producer process, the training process holds its ends only, and
    every loss and held-out figure equals the online run's exactly (same batches, same kernels, same threads)."""
    import os

    args = lambda name, *extra: overrides(tiny_target_dir, data_file, tmp_path / name, "eval_every=4", *extra)  # noqa: E731
    online_logs, _ = train_logged(args("online"), ends_only=False)
    stream_logs, ends = train_logged(args("stream", "data.features=stream", "data.max_disk=3M"), ends_only=True)
    assert isinstance(ends, TargetEnds)
    for key in ("loss", "eval/acc", "eval/loss", "eval/sim_accept_len"):
        a = [r[key] for r in online_logs if key in r]
        b = [r[key] for r in stream_logs if key in r]
        assert a == b and a, key
    root = tmp_path / "stream" / "stream_features" / "rank-00000"
    stats = json.loads((root / "stream_stats.json").read_text())
    assert stats["pid"] != os.getpid() and stats["shards"] >= 11  # computed in the producer process
    assert stats["target_tokens"] >= stream_logs[-2]["target_tokens"] > 0  # (it also ran ahead past the end)
    assert not list(root.glob("stream-*")) and not list(root.glob("heldout-*"))  # consumed and deleted

"""MLP speculator end to end on a tiny target: stage 1 -> stage 2 (the target's continuations) -> resume -> export."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from test_train import data_file  # noqa: F401  (the module-scoped fixture)

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "train" / "run.py"


def run_mlp(tiny_target_dir, data_file, out_dir, *overrides, cache=None):
    args = [
        sys.executable,
        str(RUN),
        "conf=mlp_smollm2",
        f"target.name_or_path={tiny_target_dir}",
        "target.hidden_size=128",
        "target.num_hidden_layers=6",
        "target.vocab_size=49152",
        "target.aux_layer_ids=[1,3,4]",
        f"data.path={data_file}",
        "data.num_conversations=32",
        "data.heldout=4",
        "data.max_length=96",
        "data.max_tokens_per_batch=512",
        "data.max_batch_size=4",
        "head.inner_dim=64",
        "head.init=random",
        "optim.max_steps=6",
        "optim.warmup_steps=2",
        "optim.max_minutes=null",
        "log_every=1",
        "eval_every=3",
        "save_every=3",
        "keep_checkpoints=3",
        "eval_batches=1",
        "stage2.num_prompts=8",
        "stage2.prompt_tokens=16",
        "stage2.max_tokens=12",
        "stage2.backend=hf",
        "wandb.mode=disabled",
        f"output_dir={out_dir}",
        *overrides,
    ]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    if cache:
        env["DRAFTSMITH_CACHE"] = str(cache)
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, cwd=out_dir.parent)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def test_two_stages_resume_and_export(tiny_target_dir, data_file, tmp_path, smollm2_dir):  # noqa: F811
    cache = tmp_path / "cache"
    (cache / "targets").mkdir(parents=True)
    (cache / "targets" / "SmolLM2-135M-Instruct").symlink_to(smollm2_dir)
    s1 = tmp_path / "stage1"
    run_mlp(tiny_target_dir, data_file, s1, cache=cache)
    logs = [json.loads(x) for x in (s1 / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in logs if "loss" in r]
    assert len(train) == 6 and all(len(r["losses"]) == 3 and len(r["acc"]) == 3 for r in train)  # per head
    assert any(len(r.get("eval/acc", [])) == 3 for r in logs)
    meta = json.loads(sorted((s1 / "checkpoints").glob("step_*"))[-1].joinpath("head.json").read_text())
    assert meta["family"] == "mlp_speculator" and meta["config"]["inner_dim"] == 64

    # stage 2 starts from stage 1's weights and trains on the target's own continuations (generated once, cached)
    s2 = tmp_path / "stage2"
    proc = run_mlp(tiny_target_dir, data_file, s2, "head.stage=2", f"head.init_from={s1}", cache=cache)
    assert "stage 2: 8 prompts" in proc.stdout and len(list((cache / "generated").glob("*.json"))) == 1
    a = load_file(s2 / "checkpoints" / "step_00000006" / "head.safetensors")
    first = load_file(s1 / "checkpoints" / "step_00000006" / "head.safetensors")
    s2_start = load_file(s2 / "checkpoints" / "step_00000003" / "head.safetensors")
    assert not torch.equal(first["head.0.weight"], a["head.0.weight"])
    assert (s2_start["head.0.weight"] - first["head.0.weight"]).abs().max() < 0.1  # continued, not re-initialised

    # resume stage 2 from its step-3 checkpoint: the continuations come from the cache, step 6 is bit-identical
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(s2 / "checkpoints" / "step_00000003", resumed / "checkpoints" / "step_00000003")
    proc = run_mlp(
        tiny_target_dir, data_file, resumed, "head.stage=2", f"head.init_from={s1}", "resume=auto", cache=cache
    )
    assert "resumed from" in proc.stdout and "read from cache" in proc.stdout
    assert "(recorded in " in proc.stdout  # stage 2's precision, not a new timed probe's (which may answer otherwise)
    c = load_file(resumed / "checkpoints" / "step_00000006" / "head.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], c[k], rtol=0, atol=0, msg=k)

    from draftsmith.cli import main

    assert main(["export", "--format", "vllm", str(s2), str(tmp_path / "exported")]) == 0
    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert config["model_type"] == "mlp_speculator" and config["n_predict"] == 3 and config["emb_dim"] == 128
    tensors = load_file(tmp_path / "exported" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(tensors["speculator." + k], a[k], rtol=0, atol=0)


def test_draft_vocab_from_stored_features(tiny_target_dir, data_file, tmp_path):  # noqa: F811
    """head.draft_vocab_size=N on stored final hidden states: heads of N rows, their map in the checkpoint, the
    export and the reference decoder, which emits only the map's target ids."""
    from transformers import AutoConfig

    from draftsmith.eval.reference_decoder import MLPSpeculatorDrafter
    from draftsmith.export.mlp import VOCAB_FILE, read_export
    from draftsmith.train.checkpoint import head_from_state
    from draftsmith.train.heads import families

    out = tmp_path / "reduced"
    proc = run_mlp(
        tiny_target_dir,
        data_file,
        out,
        "head.draft_vocab_size=512",
        "data.features=offline",
        "data.features_dtype=fp32",
        cache=tmp_path / "cache",
    )
    assert "draft vocab 512 covers" in proc.stdout and "features: extracting" in proc.stdout
    w = load_file(out / "checkpoints" / "step_00000006" / "head.safetensors")
    assert w["head.0.weight"].shape == (512, 64) and w["emb.0.weight"].shape == (49152, 64)
    ids = torch.arange(512) + w["d2t"]
    assert bool((ids[1:] > ids[:-1]).all()) and int(w["t2d"].sum()) == 512

    from draftsmith.cli import main

    assert main(["export", "--format", "vllm", str(out), str(tmp_path / "exported")]) == 0
    assert (tmp_path / "exported" / VOCAB_FILE).is_file()
    config, state = read_export(tmp_path / "exported")
    head = head_from_state(families.get("mlp_speculator"), config, state, "export")
    assert torch.equal(head.draft_to_target, ids)
    tc = AutoConfig.from_pretrained(tiny_target_dir)
    drafter = MLPSpeculatorDrafter(head)
    drafter.last, drafter.last_pos = torch.randn(tc.hidden_size), 2
    assert set(drafter.propose([5, 6, 7, 8], 3, 0.0, None).tokens) <= set(ids.tolist())

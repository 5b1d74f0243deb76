"""Data parallelism preserves the math: 2 processes (gloo, CPU) train exactly what 1 process with 2 micro-batches does.

The global batch of an optimizer step is processes x optim.grad_accum micro-batches, and the loss is the mean
over all of its supervised tokens (not a mean of per-rank means, which weighs a short micro-batch's tokens
more). Both runs therefore compute the same sums; the only possible difference is float reassociation in the
gradient all-reduce, which for 2 ranks is a single commutative addition: we measured the two loss curves and
final weights bit-identical, and allow 1e-6 relative for other reduction orders.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "train" / "run.py"


def chats(n: int) -> list[dict]:
    topics = ["the sea", "a red fox", "prime numbers", "tea", "the moon", "rivers", "old maps", "bicycles"]
    return [
        {
            "id": f"c{i}",
            "conversations": [
                {"from": "human", "value": f"Tell me something about {topics[i % 8]}, please ({i})."},
                # answers of different lengths: ranks see different token counts, which a per-rank mean would get wrong
                {"from": "gpt", "value": f"Here is a fact about {topics[i % 8]}: it is remarkable. " * (1 + i % 4)},
                {"from": "human", "value": "And one more?"},
                {"from": "gpt", "value": f"Another fact: {topics[i % 8]} appears in many stories."},
            ],
        }
        for i in range(n)
    ]


def tiny_args(target_dir, data_file, out_dir, *overrides) -> list[str]:
    return [
        "conf=eagle3_smollm2",
        f"target.name_or_path={target_dir}",
        "target.hidden_size=128",
        "target.num_hidden_layers=6",
        "target.vocab_size=49152",
        "target.aux_layer_ids=[1,3,4]",
        f"data.path={data_file}",
        "data.also=[]",  # not the preset's code sets
        "data.num_conversations=32",
        "data.heldout=4",
        "data.max_length=96",
        "data.max_tokens_per_batch=256",
        "data.max_batch_size=4",
        "head.draft_vocab_size=512",
        "data.features=online",
        "optim.max_steps=6",
        "optim.warmup_steps=2",
        "optim.max_minutes=null",
        "optim.max_tokens=null",
        "log_every=1",
        "eval_every=0",
        "save_every=0",
        "eval_batches=1",
        "wandb.mode=disabled",
        "mixed_precision=no",
        # the target's dtype and Muon's Newton-Schulz dtype follow fast_bf16; a timed probe in each of two runs
        # that are compared with each other could answer differently, so both take fp32
        "fast_bf16=false",
        f"output_dir={out_dir}",
        *overrides,
    ]


def env() -> dict:
    return {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}


def curve(run_dir: Path) -> list[tuple[float, int]]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["loss"], r["tokens"]) for r in recs if "loss" in r]


def test_two_processes_equal_one_process_with_two_micro_batches(tiny_target_dir, tmp_path):
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in chats(40)))
    one, two = tmp_path / "one", tmp_path / "two"
    p1 = subprocess.run(
        [sys.executable, str(RUN), *tiny_args(tiny_target_dir, data, one, "optim.grad_accum=2")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env(),
        cwd=tmp_path,
    )
    assert p1.returncode == 0, p1.stderr[-3000:]
    # accelerate launch --cpu always starts one process; torchrun + ACCELERATE_USE_CPU gives gloo data parallel
    p2 = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(RUN),
            *tiny_args(tiny_target_dir, data, two),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env(),
        cwd=tmp_path,
    )
    assert p2.returncode == 0, p2.stderr[-3000:]
    a, b = curve(one), curve(two)
    assert len(a) == len(b) == 6
    assert [t for _, t in a] == [t for _, t in b]  # the same global batches, token for token
    assert a[-1][0] < a[0][0]  # it trained
    worst = max(abs(la - lb) / abs(la) for (la, _), (lb, _) in zip(a, b))
    print(
        f"\n1 process x 2 micro-batches: {[round(la, 6) for la, _ in a]}\n2 processes x 1 micro-batch: "
        f"{[round(lb, 6) for lb, _ in b]}\nlargest relative loss difference {worst:.2e}"
    )
    assert worst <= 1e-6, (a, b)
    wa = load_file(one / "checkpoints" / "step_00000006" / "head.safetensors")
    wb = load_file(two / "checkpoints" / "step_00000006" / "head.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-6, atol=1e-7, msg=k)


def test_global_batch_split_and_token_mean():
    """Unit level: rank r's micro-batches interleave into the 1-process order; the loss uses global counts."""
    from types import SimpleNamespace

    from draftsmith.train.data.dataset import epoch_batches
    from draftsmith.train.data.render import Sample
    from draftsmith.train.objective import supervised_counts

    samples = [Sample(input_ids=list(range(5 + i % 7)), loss_mask=[0, 0] + [1] * (3 + i % 7)) for i in range(50)]
    data = SimpleNamespace(train=samples)
    cfg = lambda accum: SimpleNamespace(
        data=SimpleNamespace(max_tokens_per_batch=40, max_batch_size=4, seed=0), optim=SimpleNamespace(grad_accum=accum)
    )
    single = epoch_batches(data, cfg(2), 0, 0, 1)
    r0, r1 = epoch_batches(data, cfg(1), 0, 0, 2), epoch_batches(data, cfg(1), 0, 1, 2)
    assert len(single) % 2 == 0 and len(r0) == len(r1) == len(single) // 2
    for s in range(len(r0)):  # step s: the same set of micro-batches either way
        assert sorted(single[2 * s : 2 * s + 2]) == sorted([r0[s], r1[s]])
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=torch.float32)
    assert supervised_counts(mask, 2).tolist() == [5.0, 3.0]  # rows whose token t+2 / t+3 is supervised


def test_micro_batch_losses_sum_to_the_global_token_mean(tiny_model):
    """Sum over micro-batches of the loss with global denominators == the loss of one batch holding them all,
    in value and gradient; a mean of per-micro-batch means (what DDP averaging of local means gives) is not."""
    from draftsmith.train.objective import supervised_counts
    from draftsmith.train.target import Target
    from draftsmith.train.ttt.unroll import ttt_unroll

    sys.path.insert(0, str(Path(__file__).parent))
    from test_eagle3 import tiny_head

    head = tiny_head(tiny_model, draft_vocab_size=64)
    target = Target(tiny_model, [1, 3, 4])
    torch.manual_seed(1)
    ids = torch.randint(0, 128, (2, 16))
    mask = torch.zeros(2, 16)
    mask[0, 12:] = 1  # 4 supervised tokens
    mask[1, 3:] = 1  # 13
    feats = target.features(ids)
    params = [p for p in head.parameters() if p.requires_grad]

    def grads(loss):
        return torch.autograd.grad(loss, params)

    whole = ttt_unroll(head, feats.aux, feats.logits, ids, mask, steps=3, decay=0.8)
    denoms = supervised_counts(mask, 3)
    parts = [
        ttt_unroll(
            head, feats.aux[b : b + 1], feats.logits[b : b + 1], ids[b : b + 1], mask[b : b + 1], 3, 0.8, denoms=denoms
        )
        for b in range(2)
    ]
    torch.testing.assert_close(parts[0].loss + parts[1].loss, whole.loss)
    for k in range(3):
        torch.testing.assert_close(parts[0].losses[k] + parts[1].losses[k], whole.losses[k])
        torch.testing.assert_close(parts[0].accs[k] + parts[1].accs[k], whole.accs[k])
    for gw, g0, g1 in zip(grads(whole.loss), grads(parts[0].loss), grads(parts[1].loss)):
        torch.testing.assert_close(g0 + g1, gw, rtol=1e-5, atol=1e-7)
    local = [
        ttt_unroll(head, feats.aux[b : b + 1], feats.logits[b : b + 1], ids[b : b + 1], mask[b : b + 1], 3, 0.8)
        for b in range(2)
    ]
    assert abs((local[0].loss + local[1].loss).item() / 2 - whole.loss.item()) > 1e-3  # mean of means differs


FSDP_ENV = {  # what `accelerate launch --config_file conf/accelerate/fsdp.yaml` sets for its processes
    "ACCELERATE_USE_FSDP": "true",
    "FSDP_VERSION": "2",
    "FSDP_RESHARD_AFTER_FORWARD": "true",
    "FSDP_AUTO_WRAP_POLICY": "NO_WRAP",
    "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT",
}


def two_processes(args, cwd, extra_env=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(RUN), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**env(), **(extra_env or {})}, cwd=cwd)


def test_fsdp_equals_ddp_and_resumes_exactly(tiny_target_dir, tmp_path):
    """FSDP2 over 2 CPU processes (gloo) trains what DDP trains, 20 steps, and a run resumed from its step-10
    checkpoint continues it exactly (weights and AdamW state gathered into the checkpoint, scattered back)."""
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in chats(80)))
    steps = ["optim.max_steps=20", "save_every=10", "keep_checkpoints=3", "optim.name=adamw", "optim.lr=3e-3"]
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    p = two_processes(tiny_args(tiny_target_dir, data, ddp, *steps), tmp_path)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    assert "FSDP2 on CPU" not in p.stdout + p.stderr
    p = two_processes(tiny_args(tiny_target_dir, data, fsdp, *steps), tmp_path, FSDP_ENV)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    assert "FSDP2 on CPU (gloo)" in p.stdout + p.stderr  # it really sharded (accelerate alone would run DDP)
    a, b = curve(ddp), curve(fsdp)
    assert len(a) == len(b) == 20 and [t for _, t in a] == [t for _, t in b]
    assert a[-1][0] < a[0][0]
    worst = max(abs(la - lb) / abs(la) for (la, _), (lb, _) in zip(a, b))
    print(
        f"\nDDP  {[round(x, 5) for x, _ in a]}\nFSDP {[round(x, 5) for x, _ in b]}\nlargest relative diff {worst:.2e}"
    )
    assert worst <= 1e-4, (a, b)
    evals = [
        [r for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines()) if "eval/loss" in r]
        for d in (ddp, fsdp)
    ]  # held-out eval calls the sharded head whole (gathered), and gets what DDP's whole head gets
    assert len(evals[0]) == len(evals[1]) == 1
    assert evals[0][0]["eval/loss"] == pytest.approx(evals[1][0]["eval/loss"], rel=1e-5)
    final = "checkpoints/step_00000020/head.safetensors"
    wa, wb = load_file(ddp / final), load_file(fsdp / final)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-3, atol=1e-5, msg=k)

    # resume: the run as a kill after step 10's checkpoint would leave it, continued under FSDP
    resumed = tmp_path / "resumed"
    shutil.copytree(fsdp, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_00000020")
    p = two_processes(tiny_args(tiny_target_dir, data, resumed, *steps, "resume=auto"), tmp_path, FSDP_ENV)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    assert "resumed from" in p.stdout + p.stderr
    c = curve(resumed)
    assert [t for _, t in c] == [t for _, t in b]
    assert c == b, (b, c)  # every loss after the resume as in the uninterrupted run, bit for bit
    wc = load_file(resumed / final)
    for k in wb:
        assert torch.equal(wb[k], wc[k]), k
    oa = torch.load(fsdp / "checkpoints/step_00000020/trainer.pt", weights_only=False)["optimizer"]
    oc = torch.load(resumed / "checkpoints/step_00000020/trainer.pt", weights_only=False)["optimizer"]
    assert oa["state"].keys() == oc["state"].keys() and len(oa["state"]) > 0
    for name, st in oa["state"].items():
        for key, v in st.items():
            assert torch.equal(v, oc["state"][name][key]), (name, key)

    # a checkpoint saved under FSDP is not resumed under DDP (its optimizer state is keyed by name), and says so
    p = two_processes(tiny_args(tiny_target_dir, data, resumed, *steps, "optim.max_steps=30", "resume=auto"), tmp_path)
    assert p.returncode != 0
    # our paragraph, from each rank; the only traceback is torchrun's own report of a failed child
    assert "train: error:" in p.stderr and "saved by a run under FSDP" in p.stderr, p.stderr[-3000:]
    assert f'File "{ROOT / "train"}' not in p.stderr and f'File "{ROOT / "draftsmith"}' not in p.stderr


def test_deepspeed_on_cpu_is_refused_and_fsdp_is_asked_for(monkeypatch):
    """A DeepSpeed launch without a GPU gets one paragraph (accelerate would start no process group); a launch that
    asks for no FSDP is left as it is."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from draftsmith.errors import ConfigError
    from draftsmith.train.sharded import use_fsdp_on_cpu

    acc = SimpleNamespace(device=torch.device("cpu"), state=SimpleNamespace(distributed_type=DistributedType.NO))
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ConfigError, match="fsdp.yaml"):
        use_fsdp_on_cpu(acc)
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert use_fsdp_on_cpu(acc) is False and acc.state.distributed_type == DistributedType.NO

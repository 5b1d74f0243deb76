"""MLP speculator: head math against the published equations written out plainly, and the per-head loss."""

import math

import pytest
import torch
import torch.nn.functional as F

from draftsmith.train.heads.mlp_speculator import MLPSpeculator, MLPSpeculatorConfig
from draftsmith.train.objective import per_head_loss


def reference_chain(head, state, token, k):
    """arXiv 2404.19124 / HF MLPSpeculator, one vector at a time, no shared code with the head."""
    cfg = head.config
    w_state = 0.5 ** (0.5 / cfg.n_predict)
    w_emb = math.sqrt((1 - w_state**2) * (cfg.inner_dim / 2))
    if cfg.scale_input:
        state = state / torch.sqrt((state**2).mean() + 1e-6) / math.sqrt(2)
    toks, all_logits = [], []
    for i in range(k):
        z = head.emb[i].weight[token]
        x = head.proj[i].weight @ state * w_state + z * w_emb
        x = x / torch.sqrt((x**2).mean() + 1e-6) * head.ln[i].weight + head.ln[i].bias
        state = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))  # exact GELU
        logits = head.head[i].weight @ state
        token = int(logits.argmax())
        toks.append(token)
        all_logits.append(logits)
    return toks, all_logits


@pytest.mark.parametrize("tie,scale", [(False, False), (True, True)])
def test_head_equals_published_equations(tie, scale):
    torch.manual_seed(0)
    cfg = MLPSpeculatorConfig(emb_dim=48, vocab_size=97, inner_dim=32, n_predict=3, tie_weights=tie, scale_input=scale)
    head = MLPSpeculator(cfg)
    with torch.no_grad():  # non-trivial norm affine params
        for p in head.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.3)
    state, token = torch.randn(5, 48), torch.randint(0, 97, (5,))
    got = head.propose(state, token)
    for r in range(5):
        toks, logits = reference_chain(head, state[r], int(token[r]), 3)
        assert got[r].tolist() == toks
        s = head.prepare(state[r : r + 1])
        t = token[r : r + 1]
        for i in range(3):
            s = head.step(i, s, t)
            torch.testing.assert_close(head.logits(i, s)[0], logits[i], atol=1e-4, rtol=1e-4)
            t = torch.tensor([toks[i]])
    keys = set(head.trainable_state_dict())
    if tie:  # every tensor once: emb.0, ln.0, proj.0 (target width) + proj.1 (shared), a head per stage
        assert keys == {
            "emb.0.weight",
            "proj.0.weight",
            "proj.1.weight",
            "ln.0.weight",
            "ln.0.bias",
            "head.0.weight",
            "head.1.weight",
            "head.2.weight",
        }
        assert head.emb[2].weight is head.emb[0].weight and head.proj[2].weight is head.proj[1].weight
    else:
        assert len(keys) == 3 * 5 and head.proj[0].weight.shape == (32, 48) and head.proj[1].weight.shape == (32, 32)


def test_per_head_loss_is_each_heads_cross_entropy():
    torch.manual_seed(1)
    cfg = MLPSpeculatorConfig(emb_dim=16, vocab_size=23, inner_dim=16, n_predict=3)
    head = MLPSpeculator(cfg)
    B, T = 2, 9
    last, ids = torch.randn(B, T, 16), torch.randint(0, 23, (B, T))
    mask = torch.ones(B, T)
    mask[0, :3] = 0  # unsupervised prompt
    mask[1, 7:] = 0  # padding
    out = per_head_loss(head, last, ids, mask, [1.0, 0.5, 0.25])
    # head i at row t: state from rows' hidden t, tokens x_{t+1..t+1+i}, label x_{t+2+i}, kept where mask[t+2+i]
    for i in range(3):
        ces, hits = [], []
        for b in range(B):
            for t in range(T - 2 - i):
                if not mask[b, t + 2 + i]:
                    continue
                s = head.prepare(last[b, t][None])
                for j in range(i + 1):
                    s = head.step(j, s, ids[b, t + 1 + j][None])
                lg = head.logits(i, s)[0]
                ces.append(F.cross_entropy(lg[None], ids[b, t + 2 + i][None]))
                hits.append(float(lg.argmax() == ids[b, t + 2 + i]))
        torch.testing.assert_close(out.losses[i], torch.stack(ces).mean(), atol=1e-5, rtol=1e-5)
        assert out.accs[i].item() == pytest.approx(sum(hits) / len(hits))
        assert out.counts[i].item() == len(ces)
    torch.testing.assert_close(out.loss, out.losses[0] + 0.5 * out.losses[1] + 0.25 * out.losses[2])
    out.loss.backward()
    assert all(p.grad is not None for p in head.parameters())
    # labels from the target's greedy tokens instead of the sequence: top[t] is the token after position t
    top = torch.randint(0, 23, (B, T))
    ev = per_head_loss(head, last, ids, mask, [1.0, 1.0, 1.0], target_top=top)
    ces = []
    for b in range(B):
        for t in range(T - 2):
            if mask[b, t + 2]:
                s = head.step(0, head.prepare(last[b, t][None]), ids[b, t + 1][None])
                ces.append(F.cross_entropy(head.logits(0, s), top[b, t + 1][None]))
    assert ev.counts[0] == out.counts[0]
    torch.testing.assert_close(ev.losses[0], torch.stack(ces).mean(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tie", [False, True])
def test_export_round_trip_and_refusals(tmp_path, tie):
    import json

    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig

    from draftsmith.export.mlp import export_mlp_speculator, validate_mlp_export
    from draftsmith.export.vllm import ExportError
    from draftsmith.serve.plugin import load_speculator

    tc = LlamaConfig(vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=2)
    cfg = MLPSpeculatorConfig.from_target(tc, inner_dim=32, n_predict=3, tie_weights=tie, scale_input=True)
    torch.manual_seed(0)
    head = MLPSpeculator(cfg)
    out = export_mlp_speculator(head.trainable_state_dict(), cfg, tmp_path / "x", target_config=tc)
    config = validate_mlp_export(out, tc)
    assert (config["model_type"], config["emb_dim"], config["inner_dim"], config["n_predict"]) == (
        "mlp_speculator",
        48,
        32,
        3,
    )
    assert config["tie_weights"] is tie and config["scale_input"] is True and config["vocab_size"] == 97
    back = load_speculator(out)  # what the vLLM proposer loads
    state, token = torch.randn(4, 48), torch.randint(0, 97, (4,))
    assert torch.equal(back.propose(state, token), head.propose(state, token))

    other = LlamaConfig(vocab_size=96, hidden_size=48, num_hidden_layers=2, num_attention_heads=2)
    with pytest.raises(ExportError, match="vocab_size head=97 target=96"):
        export_mlp_speculator(head.trainable_state_dict(), cfg, tmp_path / "y", target_config=other)
    assert not (tmp_path / "y").exists()
    tensors = load_file(out / "model.safetensors")
    tensors["speculator.extra.weight"] = torch.zeros(1)  # vLLM would skip it silently; we refuse
    save_file(tensors, out / "model.safetensors")
    with pytest.raises(ExportError, match="unexpected"):
        validate_mlp_export(out)
    config["n_predict"] = 4
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError):
        validate_mlp_export(out)


def reduced_head(vocab_size=97, rows=(0, 3, 5, 8, 13, 21, 34, 55, 89), **kw):
    """A speculator whose heads predict over `rows` (target ids) of a `vocab_size` vocab."""
    from draftsmith.train.data.vocab import build_draft_vocab

    counts = torch.zeros(vocab_size, dtype=torch.long)
    counts[list(rows)] = torch.arange(len(rows), 0, -1)
    vocab = build_draft_vocab(counts, len(rows))
    cfg = MLPSpeculatorConfig(emb_dim=16, vocab_size=vocab_size, inner_dim=16, draft_vocab_size=len(rows), **kw)
    torch.manual_seed(2)
    head = MLPSpeculator(cfg)
    head.set_vocab(vocab.d2t, vocab.t2d)
    return head, torch.tensor(sorted(rows))


def test_draft_vocab_heads_predict_rows_mapped_to_target_ids():
    head, rows = reduced_head()
    assert head.head[0].weight.shape == (9, 16) and head.emb[0].weight.shape == (97, 16)  # inputs keep the vocab
    assert torch.equal(head.draft_to_target, rows)
    state, token = torch.randn(6, 16), torch.randint(0, 97, (6,))
    got = head.propose(state, token)  # [6, 3] target ids
    for r in range(6):  # the chain written out: argmax row -> its target id -> the next stage's embedding
        s, t = head.prepare(state[r : r + 1]), token[r : r + 1]
        for i in range(3):
            s = head.step(i, s, t)
            t = rows[head.logits(i, s).argmax(-1)]
            assert int(got[r, i]) == int(t)
    assert set(got.flatten().tolist()) <= set(rows.tolist())
    # the loss: labels become rows; a label outside the draft vocab adds nothing and is a miss, still counted
    B, T = 2, 8
    last = torch.randn(B, T, 16)
    ids = rows[torch.randint(0, 9, (B, T))]
    ids[0, 4] = 1  # not in the draft vocab
    mask = torch.ones(B, T)
    out = per_head_loss(head, last, ids, mask, [1.0, 1.0, 1.0])
    ces, n = [], 0
    for b in range(B):
        for t in range(T - 2):
            n += 1
            if int(ids[b, t + 2]) == 1:
                continue
            lg = head.logits(0, head.step(0, head.prepare(last[b, t][None]), ids[b, t + 1][None]))
            ces.append(F.cross_entropy(lg, (rows == ids[b, t + 2]).nonzero()[0]))
    assert out.counts[0].item() == n == len(ces) + 1
    torch.testing.assert_close(out.losses[0], torch.stack(ces).sum() / n, atol=1e-5, rtol=1e-5)


def test_draft_vocab_export_round_trip_and_refusals(tmp_path):
    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig

    from draftsmith.eval.reference_decoder import MLPSpeculatorDrafter
    from draftsmith.export.mlp import VOCAB_FILE, export_mlp_speculator, read_export, validate_mlp_export
    from draftsmith.export.vllm import ExportError
    from draftsmith.serve.plugin import load_speculator

    head, rows = reduced_head()
    tc = LlamaConfig(vocab_size=97, hidden_size=16, num_hidden_layers=2, num_attention_heads=2)
    out = export_mlp_speculator(head.trainable_state_dict(), head.config, tmp_path / "x", target_config=tc)
    config = validate_mlp_export(out, tc)
    assert config["draft_vocab_size"] == 9 and config["vocab_size"] == 97
    assert load_file(out / "model.safetensors")["speculator.head.0.weight"].shape == (9, 16)
    assert set(load_file(out / VOCAB_FILE)) == {"d2t", "t2d"}
    back = load_speculator(out)  # what our vLLM plugin serves
    state, token = torch.randn(5, 16), torch.randint(0, 97, (5,))
    assert torch.equal(back.propose(state, token), head.propose(state, token))
    cfg_back, tensors = read_export(out)  # the reference decoder's path
    assert cfg_back["draft_vocab_size"] == 9 and torch.equal(tensors["d2t"], head.d2t)

    # the reference drafter emits target ids, and its sampled distribution sits on the draft vocab's ids
    drafter = MLPSpeculatorDrafter(back, draft_sampling="sample")
    drafter.last, drafter.last_pos = state[0], 3
    prop = drafter.propose([1, 2, 3, 4, 5], 3, 1.0, torch.Generator().manual_seed(0))
    assert set(prop.tokens) <= set(rows.tolist())
    assert prop.probs.shape == (3, 97)
    assert torch.allclose(prop.probs[:, rows].sum(-1), torch.ones(3, dtype=torch.float64))

    maps = load_file(out / VOCAB_FILE)
    bad = dict(maps, t2d=torch.zeros(96, dtype=torch.bool))  # a map made for another vocab
    save_file(bad, out / VOCAB_FILE)
    with pytest.raises(ExportError, match=r"t2d must be bool \[97\]"):
        load_speculator(out)
    (out / VOCAB_FILE).unlink()
    with pytest.raises(ExportError, match="draft_vocab.safetensors, the map of its rows to target ids, is missing"):
        validate_mlp_export(out)
    other = LlamaConfig(vocab_size=96, hidden_size=16, num_hidden_layers=2, num_attention_heads=2)
    with pytest.raises(ExportError, match="vocab_size head=97 target=96"):
        export_mlp_speculator(head.trainable_state_dict(), head.config, tmp_path / "y", target_config=other)
    state = dict(head.trainable_state_dict(), d2t=head.d2t.flip(0))
    with pytest.raises(ExportError, match="out of order"):
        export_mlp_speculator(state, head.config, tmp_path / "z", target_config=tc)
    assert not (tmp_path / "y").exists() and not (tmp_path / "z").exists()

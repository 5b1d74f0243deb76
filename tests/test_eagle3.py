"""EAGLE-3 head, TTT unroll and target features on tiny models (CPU, seconds)."""

import pytest
import torch
from reference import single_query_step
from test_architectures import ROPE_LLAMA3

from draftsmith.train.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.train.target import Target, default_aux_layer_ids
from draftsmith.train.ttt.unroll import ttt_unroll


def tiny_head(model, draft_vocab_size=32, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = Eagle3Config.from_target(model.config, draft_vocab_size, [1, 3, 4], **kw)
    head = Eagle3Head(cfg)
    head.embed_tokens.weight.data.copy_(model.get_input_embeddings().weight)
    V, Vd = cfg.vocab_size, cfg.draft_vocab_size
    ids = torch.randperm(V)[:Vd].sort().values  # ascending target ids of the draft vocab
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    head.set_vocab(ids - torch.arange(Vd), t2d)
    return head


def test_aux_layer_ids_follow_vllm_convention(tiny_model):
    """Aux id k must be the residual stream *entering* decoder layer k (vLLM), not layer k's output."""
    target = Target(tiny_model, [1, 3, 4])
    ids = torch.randint(0, 128, (2, 9))
    seen = {}
    hooks = [
        tiny_model.model.layers[k].register_forward_pre_hook(
            lambda m, args, kwargs, k=k: seen.__setitem__(k, (args[0] if args else kwargs["hidden_states"]).clone()),
            with_kwargs=True,
        )
        for k in (1, 3, 4)
    ]
    feats = target.features(ids)
    for h in hooks:
        h.remove()
    H = tiny_model.config.hidden_size
    for i, k in enumerate((1, 3, 4)):
        torch.testing.assert_close(feats.aux[..., i * H : (i + 1) * H], seen[k])
    torch.testing.assert_close(feats.last, tiny_model.model(ids).last_hidden_state)  # post-norm final state


def test_default_aux_ids_and_collisions():
    assert default_aux_layer_ids(30) == [2, 15, 27]
    assert default_aux_layer_ids(32) == [2, 16, 29]
    with pytest.raises(ValueError, match="collide"):
        default_aux_layer_ids(4)


def test_head_shapes_and_keys(tiny_model):
    head = tiny_head(tiny_model)
    keys = set(head.trainable_state_dict())
    assert "embed_tokens.weight" not in keys
    assert {
        "fc.weight",
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
        "layers.0.hidden_norm.weight",
        "layers.0.self_attn.q_proj.weight",
    } <= keys
    assert head.layers[0].self_attn.q_proj.weight.shape == (4 * 32, 2 * 128)
    assert head.fc.weight.shape == (128, 3 * 128)
    assert head.lm_head.weight.shape == (32, 128)


def incremental_reference(head, aux, ids, steps):
    """vLLM-style decoding: for each row j, prefill rows 0..j on target features, then draft `steps`-1 more
    positions one query at a time, each attending to the prefill keys and its own previous draft keys."""
    B, T = ids.shape
    out = torch.zeros(steps, B, T, head.config.hidden_size)
    padded = torch.cat([ids, torch.zeros(B, steps + 1, dtype=torch.long)], dim=1)
    for j in range(T):
        cache = head.ttt_cache()
        pos = torch.arange(j + 1).expand(B, j + 1)
        h = head(padded[:, 1 : j + 2], pos, head.fuse(aux[:, : j + 1]), cache)  # step 0 on rows 0..j
        out[0, :, j] = h[:, j]
        k0, v0 = cache[0][0]
        prev = h[:, j : j + 1]
        own = []
        for s in range(1, steps):
            step_cache = [(k0, v0)]  # only the context rows' keys, then this row's earlier draft keys
            tok = padded[:, j + 1 + s : j + 2 + s]
            # run the layer on one query with keys [context rows | own draft keys]
            q_cache = step_cache + own
            hs = single_query_step(head, tok, torch.full((B, 1), j + s), prev, q_cache)
            own = q_cache[1:]
            out[s, :, j] = hs[:, 0]
            prev = hs
    return out


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_ttt_unroll_equals_incremental_decoding(tiny_model, norm_before_residual):
    """Each TTT step at row j must see exactly the context vLLM gives draft position k at inference."""
    torch.manual_seed(1)
    head = tiny_head(tiny_model, norm_before_residual=norm_before_residual).double()
    B, T, steps = 2, 7, 3
    ids = torch.randint(0, 128, (B, T))
    aux = torch.randn(B, T, 3 * 128, dtype=torch.float64)
    ref = incremental_reference(head, aux, ids, steps)
    positions = torch.arange(T).expand(B, T)
    cache, hidden = head.ttt_cache(), head.fuse(aux)
    from draftsmith.train.ttt.unroll import shift_left

    for s in range(steps):
        hidden = head(shift_left(ids, 1 + s), positions + s, hidden, cache)
        valid = T - 1 - s  # rows whose step-s token input is inside the sequence
        torch.testing.assert_close(hidden[:, :valid], ref[s][:, :valid].to(hidden.dtype))


@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_ttt_unroll_equals_kv_cache_decoding_for_every_depth(tiny_model, num_layers):
    """The TTT unroll (list caches, diagonal attention) against decoding as the reference decoder and vLLM do it:
    prefill rows 0..j into a `kv_cache()`, then draft steps on a fork, every layer keeping its own keys."""
    from draftsmith.train.ttt.unroll import shift_left

    torch.manual_seed(2)
    head = tiny_head(tiny_model, num_layers=num_layers).double()
    assert len(head.layers) == num_layers
    B, T, steps = 1, 6, 3
    ids = torch.randint(0, 128, (B, T + steps + 1))
    aux = torch.randn(B, T, 3 * 128, dtype=torch.float64)
    cache, hidden, unrolled = head.ttt_cache(), head.fuse(aux), []
    for s in range(steps):
        hidden = head(shift_left(ids[:, :T], 1 + s), torch.arange(T)[None] + s, hidden, cache)
        unrolled.append(hidden)
    for j in range(T - steps):
        kv = head.kv_cache()
        h = head(ids[:, 1 : j + 2], torch.arange(j + 1)[None], head.fuse(aux[:, : j + 1]), kv)[:, -1:]
        assert len(kv) == j + 1
        drafts = kv.fork()
        torch.testing.assert_close(h[:, 0], unrolled[0][:, j])
        for s in range(1, steps):
            h = head(ids[:, j + 1 + s : j + 2 + s], torch.tensor([[j + s]]), h, drafts)
            torch.testing.assert_close(h[:, 0], unrolled[s][:, j])
        assert len(kv) == j + 1 and len(drafts) == j + steps  # the drafts never reach the committed cache
    with pytest.raises(ValueError, match="cache holds 1 layers"):
        if num_layers > 1:
            head(ids[:, :2], torch.arange(2)[None], head.fuse(aux[:, :2]), [[]])
        else:
            raise ValueError("cache holds 1 layers")  # one layer: every cache fits, nothing to refuse


@pytest.mark.parametrize("dialect", ["speculators", "native"])
def test_two_layer_head_exports_as_vllm_builds_it_and_reads_back(tiny_model, tmp_path, dialect):
    """vLLM's multi-layer eagle3 drafter: num_hidden_layers 2, layer 1's projections on H, and a hidden_norm in
    every layer (vLLM builds one and refuses a checkpoint without it; export writes ones, read_export drops them)."""
    from safetensors.torch import load_file, save_file

    from draftsmith.export.vllm import ExportError, export_eagle3, read_export, validate_export

    head = tiny_head(tiny_model, num_layers=2)
    assert not hasattr(head.layers[1], "hidden_norm")
    out = export_eagle3(head.trainable_state_dict(), head.config, tmp_path / "x", verifier="tiny", dialect=dialect, k=3)
    config = validate_export(out, tiny_model.config)
    assert (config if dialect == "native" else config["transformer_layer_config"])["num_hidden_layers"] == 2
    tensors = load_file(out / "model.safetensors")
    first = "midlayer." if dialect == "native" else "layers.0."
    assert tensors[first + "self_attn.q_proj.weight"].shape == (4 * 32, 2 * 128)
    assert tensors["layers.1.self_attn.q_proj.weight"].shape == (4 * 32, 128)
    assert torch.equal(tensors["layers.1.hidden_norm.weight"], torch.ones(128))
    read_config, state = read_export(out)
    assert read_config["num_layers"] == 2
    want = head.trainable_state_dict()
    assert state.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(state[name], value), name
    del tensors["layers.1.mlp.up_proj.weight"]
    save_file(tensors, out / "model.safetensors")
    with pytest.raises(ExportError, match=r"missing \['layers.1.mlp.up_proj.weight'\]"):
        validate_export(out)


def test_ttt_loss_decreases_and_reports_steps(tiny_model):
    torch.manual_seed(0)
    head = tiny_head(tiny_model, draft_vocab_size=128)
    target = Target(tiny_model, [1, 3, 4])
    ids = torch.randint(0, 128, (2, 16))
    mask = torch.ones_like(ids)
    mask[:, :4] = 0
    feats = target.features(ids)
    sharp = feats.logits * 20  # a random tiny target is near-uniform; sharpen it so CE has room to fall
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=3e-3)
    first = None
    for _ in range(30):
        out = ttt_unroll(head, feats.aux, sharp, ids, mask, steps=3, decay=0.8)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        first = first if first is not None else out.loss.item()
    assert len(out.losses) == len(out.accs) == 3
    assert out.loss.item() < 0.5 * first
    assert out.accs[0].item() > 0.5  # memorised: top-1 agrees with the target on the fixed batch
    assert 1.0 <= 1 + (out.accept_len / out.rows).item() <= 4.0
    # step k at row j predicts x_{j+2+k}: rows j with 4 <= j+2+k <= 15 are supervised, 12 per sequence
    assert [int(c) for c in out.counts] == [24, 24, 24]


def test_frozen_embedding_gets_no_gradient(tiny_model):
    head = tiny_head(tiny_model)
    target = Target(tiny_model, [1, 3, 4])
    ids = torch.randint(0, 128, (1, 8))
    feats = target.features(ids)
    ttt_unroll(head, feats.aux, feats.logits, ids, torch.ones_like(ids), 2, 0.8).loss.backward()
    assert head.embed_tokens.weight.grad is None
    assert head.fc.weight.grad is not None and head.fc.weight.grad.abs().sum() > 0


def test_restricted_target_logits_equal_the_full_ones(tiny_model):
    target = Target(tiny_model, [1, 3, 4])
    ids = torch.randint(0, 128, (2, 10))
    vocab = torch.tensor([0, 3, 7, 50, 127])
    full = target.features(ids)
    sub = target.features(ids, vocab_ids=vocab, full_top=True)
    torch.testing.assert_close(full.logits, tiny_model(ids).logits)
    torch.testing.assert_close(sub.logits, full.logits[..., vocab])
    assert torch.equal(sub.top, full.logits.argmax(-1))
    torch.testing.assert_close(sub.aux, full.aux)


def test_unroll_with_restricted_logits_matches_full(tiny_model):
    head = tiny_head(tiny_model, draft_vocab_size=32)
    target = Target(tiny_model, [1, 3, 4])
    ids = torch.randint(0, 128, (2, 12))
    mask = torch.ones_like(ids)
    full = target.features(ids)
    sub = target.features(ids, vocab_ids=head.draft_to_target, full_top=True)
    a = ttt_unroll(head, full.aux, full.logits, ids, mask, 3, 0.8)
    b = ttt_unroll(head, sub.aux, sub.logits, ids, mask, 3, 0.8, sub.top)
    torch.testing.assert_close(a.loss, b.loss)
    assert [x.item() for x in a.accs] == [x.item() for x in b.accs]


def dense_unroll_reference(head, aux, target_logits, ids, mask, steps, decay, last=None, feature_loss=0.0):
    """The TTT loss written the plain way: every row through the vocab side, then masked means (with feature_loss,
    each step's normed output regressed onto the target's final state at the position it predicts from)."""
    import torch.nn.functional as F

    from draftsmith.train.ttt.unroll import shift_left

    B, T = ids.shape
    d2t = head.draft_to_target
    p_all = F.softmax(target_logits[..., d2t].float(), dim=-1)  # [B, T, Vd]
    top = target_logits.argmax(-1)
    hidden, cache, total, accs, agree = head.fuse(aux), head.ttt_cache(), 0.0, [], []
    for k in range(steps):
        # vLLM's aux_output: a later step reads the previous one's state, after the final norm with norm_output
        step_in = head.norm(hidden) if k > 0 and head.config.norm_output else hidden
        hidden = head(shift_left(ids, 1 + k), torch.arange(T).expand(B, T) + k, step_in, cache)
        logits = head.logits(hidden).float()
        m = shift_left(mask, 2 + k).float()
        ce = -(shift_left(p_all, 1 + k) * F.log_softmax(logits, -1)).sum(-1)
        total = total + decay**k * (ce * m).sum() / m.sum()
        if feature_loss:
            reg = F.smooth_l1_loss(head.norm(hidden), shift_left(last, 1 + k), reduction="none").mean(-1)
            total = total + decay**k * feature_loss * (reg * m).sum() / m.sum()
        hit = (d2t[logits.argmax(-1)] == shift_left(top, 1 + k, -1)).float() * m
        accs.append((hit.sum() / m.sum()).item())
        agree.append(hit)
    run = torch.cumprod(torch.stack(agree, -1), -1).sum(-1)
    return total, accs, (run * shift_left(mask, 2).float()).sum()


@pytest.mark.parametrize("norm_output,feature_loss", [(False, 0.0), (True, 0.0), (True, 0.7)])
def test_unroll_scores_only_supervised_rows_like_the_dense_loss(tiny_model, norm_output, feature_loss):
    """The unroll sends only supervised rows through lm_head; loss, accuracies and simulated acceptance
    must equal the dense all-rows computation (prompt rows, padding and sequence ends included), with either
    wiring of the state a step hands the next."""
    head = tiny_head(tiny_model, draft_vocab_size=128, norm_output=norm_output).double()  # full vocab: no argmax ties
    with torch.no_grad():
        head.norm.weight.uniform_(0.5, 2.0)  # a final norm that is not the identity on normed states
    torch.manual_seed(3)
    B, T = 3, 14
    ids = torch.randint(0, 128, (B, T))
    mask = torch.zeros(B, T, dtype=torch.long)
    mask[0, 5:] = 1  # prompt then answer to the end
    mask[1, 2:9] = 1  # answer then padding
    mask[2, 7:12] = 1
    aux = torch.randn(B, T, 3 * 128, dtype=torch.float64)
    logits = torch.randn(B, T, 128, dtype=torch.float64) * 3
    # make the target's top token at position j+1 the head's step-0 pick at row j on every other row, so
    # step-0 agreement and the acceptance runs are not all zero
    with torch.no_grad():
        hidden = head(ids.roll(-1, 1), torch.arange(T).expand(B, T), head.fuse(aux), head.ttt_cache())
        pick = head.logits(hidden).argmax(-1)
    for j in range(0, T - 1, 2):
        logits[torch.arange(B), j + 1, head.draft_to_target[pick[:, j]]] += 100.0
    last = torch.randn(B, T, head.config.hidden_size, dtype=torch.float64) * 2  # the target's final states
    out = ttt_unroll(head, aux, logits, ids, mask, 3, 0.8, last=last, feature_loss=feature_loss)
    ref_loss, ref_accs, ref_run = dense_unroll_reference(head, aux, logits, ids, mask, 3, 0.8, last, feature_loss)
    if feature_loss:  # the regression adds to the loss and nothing else
        plain = ttt_unroll(head, aux, logits, ids, mask, 3, 0.8)
        assert out.loss.item() > plain.loss.item() + 0.1
        assert [a.item() for a in out.accs] == [a.item() for a in plain.accs]
    torch.testing.assert_close(out.loss.double(), ref_loss.double(), rtol=1e-6, atol=1e-6)  # fp32 logits in both
    assert [a.item() for a in out.accs] == pytest.approx(ref_accs)
    assert ref_accs[0] > 0.3 and ref_run.item() > 0  # the agreement above is visible
    assert out.accept_len.item() == ref_run.item()
    assert [int(c) for c in out.counts] == [int(mask[:, 2 + k :].sum()) for k in range(3)]
    out.loss.backward()  # gradients flow through the gathered rows
    assert head.lm_head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        ROPE_LLAMA3,  # the Llama-3.x target of tests/test_architectures.py
        {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 512},
    ],
)
def test_draft_rope_is_the_targets_rope(rope):
    """The draft layer rotates keys with the target's rope type (llama3, yarn, ...), as vLLM's draft layer does:
    its cos/sin equal transformers' rotary embedding for the same config."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    tc = LlamaConfig(
        hidden_size=128,
        num_attention_heads=4,
        head_dim=32,
        num_hidden_layers=6,
        vocab_size=128,
        intermediate_size=256,
        max_position_embeddings=4096,
        rope_parameters=rope,
    )
    head = Eagle3Head(Eagle3Config.from_target(tc, 32, [1, 3, 4]))
    assert (head.config.rope_scaling is None) == (rope["rope_type"] == "default")
    pos = torch.arange(0, 3000, 7)[None]
    cos, sin = head.layers[0].self_attn.rope(pos, torch.float32)
    ref_cos, ref_sin = LlamaRotaryEmbedding(tc)(torch.zeros(1, pos.shape[1], 128), pos)
    torch.testing.assert_close(cos[:, 0], ref_cos, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sin[:, 0], ref_sin, atol=1e-5, rtol=1e-5)

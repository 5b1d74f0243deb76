"""P-EAGLE (family peagle): mask slots in the unroll, the reference drafter, config and export (tiny models, CPU)."""

import json

import pytest
import torch
from test_eagle3 import tiny_head

from draftsmith.export.vllm import ExportError, export_eagle3, read_export, validate_export
from draftsmith.train.heads import families
from draftsmith.train.heads.eagle3 import default_mask_token
from draftsmith.train.ttt.unroll import shift_left, ttt_unroll


def peagle_head(model, **kw):
    return tiny_head(model, parallel_drafting=True, mask_token_id=3, **kw)


@pytest.mark.parametrize("num_layers", [1, 2])
def test_mask_slots_in_the_unroll_equal_one_parallel_forward(tiny_model, num_layers):
    """Step s of the unroll at row j == the s-th mask slot of one forward after rows 0..j (what vLLM's parallel
    drafter runs): causal over the context rows and the block's earlier slots, reading no drafted token."""
    torch.manual_seed(3)
    head = peagle_head(tiny_model, num_layers=num_layers).double()
    B, T, steps = 1, 7, 3
    ids = torch.randint(0, 128, (B, T + steps + 1))
    aux = torch.randn(B, T, 3 * 128, dtype=torch.float64)
    cache, hidden, unrolled = head.ttt_cache(), head.fuse(aux), []
    for s in range(steps):
        if s == 0:
            hidden = head(shift_left(ids[:, :T], 1), torch.arange(T)[None], hidden, cache)
        else:
            m_ids, m_hidden = head.mask_inputs(B, T)
            hidden = head(m_ids, torch.arange(T)[None] + s, m_hidden, cache)
        unrolled.append(hidden)
    for j in range(T - steps):
        kv = head.kv_cache()
        h = head(ids[:, 1 : j + 2], torch.arange(j + 1)[None], head.fuse(aux[:, : j + 1]), kv)[:, -1:]
        torch.testing.assert_close(h[:, 0], unrolled[0][:, j])
        m_ids, m_hidden = head.mask_inputs(1, steps - 1)
        slots = head(m_ids, torch.arange(j + 1, j + steps)[None], m_hidden, kv.fork())  # one forward
        for s in range(1, steps):
            torch.testing.assert_close(slots[:, s - 1], unrolled[s][:, j])


def test_mask_hidden_is_learned_through_every_mask_slot(tiny_model):
    torch.manual_seed(4)
    B, T, V = 2, 12, tiny_model.config.vocab_size
    aux, logits = torch.randn(B, T, 3 * 128), torch.randn(B, T, V)
    ids, mask = torch.randint(0, V, (B, T)), torch.ones(B, T)
    head = peagle_head(tiny_model)
    out = ttt_unroll(head, aux, logits, ids, mask, steps=3, decay=0.8)
    out.loss.backward()
    assert head.mask_hidden.grad is not None and head.mask_hidden.grad.abs().sum() > 0
    assert len(out.losses) == 3 and all(torch.isfinite(x) for x in out.losses)
    one = peagle_head(tiny_model)
    ttt_unroll(one, aux, logits, ids, mask, steps=1, decay=0.8).loss.backward()
    assert one.mask_hidden.grad is None  # one step: no mask slot reads it
    seq = tiny_head(tiny_model)
    assert not hasattr(seq, "mask_hidden") and "mask_hidden" not in seq.trainable_state_dict()


def test_reference_drafter_drafts_the_block_in_one_forward(tiny_model):
    """Eagle3Drafter on a parallel head: k-1 mask slots after the newest row, one head call, equal to the unroll."""
    from draftsmith.eval.reference_decoder import Eagle3Drafter
    from draftsmith.train.target import Target

    head = peagle_head(tiny_model).eval()
    target = Target(tiny_model, [1, 3, 4])
    prompt = [5, 17, 23, 42, 7, 9]
    feats = target.features(torch.tensor([prompt]))
    drafter = Eagle3Drafter(head)
    drafter.start(prompt)
    next_tokens = prompt[1:] + [11]
    drafter.observe(0, next_tokens, type(feats)(**{**feats.__dict__, "aux": feats.aux[0]}))
    calls = []
    hook = head.register_forward_hook(lambda m, a, o: calls.append(a[0].shape))
    proposal = drafter.propose(prompt + [11], 3, 0.0, None)
    hook.remove()
    assert calls == [torch.Size([1, 2])]  # the two mask slots, together
    with torch.no_grad():  # the same drafts from the unroll at the last row
        ids = torch.tensor([next_tokens])
        cache = head.ttt_cache()
        h0 = head(ids, torch.arange(len(prompt))[None], head.fuse(feats.aux), cache)
        want = [int(head.draft_to_target[head.logits(h0)[0, -1].argmax()])]
        m_ids, m_hidden = head.mask_inputs(1, len(prompt))
        for s in (1, 2):
            h = head(m_ids, torch.arange(len(prompt))[None] + s, m_hidden, cache)
            want.append(int(head.draft_to_target[head.logits(h)[0, -1].argmax()]))
    assert proposal.tokens == want


def test_family_row_config_and_mask_token(tiny_model):
    from draftsmith.train.config import HeadConfig

    fam = families.get("peagle")
    assert fam.fields == families.get("eagle3").fields and "mask_token_id" in fam.keys
    head_cfg = HeadConfig(family="peagle", draft_vocab_size=32, ttt_steps=3)
    cfg = fam.config.load().from_run(head_cfg, tiny_model.config, [1, 3, 4])
    assert cfg.parallel_drafting and cfg.mask_token_id == default_mask_token(tiny_model.config)
    assert (
        not fam.config.load().from_run(HeadConfig(draft_vocab_size=32), tiny_model.config, [1, 3, 4]).parallel_drafting
    )
    assert fam.problems(HeadConfig(family="peagle", draft_vocab_size=32, mask_token_id=10**6), 128) == [
        "head.mask_token_id=1000000: a token id of the target's vocab, 0..127"
    ]
    tc = type(tiny_model.config).from_dict(
        {**tiny_model.config.to_dict(), "pad_token_id": None, "eos_token_id": [9, 2]}
    )
    assert default_mask_token(tc) == 9 and default_mask_token(tc, 5) == 5
    with pytest.raises(ValueError, match="outside the target's vocab"):
        default_mask_token(tc, 128)


@pytest.mark.parametrize("dialect", ["speculators", "native"])
def test_export_writes_the_parallel_contract_and_reads_back(tiny_model, tmp_path, dialect):
    head = peagle_head(tiny_model, ttt_steps=3, fc_outlier_ratio=4.0)
    head.fc_in_scale.uniform_(0.2, 1.0)
    out = export_eagle3(
        head.trainable_state_dict(), head.config, tmp_path / dialect, verifier="t", dialect=dialect, k=3
    )
    config = json.loads((out / "config.json").read_text())
    assert config["mask_token_id"] == 3
    if dialect == "speculators":
        assert config["speculators_model_type"] == "peagle"
        assert config["speculators_config"]["algorithm"] == "peagle"
    assert json.loads((out / "draftsmith.json").read_text())["family"] == "peagle"
    validate_export(out, tiny_model.config)
    cfg, state = read_export(out)
    assert cfg["parallel_drafting"] and torch.equal(state["mask_hidden"], head.mask_hidden.detach())
    # fc's outlier scale is folded into fc.weight, and the mask slot's fused input is unchanged by the fold
    from draftsmith.train.heads.eagle3 import Eagle3Config, Eagle3Head

    served = Eagle3Head(Eagle3Config(**cfg))
    served.load_state_dict({**state, "embed_tokens.weight": head.embed_tokens.weight}, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(served.mask_inputs(1, 1)[1], head.mask_inputs(1, 1)[1])
    # a parallel export without its mask tensor or token is refused
    from safetensors.torch import load_file, save_file

    tensors = load_file(out / "model.safetensors")
    tensors.pop("mask_hidden")
    save_file(tensors, out / "model.safetensors")
    with pytest.raises(ExportError, match="missing \\['mask_hidden'\\]"):
        validate_export(out)
    config["mask_token_id"] = None if dialect == "speculators" else 10**6
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match="mask_token_id"):
        validate_export(out)


def test_served_speculative_config_asks_for_parallel_drafting(tiny_model, tmp_path):
    from draftsmith.eval.methods import speculative_config
    from draftsmith.serve.recipe import head_method

    for dialect in ("speculators", "native"):
        head = peagle_head(tiny_model)
        out = export_eagle3(head.trainable_state_dict(), head.config, tmp_path / dialect, verifier="t", dialect=dialect)
        assert head_method(str(out)) == "peagle"
        sc = speculative_config("h", 3, {"h": str(out)}, 2, 5)
        assert sc["method"] == "eagle3" and sc["parallel_drafting"] is True and sc["num_speculative_tokens"] == 3
    seq = tiny_head(tiny_model)
    out = export_eagle3(seq.trainable_state_dict(), seq.config, tmp_path / "seq", verifier="t")
    assert "parallel_drafting" not in speculative_config("h", 3, {"h": str(out)}, 2, 5)


def test_serving_a_head_in_the_mode_it_was_not_trained_for_is_refused(tiny_model, tmp_path):
    from draftsmith.eval.methods import check_parallel_drafting

    seq, par = tiny_head(tiny_model), peagle_head(tiny_model)
    seq_dir = export_eagle3(seq.trainable_state_dict(), seq.config, tmp_path / "seq", verifier="t")
    par_dir = export_eagle3(par.trainable_state_dict(), par.config, tmp_path / "par", verifier="t")
    with pytest.raises(ValueError, match="trained to draft step by step .* Train a parallel head"):
        check_parallel_drafting("s", str(seq_dir), True)
    with pytest.raises(ValueError, match="is a P-EAGLE head"):
        check_parallel_drafting("p", str(par_dir), False)
    check_parallel_drafting("s", str(seq_dir), False)
    check_parallel_drafting("p", str(par_dir), True)

"""The sample-efficiency levers (issue 16): fc's input norms, the loss's target, Muon."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from test_eagle3 import tiny_head

from draftsmith.export.vllm import ExportError, export_eagle3, read_export, validate_export
from draftsmith.train.config import OptimConfig
from draftsmith.train.optim import MuonAdamW, build_optimizer, muon_groups, orthogonalise
from draftsmith.train.ttt.unroll import target_distribution, ttt_unroll


@pytest.mark.parametrize(
    "flags", [{"norm_before_fc": True}, {"fc_norm": True}, {"norm_before_fc": True, "fc_norm": True}]
)
@pytest.mark.parametrize("dialect", ["speculators", "native"])
def test_fc_input_norms_export_and_read_back(tiny_model, tmp_path, flags, dialect):
    head = tiny_head(tiny_model, **flags)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.startswith(("input_norm.", "fc_norm.")):
                p.uniform_(0.5, 1.5)
    aux = torch.randn(2, 5, 3 * tiny_model.config.hidden_size) * 30
    aux[..., 7] *= 100  # an outlier channel, as SmolLM2's aux states have
    fc_in = head.fc_input(aux)
    if flags.get("fc_norm"):  # each aux state comes out at unit RMS before its own weight
        for i, chunk in enumerate(fc_in.chunk(3, dim=-1)):
            w = head.fc_norm[i].weight
            assert torch.allclose((chunk / w).pow(2).mean(-1).sqrt(), torch.ones(2, 5), atol=1e-2)  # eps
    else:
        assert torch.allclose((fc_in / head.input_norm.weight).pow(2).mean(-1).sqrt(), torch.ones(2, 5), atol=1e-3)

    out = export_eagle3(head.trainable_state_dict(), head.config, tmp_path / "x", verifier="t", dialect=dialect)
    config = json.loads((out / "config.json").read_text())
    norm_before_fc = config["eagle_config"]["norm_before_fc"] if dialect == "native" else config["norm_before_fc"]
    assert norm_before_fc is bool(flags.get("norm_before_fc")) and config["fc_norm"] is bool(flags.get("fc_norm"))
    cfg, state = read_export(out)
    back = tiny_head(tiny_model, **flags)
    back.load_state_dict({**back.state_dict(), **state})
    with torch.no_grad():
        torch.testing.assert_close(back.fuse(aux), head.fuse(aux))

    # an export missing a norm's tensor would load in vLLM with the norm at its init weight: refused
    tensors = load_file(out / "model.safetensors")
    dropped = next(k for k in tensors if k.startswith(("input_norm.", "fc_norm.")))
    save_file({k: v for k, v in tensors.items() if k != dropped}, out / "model.safetensors")
    with pytest.raises(ExportError, match=f"missing \\['{dropped}'\\]"):
        validate_export(out)


def test_plain_head_exports_no_norm_tensors(tiny_model, tmp_path):
    head = tiny_head(tiny_model)
    out = export_eagle3(head.trainable_state_dict(), head.config, tmp_path / "x", verifier="t")
    config = json.loads((out / "config.json").read_text())
    assert config["norm_before_fc"] is False and config["fc_norm"] is False
    assert not [k for k in load_file(out / "model.safetensors") if "norm" in k and not k.startswith(("layers", "norm"))]


def test_target_distributions():
    logits = torch.randn(6, 50)
    torch.testing.assert_close(target_distribution(logits, "kl"), F.softmax(logits, -1))
    hard = target_distribution(logits, "argmax")
    assert torch.equal(hard.argmax(-1), logits.argmax(-1)) and torch.equal(hard.sum(-1), torch.ones(6))
    assert int((hard > 0).sum()) == 6
    top = target_distribution(logits, "topk", topk=4)
    torch.testing.assert_close(top.sum(-1), torch.ones(6))
    assert ((top > 0).sum(-1) == 4).all()
    kept = logits.topk(4, dim=-1).indices
    torch.testing.assert_close(top.gather(-1, kept), F.softmax(logits.gather(-1, kept), -1))
    with pytest.raises(ValueError, match="unknown loss"):
        target_distribution(logits, "mse")


def test_argmax_loss_is_cross_entropy_on_the_greedy_token(tiny_model):
    """With loss=argmax one TTT step's loss is plain CE against the target's greedy draft-vocab token."""
    head = tiny_head(tiny_model)
    B, T, V = 2, 7, tiny_model.config.vocab_size
    aux, logits = torch.randn(B, T, 3 * tiny_model.config.hidden_size), torch.randn(B, T, V)
    ids, mask = torch.randint(0, V, (B, T)), torch.ones(B, T)
    out = ttt_unroll(head, aux, logits, ids, mask, steps=1, decay=1.0, loss="argmax")
    d2t = head.draft_to_target
    tokens = torch.cat([ids[:, 1:], torch.zeros(B, 1, dtype=torch.long)], 1)
    h = head(tokens, torch.arange(T).expand(B, T), head.fuse(aux), head.ttt_cache())
    rows = torch.zeros(B, T, dtype=torch.bool)
    rows[:, : T - 2] = True  # row j predicts x_{j+2}: supervised while j+2 < T
    labels = logits[:, 1 : T - 1][..., d2t].argmax(-1)  # the target's greedy draft token at position j+1
    want = F.cross_entropy(head.logits(h[rows]), labels.reshape(-1), reduction="mean")
    torch.testing.assert_close(out.loss, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_orthogonalise_flattens_the_spectrum(dtype):
    torch.manual_seed(0)
    for shape in ((64, 192), (192, 64)):
        g = torch.randn(*shape) @ torch.diag(torch.logspace(-2, 2, shape[1]))  # condition number 1e4
        out = orthogonalise(g, dtype=dtype)
        s = torch.linalg.svdvals(out)
        assert s.max() < 1.35 and s.median() > 0.6, s  # Newton-Schulz's quintic: singular values near 1
        assert out.shape == g.shape and out.dtype == g.dtype


def test_muon_groups_and_adamw_part_equals_torch_adamw(tiny_model):
    torch.manual_seed(0)
    head = tiny_head(tiny_model, norm_before_fc=True)
    muon, rest = muon_groups(head)
    names = {id(p): n for n, p in head.named_parameters()}
    assert sorted(names[id(p)] for p in muon["params"])[:2] == ["fc.weight", "layers.0.mlp.down_proj.weight"]
    assert {names[id(p)] for p in rest["params"]} >= {"lm_head.weight", "norm.weight", "input_norm.weight"}
    assert "embed_tokens.weight" not in {names[id(p)] for p in muon["params"] + rest["params"]}  # frozen

    # with every parameter in the AdamW group the step is torch's AdamW
    a = torch.nn.Linear(8, 4)
    b = torch.nn.Linear(8, 4)
    b.load_state_dict(a.state_dict())
    ours = MuonAdamW([{"params": list(a.parameters()), "muon": False}], lr=1e-2, weight_decay=0.1)
    ref = torch.optim.AdamW(b.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    for _ in range(5):
        x = torch.randn(3, 8)
        for m, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            m(x).pow(2).sum().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q)


def test_muon_state_round_trips_exactly(tiny_model):
    """Resume = the optimizer's state_dict: 3 steps, save, load into a fresh optimizer, 3 more == 6 straight."""
    x = torch.randn(2, 5, 3 * tiny_model.config.hidden_size)
    ids = torch.randint(0, tiny_model.config.vocab_size, (2, 5))

    def run(head, opt, n):
        for _ in range(n):
            opt.zero_grad()
            hidden = head(ids, torch.arange(5).expand(2, 5), head.fuse(x), head.ttt_cache())
            head.logits(hidden).pow(2).mean().backward()
            opt.step()

    cfg = OptimConfig(name="muon", lr=1e-3, weight_decay=0.01)
    straight = tiny_head(tiny_model)
    run(straight, build_optimizer(cfg, straight), 6)
    first = tiny_head(tiny_model)
    opt = build_optimizer(cfg, first)
    run(first, opt, 3)
    state = opt.state_dict()
    second = tiny_head(tiny_model)
    second.load_state_dict(first.state_dict())
    opt2 = build_optimizer(cfg, second)
    opt2.load_state_dict(state)
    run(second, opt2, 3)
    for (n, p), q in zip(straight.named_parameters(), second.parameters()):
        assert torch.equal(p, q), n
    changed = [n for (n, p), q in zip(tiny_head(tiny_model).named_parameters(), straight.parameters()) if p.ne(q).any()]
    assert "fc.weight" in changed and "lm_head.weight" in changed


def test_ns_steps_reaches_muon_from_the_config(tiny_model):
    """optim.ns_steps is the Newton-Schulz depth of every Muon step (fewer = cheaper and less orthogonal)."""
    from draftsmith.train.config import compose_config

    # singular values spread over 1e-3..1 (a random Gaussian matrix's smallest sit near 1 already, and which depth
    # lands closer there is a coin flip on the draw)
    gen = torch.Generator().manual_seed(0)
    u = torch.linalg.qr(torch.randn(48, 48, generator=gen))[0]
    v = torch.linalg.qr(torch.randn(96, 48, generator=gen))[0]
    g = u @ torch.diag(torch.logspace(-3, 0, 48)) @ v.T
    sv = {n: torch.linalg.svdvals(orthogonalise(g, n)) for n in (3, 5)}
    assert sv[5].min() > sv[3].min()  # the deeper iteration pushes the small singular values further towards 1
    for n in (3, 5):
        cfg = compose_config(["conf=eagle3_smollm2", f"optim.ns_steps={n}"]).optim
        opt = build_optimizer(cfg, tiny_head(tiny_model))
        assert [gr["ns_steps"] for gr in opt.param_groups if gr["muon"]] == [n]


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_decay_modes_decay_what_they_name(tiny_model, name):
    """optim.decay: all shrinks every parameter, matrices spares the norm weights, hidden spares lm_head too.
    With zero gradients AdamW's and Muon's own steps are zero, so what moves is the decay alone."""
    from draftsmith.train.config import compose_config

    spared = {"all": set(), "matrices": set(), "hidden": set()}
    for mode in spared:
        head = tiny_head(tiny_model)
        before = {n: p.detach().clone() for n, p in head.named_parameters() if p.requires_grad}
        over = [f"optim.name={name}", "optim.weight_decay=0.5", "optim.lr=0.1", f"optim.decay={mode}"]
        opt = build_optimizer(compose_config(["conf=eagle3_smollm2", *over]).optim, head)
        for p in head.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        opt.step()
        for n, p in head.named_parameters():
            if n in before:
                if torch.equal(p, before[n]):
                    spared[mode].add(n)
                else:
                    torch.testing.assert_close(p, before[n] * (1 - 0.1 * 0.5))
    assert spared["all"] == set()
    assert spared["matrices"] and all(before[n].ndim == 1 for n in spared["matrices"])  # the norm weights
    assert "lm_head.weight" in spared["hidden"] and spared["matrices"] < spared["hidden"]
    assert "fc.weight" not in spared["hidden"]


def test_muon_refuses_sharded_launches(tiny_model):
    cfg = OptimConfig(name="muon", lr=1e-3)
    from draftsmith.errors import ConfigError

    for kind in ("DEEPSPEED", "FSDP"):
        with pytest.raises(ConfigError, match="optim.name=muon"):
            build_optimizer(cfg, tiny_head(tiny_model), kind)
    with pytest.raises(ValueError, match="2-D"):
        MuonAdamW([{"params": [torch.nn.Parameter(torch.ones(3))], "muon": True}], lr=1e-3)


def test_outlier_channels_scaled_and_folded_into_fc_on_export(tiny_model, tmp_path):
    head = tiny_head(tiny_model, fc_outlier_ratio=8.0)
    n = 3 * tiny_model.config.hidden_size
    aux = torch.randn(4, 6, n)
    aux[..., 5] = 900 + torch.randn(4, 6)  # a massive, near-constant channel, as SmolLM2's 507
    aux[..., 9] *= 5  # a loud channel under the ratio: left alone
    x = aux.reshape(-1, n)
    rms = head.calibrate_fc_input(x.pow(2).sum(0), torch.tensor(float(x.shape[0])))
    med = rms.median()
    assert (head.fc_in_scale < 1).nonzero().flatten().tolist() == [5]
    torch.testing.assert_close(head.fc_in_scale[5], med / rms[5])
    scaled = head.fc_input(aux) * head.fc_in_scale
    assert scaled[..., 5].pow(2).mean().sqrt() < 2 * med  # now a typical channel for fc (and for Adam's steps)
    with torch.no_grad():
        want = head.fuse(aux)
    out = export_eagle3(head.trainable_state_dict(), head.config, tmp_path / "x", verifier="t")
    assert "fc_in_scale" not in load_file(out / "model.safetensors")  # vLLM's tensor set is unchanged
    cfg, state = read_export(out)
    assert cfg["fc_outlier_ratio"] == 0.0
    plain = tiny_head(tiny_model)  # a head without the buffer computes the same thing from the folded fc
    plain.load_state_dict({**plain.state_dict(), **state})
    with torch.no_grad():
        torch.testing.assert_close(plain.fuse(aux), want, rtol=1e-5, atol=1e-3)

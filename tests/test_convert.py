"""`draftsmith convert` and `draftsmith doctor` on tiny heads in every layout (tests/foreign_layouts.py writes them
from each format's documented names): each reads as the head it holds, round trips give the same tensors, what
cannot be mapped is refused naming the key, a converted head trains, and the doctor names each injected fault."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import foreign_layouts as fl
import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.cli import main as cli_main
from draftsmith.train.checkpoint import read_head

ROOT = Path(__file__).resolve().parent.parent
IDS = [2, 4, 5]  # the EAGLE-3 default (2, n//2, n-3) for the 8-layer target below


@pytest.fixture(scope="module")
def target8(tmp_path_factory, tokenizer):
    """An 8-layer tiny Llama (enough layers for distinct default aux ids) with SmolLM2's tokenizer and template."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=2048,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2)  # fmt: skip
    out = tmp_path_factory.mktemp("target8")
    LlamaForCausalLM(cfg).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def eagle_head(target, ids=IDS, **flags):
    from transformers import AutoConfig

    from draftsmith.train.heads.eagle3 import Eagle3Config, Eagle3Head

    torch.manual_seed(1)
    tc = AutoConfig.from_pretrained(target)
    cfg = Eagle3Config.from_target(tc, 256, ids, ttt_steps=3, **flags)
    cfg.target["name_or_path"] = str(target)
    head = Eagle3Head(cfg)
    with torch.no_grad():
        for p in head.parameters():
            if p.requires_grad:
                p.normal_(0, 0.5)
    vocab = (torch.arange(256) * 131 % tc.vocab_size).unique().sort().values
    t2d = torch.zeros(tc.vocab_size, dtype=torch.bool)
    t2d[vocab] = True
    head.set_vocab(vocab - torch.arange(256), t2d)
    return head


def target_embed(target) -> torch.Tensor:
    return load_file(Path(target) / "model.safetensors")["model.embed_tokens.weight"]


def convert(*args) -> int:
    return cli_main(["convert", *map(str, args)])


def doctor(capsys, *args) -> tuple[int, str]:
    code = cli_main(["doctor", *map(str, args), "--no-measure"])
    cap = capsys.readouterr()
    return code, cap.out + cap.err


def same_head(path, head, **config):
    family, cfg, state, _ = read_head(path)
    ours = head.trainable_state_dict()
    assert sorted(state) == sorted(ours), (sorted(state), sorted(ours))
    for k in ours:
        torch.testing.assert_close(state[k].to(ours[k].dtype), ours[k], rtol=0, atol=0, msg=k)
    want = {
        k: v for k, v in head.config.to_dict().items() if k not in ("target", "ttt_steps", "max_position_embeddings")
    }
    got = {k: cfg.get(k) for k in want}
    assert got == {**want, **config}, {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    return family


@pytest.mark.parametrize("layout", ["eagle3", "specforge", "vllm", "speculators", "modelopt"])
def test_each_layout_reads_as_the_head_it_holds(target8, tmp_path, layout):
    head = eagle_head(target8, ids=IDS if layout == "eagle3" else [1, 3, 6])
    src = tmp_path / layout
    if layout == "eagle3":
        fl.eagle3_release(head, src)
    elif layout == "specforge":
        fl.specforge(head, src, target_embed(target8))
    elif layout == "vllm":
        fl.vllm_native(head, src)
    elif layout == "modelopt":
        fl.modelopt(head, src)
    else:
        fl.speculators(head, src, str(target8))
    given = ["--from", layout] if layout in ("specforge", "vllm") else []
    assert convert(src, tmp_path / "run", "--target", target8, *given) == 0
    assert same_head(tmp_path / "run", head).name == "eagle3"
    saved = json.loads((tmp_path / "run" / "converted.json").read_text())
    assert saved["converted_from"]["layout"] == layout


def test_aux_ids_in_an_eagle_config_need_their_numbering_named(target8, tmp_path, capsys):
    head = eagle_head(target8, ids=[1, 3, 6])
    src = fl.specforge(head, tmp_path / "sf", target_embed(target8))
    assert convert(src, tmp_path / "run", "--target", target8) == 1
    err = capsys.readouterr().err
    assert "can be read two ways" in err and "--from specforge" in err and not (tmp_path / "run").exists()
    assert convert(src, tmp_path / "as_vllm", "--target", target8, "--from", "vllm") == 0  # read as vLLM would
    assert read_head(tmp_path / "as_vllm")[1]["aux_layer_ids"] == [0, 2, 5]


def test_round_trips_give_the_same_tensors(target8, tmp_path):
    head = eagle_head(target8)
    run = tmp_path / "run"
    assert convert(fl.speculators(head, tmp_path / "spec", str(target8)), run) == 0  # the verifier it records
    for to in ("specforge", "eagle3"):
        assert convert(run, tmp_path / to, "--to", to) == 0
        given = ["--from", "specforge"] if to == "specforge" else []
        assert convert(tmp_path / to, tmp_path / f"{to}_back", "--target", target8, *given) == 0
        same_head(tmp_path / f"{to}_back", head)
    for dialect in ("speculators", "native"):  # our vLLM export, read as a foreign head (no draftsmith.json)
        out = tmp_path / f"vllm_{dialect}"
        assert convert(run, out, "--to", "vllm", "--dialect", dialect, "--k", "3") == 0
        (out / "draftsmith.json").unlink()
        given = ["--from", "vllm"] if dialect == "native" else []
        assert convert(out, tmp_path / f"{dialect}_back", "--target", target8, *given) == 0
        same_head(tmp_path / f"{dialect}_back", head)


def test_a_speculators_0_9_head_keeps_its_wiring(target8, tmp_path, capsys):
    """speculators 0.9 trains its EAGLE-3 heads with norm_before_fc and norm_output (a step hands the next its state
    after the final norm): read with both, written to vLLM in either dialect with the flags vLLM reads, and refused
    by the layouts that cannot say them."""
    head = eagle_head(target8, ids=[1, 3, 6], norm_before_fc=True, norm_output=True)
    run = tmp_path / "run"
    assert convert(fl.speculators(head, tmp_path / "spec", str(target8)), run) == 0
    same_head(run, head)
    for dialect in ("speculators", "native"):
        out = tmp_path / f"vllm_{dialect}"
        assert convert(run, out, "--to", "vllm", "--dialect", dialect, "--k", "3") == 0
        assert json.loads((out / "config.json").read_text())["norm_output"] is True
        (out / "draftsmith.json").unlink()
        given = ["--from", "vllm"] if dialect == "native" else []
        assert convert(out, tmp_path / f"{dialect}_back", "--target", target8, *given) == 0
        same_head(tmp_path / f"{dialect}_back", head)
    capsys.readouterr()
    assert convert(run, tmp_path / "eagle3", "--to", "eagle3") == 1
    assert "norm_output: true" in capsys.readouterr().err and not (tmp_path / "eagle3").exists()


def test_the_eagle3_release_layout_holds_only_default_layers(target8, tmp_path, capsys):
    assert (
        convert(fl.speculators(eagle_head(target8, ids=[1, 3, 6]), tmp_path / "s", str(target8)), tmp_path / "r") == 0
    )
    assert convert(tmp_path / "r", tmp_path / "e3", "--to", "eagle3") == 1
    assert "default layers [2, 4, 5]" in capsys.readouterr().err and not (tmp_path / "e3").exists()


def test_an_ibm_mlp_speculator_round_trips(target8, tmp_path):
    from draftsmith.train.heads.mlp_speculator import MLPSpeculator, MLPSpeculatorConfig

    torch.manual_seed(2)
    head = MLPSpeculator(MLPSpeculatorConfig(emb_dim=64, vocab_size=49152, inner_dim=32, n_predict=3))
    src = fl.ibm_mlp(head, tmp_path / "ibm")
    assert convert(src, tmp_path / "run", "--target", target8) == 0
    family, cfg, state, _ = read_head(tmp_path / "run")
    assert family.name == "mlp_speculator" and cfg["n_predict"] == 3 and cfg["inner_dim"] == 32
    ours = head.trainable_state_dict()
    assert sorted(state) == sorted(ours) and all(torch.equal(state[k], ours[k]) for k in ours)
    assert convert(tmp_path / "run", tmp_path / "vllm", "--to", "vllm") == 0
    (tmp_path / "vllm" / "draftsmith.json").unlink()
    assert convert(tmp_path / "vllm", tmp_path / "back", "--target", target8) == 0
    assert all(torch.equal(read_head(tmp_path / "back")[2][k], ours[k]) for k in ours)


@pytest.mark.parametrize(
    "fault,expect",
    [
        ("eagle1", "EAGLE-1/2 / HASS layout"),
        ("speculators_eagle", "speculators_model_type 'eagle'"),
        ("no_lm_head", "no lm_head.weight"),
        ("unknown_key", "not part of an EAGLE-3 head ['layers.0.self_attn.rotary.weight']"),
        ("d2t_disagree", "d2t and t2d disagree"),
        ("bad_bin", "unreadable weights file"),
        ("modelopt_no_aux", "use_aux_hidden_state: false"),
        ("modelopt_parallel", "parallel_draft_step: 2"),
        ("modelopt_no_last_norm", "use_last_layernorm: false"),
    ],
)
def test_what_cannot_be_mapped_is_refused_naming_the_key(target8, tmp_path, capsys, fault, expect):
    head = eagle_head(target8)
    src = fl.speculators(head, tmp_path / "src", str(target8))
    tensors = load_file(src / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    if fault.startswith("modelopt"):
        shutil.rmtree(src)
        fl.modelopt(head, src)
        config = json.loads((src / "config.json").read_text())
        flag = {"no_aux": ("use_aux_hidden_state", False), "parallel": ("parallel_draft_step", 2),
                "no_last_norm": ("use_last_layernorm", False)}[fault.removeprefix("modelopt_")]  # fmt: skip
        config["eagle_config"][flag[0]] = flag[1]
        tensors = load_file(src / "model.safetensors")
    if fault == "eagle1":
        shutil.rmtree(src)
        fl.eagle1(src)
    elif fault == "speculators_eagle":
        config["speculators_model_type"] = "eagle"
    elif fault == "no_lm_head":
        del tensors["lm_head.weight"]
    elif fault == "unknown_key":
        tensors["layers.0.self_attn.rotary.weight"] = torch.zeros(4)
    elif fault == "d2t_disagree":
        t2d = tensors["t2d"].clone()  # one marked id moved: as many ids as rows, not the ones d2t names
        t2d[tensors["t2d"].nonzero()[0]] = False
        t2d[(~tensors["t2d"]).nonzero()[0]] = True
        tensors["t2d"] = t2d
    elif fault == "bad_bin":
        (src / "model.safetensors").write_bytes(b"\x00" * 40)
    if fault not in ("eagle1", "bad_bin"):
        save_file(tensors, src / "model.safetensors")
        (src / "config.json").write_text(json.dumps(config))
    assert convert(src, tmp_path / "run", "--target", target8) == 1
    err = capsys.readouterr().err
    assert expect in err and "Traceback" not in err and not (tmp_path / "run").exists(), err


def test_a_converted_head_trains_from_its_weights(target8, tmp_path, capsys):
    from test_train import conversations

    head = eagle_head(target8, ids=[1, 3, 6])
    src = fl.specforge(head, tmp_path / "sf", target_embed(target8))
    run = tmp_path / "converted"
    assert convert(src, run, "--target", target8, "--from", "specforge") == 0
    hint = next(line for line in capsys.readouterr().out.splitlines() if "head.init_from=" in line)
    overrides = [a for a in hint.split() if a.startswith(("head.", "target.aux"))]
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in conversations(24)))
    out = tmp_path / "trained"
    args = [sys.executable, str(ROOT / "train" / "run.py"), "conf=eagle3_smollm2", f"target.name_or_path={target8}",
            "target.hidden_size=64", "target.num_hidden_layers=8", "target.vocab_size=49152", f"data.path={data}",
            "data.also=[]", "data.num_conversations=20", "data.heldout=4", "data.max_length=96",
            "data.max_tokens_per_batch=512", "data.max_batch_size=4", "data.features=online", "optim.max_steps=3",
            "optim.warmup_steps=1", "optim.max_minutes=null", "eval_every=0", "save_every=3", "wandb.mode=disabled",
            f"output_dir={out}", *overrides]  # fmt: skip
    p = subprocess.run(args, capture_output=True, text=True, timeout=600, env={**os.environ, "WANDB_MODE": "disabled"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert f"weights from head.init_from={run}" in p.stdout + p.stderr
    start, end = read_head(run)[2], read_head(out)[2]
    assert torch.equal(start["d2t"], end["d2t"])  # the converted head's draft vocab, not one built from this data
    moved = (end["fc.weight"] - start["fc.weight"]).abs().max().item()
    assert 0 < moved < 0.1 * start["fc.weight"].abs().max().item()  # trained a little, from those weights

    # head.init_from also takes an export of ours as it is, and sends a foreign directory to convert first
    exported = tmp_path / "exported"
    assert convert(run, exported, "--to", "vllm", "--k", "3") == 0
    again = [a.replace(str(run), str(exported)) for a in args if not a.startswith("output_dir=")]
    p = subprocess.run([*again, f"output_dir={tmp_path / 'from_export'}", "optim.max_steps=1"], capture_output=True,
                       text=True, timeout=600, env={**os.environ, "WANDB_MODE": "disabled"})  # fmt: skip
    assert p.returncode == 0 and f"weights from head.init_from={exported}" in p.stdout + p.stderr, p.stderr[-3000:]
    foreign = [a.replace(str(run), str(src)) for a in args if not a.startswith("output_dir=")]
    p = subprocess.run([*foreign, f"output_dir={tmp_path / 'from_foreign'}"], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "WANDB_MODE": "disabled"})  # fmt: skip
    assert p.returncode == 2 and "convert it first" in p.stderr and "Traceback" not in p.stderr, p.stderr[-3000:]


# ---------------------------------------------------------------- doctor: static checks, one injected fault each


@pytest.fixture
def good(target8, tmp_path):
    head = eagle_head(target8, ids=[1, 3, 6])
    return head, fl.speculators(head, tmp_path / "good", str(target8))


def test_doctor_raises_no_alarm_on_a_good_head(good, target8, capsys):
    code, out = doctor(capsys, good[1], "--target", target8)
    assert code == 0 and "FAIL" not in out and "WARN" not in out, out
    assert "nothing found that lowers acceptance" in out


def test_doctor_says_how_vllm_misreads_a_model_optimizer_export(target8, tmp_path, capsys):
    src = fl.modelopt(eagle_head(target8, ids=[1, 3, 6]), tmp_path / "mo")  # hooks layers 0, 2, 5
    code, out = doctor(capsys, src, "--target", target8)
    assert code == 0 and "FAIL" not in out, out
    assert "WARN  aux_layer_ids: a Model-Optimizer export" in out and "read here as [1, 3, 6]" in out, out


def _fault(src: Path, tensors=None, config=None) -> Path:
    t = load_file(src / "model.safetensors")
    c = json.loads((src / "config.json").read_text())
    if tensors:
        tensors(t)
    if config:
        config(c)
    save_file(t, src / "model.safetensors")
    (src / "config.json").write_text(json.dumps(c))
    return src


def test_doctor_writes_the_fixed_head_only_where_nothing_is_lost(good, target8, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    code, out = doctor(capsys, good[1], "--target", target8, "--write-fixed", mine)
    assert code == 2 and "non-empty directory" in out and (mine / "notes.txt").read_text() == "keep me", out
    code, out = doctor(capsys, good[1], "--target", target8, "--write-fixed", tmp_path / "fixed")
    assert code == 0 and same_head(tmp_path / "fixed", good[0]).name == "eagle3", out


def test_doctor_names_random_embeddings(target8, tmp_path, capsys):
    head = eagle_head(target8, ids=[1, 3, 6])
    ok = fl.specforge(head, tmp_path / "ok", target_embed(target8))
    code, out = doctor(capsys, ok, "--target", target8, "--from", "specforge")
    assert code == 0 and "carries the target's embed_tokens" in out, out
    bad = fl.specforge(head, tmp_path / "bad", target_embed(target8), embed=torch.randn_like(target_embed(target8)))
    code, out = doctor(capsys, bad, "--target", target8, "--from", "specforge")
    assert code == 1 and "FAIL  embed_tokens" in out and "random" in out, out


def test_doctor_names_d2t_that_does_not_invert_t2d(good, target8, capsys):
    def swap(t):
        t["d2t"][3] += 1  # draft row 3 now points at a target id t2d does not mark

    code, out = doctor(capsys, _fault(good[1], tensors=swap), "--target", target8)
    assert code == 2 and "FAIL  d2t" in out and "disagree" in out, out


def test_doctor_names_a_vocab_of_another_target(good, target8, capsys):
    def widen(t):
        t["t2d"] = torch.cat([t["t2d"], torch.zeros(64, dtype=torch.bool)])

    code, out = doctor(capsys, _fault(good[1], tensors=widen, config=lambda c: c["transformer_layer_config"].update(
        vocab_size=49216)), "--target", target8)  # fmt: skip
    assert code == 1 and "FAIL  widths: vocab_size head=49216 target=49152" in out, out


def test_doctor_names_a_hidden_width_of_another_target(good, target8, capsys):
    def narrow(t):
        t["fc.weight"] = t["fc.weight"][:, :96].contiguous()  # fc over 3 x 32 aux channels: a 32-wide target's

    code, out = doctor(capsys, _fault(good[1], tensors=narrow, config=lambda c: c.update(target_hidden_size=32)),
                       "--target", target8)  # fmt: skip
    assert code == 1 and "FAIL  widths: target_hidden_size head=32 target=64" in out, out


def test_doctor_names_aux_layers_past_the_targets_depth(good, target8, capsys):
    code, out = doctor(capsys, _fault(good[1], config=lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 3, 9])),
                       "--target", target8)  # fmt: skip
    assert code == 1 and "FAIL  widths: aux layers [9] beyond 8" in out, out


def test_doctor_names_a_rope_theta_that_is_not_the_targets(good, target8, capsys):
    code, out = doctor(capsys, _fault(good[1], config=lambda c: c["transformer_layer_config"].update(
        rope_theta=500000.0)), "--target", target8)  # fmt: skip
    assert "WARN  rope: rope_theta head=500000 target=10000" in out, out


def test_doctor_names_a_chat_template_that_is_not_the_targets(good, target8, capsys, tokenizer):
    src = good[1]
    tokenizer.save_pretrained(src)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    (src / "tokenizer_config.json").write_text(json.dumps(cfg))
    (src / "chat_template.jinja").unlink(missing_ok=True)
    code, out = doctor(capsys, src, "--target", target8)
    assert code == 1 and "FAIL  chat_template" in out, out


def test_doctor_names_weights_saturated_in_float16(good, target8, capsys):
    def saturate(t):
        t["fc.weight"] = t["fc.weight"].half()
        t["fc.weight"][0, 0] = 65504.0

    code, out = doctor(capsys, _fault(good[1], tensors=saturate), "--target", target8)
    assert code == 1 and "FAIL  dtype: fc.weight" in out, out


def test_doctor_names_a_draft_vocab_size_that_is_not_lm_heads(good, target8, capsys):
    code, out = doctor(capsys, _fault(good[1], config=lambda c: c.update(draft_vocab_size=512)), "--target", target8)
    assert code == 2 and "draft_vocab_size 512, but lm_head.weight has 256 rows" in out, out

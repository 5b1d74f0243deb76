"""Read a draft head in any layout in use as a draftsmith head: (family, config, tensors under our checkpoint keys).

    from draftsmith.convert.layouts import read_any
    head = read_any("EAGLE3-LLaMA3.1-Instruct-8B", target_config)   # layout detected; --from names it when it can't be
    head.family, head.config, head.state, head.extra, head.notes

Layouts (docs/convert.md has the mapping table):

* draftsmith  our run dirs, checkpoints and exports (either dialect), read as they are.
* speculators config.json `speculators_model_type: eagle3 | peagle`, tensors `layers.{i}.*`; aux ids
              `eagle_aux_hidden_state_layer_ids` in vLLM's numbering; norm_before_residual absent = vLLM's default
              (true for eagle3, false for peagle).
* eagle3      the EAGLE-3 release layout (`LlamaForCausalLMEagle3`, `midlayer.*`, pytorch_model.bin or safetensors)
              with no aux ids in config.json: every project's default, (2, n//2, n-3) in vLLM's numbering. SpecForge
              writes this layout too when its run kept the default layers.
* specforge   the same layout with `eagle_config.eagle_aux_hidden_state_layer_ids` counted as SpecForge and SGLang
              capture them: the layer whose *output* is taken. vLLM counts the layer whose input is taken, so
              vLLM's id = SpecForge's + 1 (SGLang adds the 1 itself; vLLM reading their number drafts from the wrong
              layers).
* vllm        the same layout with those ids in vLLM's numbering (vLLM's own `LlamaForCausalLMEagle3` configs).
* modelopt    NVIDIA Model-Optimizer's EAGLE-3 export: `LlamaForCausalLMEagle3` with its own `eagle_config` flags
              (`use_aux_hidden_state`, `use_last_layernorm`, `parallel_draft_step`, ...), tensors `layers.{i}.*`,
              `d2t` without `t2d`. Its ids are the layers it hooks (the output of layer i), SpecForge's numbering.
* mlp         IBM's HF `MLPSpeculatorPreTrainedModel` (`speculator.{emb,proj,ln,head}.{i}.*`).

EAGLE-1/2 and HASS heads (one hidden state in, `fc` over [embedding, hidden] with a bias, no draft vocab) and the
other speculators algorithms are recognised and refused: no draftsmith family has their shape. A checkpoint's
`embed_tokens.weight` is not part of a draftsmith head (it borrows the target's, frozen, as vLLM does when the key is
absent); it is kept in `extra` for the doctor, which compares it with the target's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError

EAGLE3_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Qwen3ForCausalLMEagle3", "Eagle3Qwen3ForCausalLM")
MLP_ARCH = "MLPSpeculatorPreTrainedModel"
LAYOUTS = ("draftsmith", "speculators", "eagle3", "specforge", "vllm", "modelopt", "mlp")
IDS_LAYOUTS = ("specforge", "vllm")  # the two readings of eagle_config's aux ids in a LlamaForCausalLMEagle3 config
# eagle_config keys only Model-Optimizer's export writes (its config template): they name the layout
# (not use_aux_hidden_state: vLLM's own configs write it too)
MODELOPT_KEYS = ("use_last_layernorm", "use_input_layernorm_in_first_layer", "use_mtp_layernorm", "next_layer_regular",
                 "parallel_draft_step")  # fmt: skip


class ConvertError(DraftsmithError, ValueError):
    """A head that cannot be read as a draftsmith head; the message names the file and the key."""


@dataclass
class ForeignHead:
    layout: str
    family: str  # eagle3 | peagle | mlp_speculator
    config: dict  # the family's config dict: families.get(family).config(**config)
    state: dict[str, torch.Tensor]  # under the checkpoint keys (what head.safetensors holds)
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # read, not part of the head (embed_tokens)
    notes: list[str] = field(default_factory=list)  # each mapping applied, in words
    source: dict = field(default_factory=dict)  # their config.json


def load_weights(src: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a HF-style directory: model.safetensors, sharded safetensors, or pytorch_model*.bin."""
    from safetensors.torch import load_file

    files = sorted(src.glob("*.safetensors"))
    files = [f for f in files if f.name != "draft_vocab.safetensors"] or sorted(src.glob("pytorch_model*.bin"))
    if not files:
        raise ConvertError(
            f"{src}: no model.safetensors, *.safetensors shards or pytorch_model.bin to read weights from"
        )
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            part = load_file(f) if f.suffix == ".safetensors" else torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:  # a truncated file or a pickle with code in it
            raise ConvertError(f"{f}: unreadable weights file ({type(e).__name__}: {e})") from None
        tensors.update(part)
    return tensors


def read_config(src: Path) -> dict:
    path = src / "config.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConvertError(f"{src}: no config.json (not a head directory)") from None
    except (OSError, ValueError) as e:
        raise ConvertError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConvertError(f"{path}: not a JSON object")
    return data


def _ours(src: Path) -> bool:
    return (src / "draftsmith.json").is_file() or (src / "head.json").is_file() or (src / "checkpoints").is_dir()


def detect(src: str | Path) -> str:
    """The layout of `src`; ConvertError saying what it is and why it cannot be read, or what to pass as --from."""
    src = Path(src)
    if not src.is_dir():
        raise ConvertError(f"{src}: not a directory")
    if _ours(src):
        return "draftsmith"
    cfg = read_config(src)
    archs = cfg.get("architectures") or []
    kind = cfg.get("speculators_model_type")
    if kind is not None:
        if kind in ("eagle3", "peagle"):
            return "speculators"
        raise ConvertError(
            f"{src}/config.json: speculators_model_type {kind!r}: draftsmith reads the speculators eagle3 and peagle "
            "heads (its EAGLE-3 and P-EAGLE families); "
            + (
                "an EAGLE-1/2 or HASS head drafts from one hidden state through fc over [embedding, hidden]: no "
                "draftsmith family has that shape (vLLM serves it with method eagle as it is)"
                if kind == "eagle"
                else f"{kind!r} has no draftsmith family"
            )
        )
    if cfg.get("model_type") == "mlp_speculator" or MLP_ARCH in archs:
        return "mlp"
    if any(a in EAGLE3_ARCHS for a in archs):
        eagle = cfg.get("eagle_config") or {}
        if any(k in eagle for k in MODELOPT_KEYS):
            return "modelopt"
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        if ids is None:
            return "eagle3"
        raise ConvertError(
            f"{src}/config.json: eagle_config.eagle_aux_hidden_state_layer_ids = {ids} can be read two ways. "
            "SpecForge and SGLang count the layer whose output is captured; vLLM counts the layer whose input is "
            "(vLLM's id = SpecForge's + 1). Pass --from specforge for a SpecForge-trained head, --from vllm for ids "
            "in vLLM's numbering; a wrong guess drafts from neighbouring layers (`draftsmith doctor` measures both)."
        )
    if "LlamaForCausalLM" in archs and cfg.get("num_hidden_layers") == 1:
        raise ConvertError(
            f"{src}/config.json: a one-layer LlamaForCausalLM is the EAGLE-1/2 / HASS layout (fc over [embedding, "
            "hidden], one hidden state in): no draftsmith family has that shape; vLLM serves it with method eagle"
        )
    raise ConvertError(
        f"{src}/config.json: architectures {archs} is no draft-head layout draftsmith reads ({', '.join(LAYOUTS)}; "
        "docs/convert.md)"
    )


# ---------------------------------------------------------------- EAGLE-3 family


def default_ids(num_layers: int) -> list[int]:
    from draftsmith.train.target import default_aux_layer_ids

    return default_aux_layer_ids(num_layers)


def _rope(layer: dict) -> tuple[float, dict | None]:
    params = dict(layer.get("rope_parameters") or {})
    scaling = dict(layer.get("rope_scaling") or {}) or {k: v for k, v in params.items() if k != "rope_theta"}
    theta = float(params.get("rope_theta", layer.get("rope_theta", 10000.0)))
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    return theta, (scaling if kind != "default" else None)


def _vocab_maps(state: dict, vocab: int, draft: int, where: str, notes: list[str]) -> None:
    """d2t / t2d in place: both kept when consistent, the missing one derived, an identity for a full-vocab head."""
    d2t, t2d = state.get("d2t"), state.get("t2d")
    if d2t is None and t2d is None:
        if draft != vocab:
            raise ConvertError(
                f"{where}: lm_head has {draft} rows, the target's vocab {vocab}, and there is no d2t or t2d: which "
                "target token each row is cannot be known"
            )
        state["d2t"] = torch.zeros(draft, dtype=torch.long)
        state["t2d"] = torch.ones(vocab, dtype=torch.bool)
        return
    if t2d is None:
        targets = torch.arange(d2t.numel()) + d2t.long()
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[targets.clamp(0, vocab - 1)] = True
        notes.append("t2d derived from d2t")
    if d2t is None:
        ids = t2d.bool().nonzero().flatten()
        d2t = ids - torch.arange(ids.numel())
        notes.append("d2t derived from t2d")
    state["d2t"], state["t2d"] = d2t.long(), t2d.bool()
    if state["d2t"].numel() != draft:
        raise ConvertError(f"{where}: d2t has {state['d2t'].numel()} entries, lm_head {draft} rows")
    if state["t2d"].numel() != vocab:
        raise ConvertError(f"{where}: t2d covers {state['t2d'].numel()} token ids, the target's vocab is {vocab}")
    from draftsmith.export.vllm import ExportError, check_vocab_maps

    try:
        check_vocab_maps(state["d2t"], state["t2d"], type("V", (), {"vocab_size": vocab, "draft_vocab_size": draft}))
    except ExportError as e:
        raise ConvertError(f"{where}: {e}") from None


def _eagle3(src: Path, layout: str, cfg: dict, tensors: dict, target_config, notes: list[str]) -> ForeignHead:
    """An EAGLE-3 / P-EAGLE head from a speculators or LlamaForCausalLMEagle3 config and its tensors."""
    from draftsmith.train.heads.eagle3 import Eagle3Config

    where = f"{src} ({layout} layout)"
    speculators = layout == "speculators"
    layer = cfg["transformer_layer_config"] if speculators else cfg
    eagle = cfg.get("eagle_config") or {}
    parallel = cfg.get("speculators_model_type") == "peagle" or (
        not speculators and cfg.get("mask_token_id") is not None
    )
    n_target = target_config.num_hidden_layers
    if speculators:
        ids = cfg.get("eagle_aux_hidden_state_layer_ids")
        nbr = cfg.get("norm_before_residual", not parallel)  # vLLM's defaults for an absent key
        if "norm_before_residual" not in cfg:
            notes.append(f"norm_before_residual absent: {nbr}, as vLLM serves it")
    else:
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        nbr = cfg.get("norm_before_residual", False)
        if layout in ("specforge", "modelopt") and ids is not None:
            who = "SpecForge's" if layout == "specforge" else "Model-Optimizer's (the layers it hooks)"
            notes.append(f"aux ids {list(ids)} in {who} numbering -> {[i + 1 for i in ids]} in vLLM's")
            ids = [i + 1 for i in ids]
        if layout == "modelopt":
            _modelopt_flags(src, eagle, notes)
    if ids is None:
        ids = default_ids(n_target)
        notes.append(f"no aux ids recorded: the EAGLE-3 default {ids} for a {n_target}-layer target")
    if cfg.get("norm_output") and parallel:
        notes.append("norm_output dropped: a P-EAGLE head's later steps read mask slots, not the step before")
    if cfg.get("norm_output") and layout == "specforge":
        notes.append("norm_output (SpecForge: lm_head reads the normed state, as every draftsmith head does) dropped")
    # their keys -> ours: midlayer.* is layer 0; later layers' hidden_norm exists only for vLLM's loader
    state, extra = {}, {}
    num_layers = int(layer.get("num_hidden_layers", 1))
    unused = {f"layers.{i}.hidden_norm.weight" for i in range(1, num_layers)}
    for name, t in tensors.items():
        name = name.removeprefix("model.")
        if name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer.") :]
        if name == "embed_tokens.weight":
            extra[name] = t
        elif name not in unused:
            state[name] = t
    if "lm_head.weight" not in state:
        raise ConvertError(f"{where}: no lm_head.weight (a head that shares the target's output layer is not EAGLE-3)")
    if "fc.weight" not in state:
        raise ConvertError(f"{where}: no fc.weight (the projection of the target's aux states)")
    draft = int(cfg.get("draft_vocab_size") or state["lm_head.weight"].shape[0])
    vocab = int(state["t2d"].numel() if "t2d" in state else layer.get("vocab_size", target_config.vocab_size))
    if state["lm_head.weight"].shape[0] != draft:
        raise ConvertError(
            f"{where}: draft_vocab_size {draft}, but lm_head.weight has {state['lm_head.weight'].shape[0]} rows"
        )
    target_hidden = int(cfg.get("target_hidden_size") or state["fc.weight"].shape[1] // len(ids))
    theta, scaling = _rope(layer)
    H = int(layer["hidden_size"])
    heads = int(layer["num_attention_heads"])
    ttt = 3
    if speculators:
        methods = (cfg.get("speculators_config") or {}).get("proposal_methods") or [{}]
        ttt = int(methods[0].get("speculative_tokens") or 3)
    config = Eagle3Config(
        hidden_size=H,
        num_attention_heads=heads,
        num_key_value_heads=int(layer.get("num_key_value_heads") or heads),
        head_dim=int(layer.get("head_dim") or H // heads),
        intermediate_size=int(layer["intermediate_size"]),
        vocab_size=vocab,
        draft_vocab_size=draft,
        target_hidden_size=target_hidden,
        aux_layer_ids=[int(i) for i in ids],
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(layer.get("max_position_embeddings", 2048)),
        norm_before_residual=bool(nbr),
        norm_before_fc=bool(eagle.get("norm_before_fc", cfg.get("norm_before_fc", False))),
        fc_norm=bool(cfg.get("fc_norm", False)),
        norm_output=bool(cfg.get("norm_output", False)) and layout != "specforge" and not parallel,
        hidden_act=str(layer.get("hidden_act", "silu")),
        num_layers=num_layers,
        ttt_steps=ttt,
        parallel_drafting=parallel,
        mask_token_id=cfg.get("mask_token_id") if parallel else None,
        target_model_type=target_config.model_type,
        target={
            "name_or_path": getattr(target_config, "_name_or_path", ""),
            "architectures": list(getattr(target_config, "architectures", None) or []),
            "num_hidden_layers": n_target,
            "model_type": target_config.model_type,
        },
    )
    _vocab_maps(state, vocab, draft, where, notes)
    check_tensors(config, state, where)
    return ForeignHead(layout, "peagle" if parallel else "eagle3", config.to_dict(), state, extra, notes, cfg)


def _modelopt_flags(src: Path, eagle: dict, notes: list[str]) -> None:
    """Model-Optimizer's eagle_config flags: the EAGLE-3 wiring passes, any other is refused naming the flag."""
    wrong = []
    if eagle.get("use_aux_hidden_state") is False:
        wrong.append("use_aux_hidden_state: false (an EAGLE-1/2 head: one hidden state in, no fc over aux layers)")
    if eagle.get("use_last_layernorm") is False:
        wrong.append("use_last_layernorm: false (no final norm before lm_head; every EAGLE-3 head has one)")
    if eagle.get("use_mtp_layernorm"):
        wrong.append("use_mtp_layernorm: true (MTP-style norms)")
    if int(eagle.get("parallel_draft_step") or 1) > 1:
        wrong.append(f"parallel_draft_step: {eagle['parallel_draft_step']} (Medusa-style parallel heads)")
    if wrong:
        raise ConvertError(
            f"{src}/config.json: Model-Optimizer eagle_config {'; '.join(wrong)}: no draftsmith family has that wiring"
        )
    notes.append("Model-Optimizer export: lm_head and d2t as written, t2d derived, the target's embeddings borrowed")


def check_tensors(config, state: dict, where: str) -> None:
    """Exactly the tensors an EAGLE-3 head of `config` has, at its shapes; ConvertError naming the keys otherwise."""
    from draftsmith.export.vllm import expected_shapes, unused_norms

    want = {k: v for k, v in expected_shapes(config).items() if k not in unused_norms(config.num_layers)}
    want.setdefault("d2t", (config.draft_vocab_size,))
    want.setdefault("t2d", (config.vocab_size,))
    missing, extra = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or extra:
        raise ConvertError(
            f"{where}: tensors that cannot be mapped: missing {missing or 'none'}, not part of an EAGLE-3 head "
            f"{extra or 'none'} (config flags decide some of them: norm_before_fc -> input_norm, fc_norm -> "
            "fc_norm.i, P-EAGLE -> mask_hidden)"
        )
    wrong = {k: (tuple(state[k].shape), v) for k, v in want.items() if tuple(state[k].shape) != tuple(v)}
    if wrong:
        raise ConvertError(f"{where}: tensor shapes differ from the config's (got, want): {wrong}")


# ---------------------------------------------------------------- MLP speculator


def _mlp(src: Path, cfg: dict, tensors: dict, target_config, notes: list[str]) -> ForeignHead:
    from draftsmith.export.mlp import expected_shapes
    from draftsmith.train.heads.mlp_speculator import MLPSpeculatorConfig

    where = f"{src} (mlp layout)"
    state = {k.removeprefix("speculator."): v for k, v in tensors.items()}
    vocab_file = src / "draft_vocab.safetensors"
    if vocab_file.is_file():
        from safetensors.torch import load_file

        state.update(load_file(vocab_file))
    try:
        config = MLPSpeculatorConfig(
            emb_dim=int(cfg["emb_dim"]),
            vocab_size=int(cfg["vocab_size"]),
            inner_dim=int(cfg.get("inner_dim") or 0),
            n_predict=int(cfg["n_predict"]),
            tie_weights=bool(cfg.get("tie_weights", False)),
            scale_input=bool(cfg.get("scale_input", False)),
            draft_vocab_size=int(cfg.get("draft_vocab_size") or 0),
            target={
                "name_or_path": getattr(target_config, "_name_or_path", ""),
                "architectures": list(getattr(target_config, "architectures", None) or []),
                "num_hidden_layers": target_config.num_hidden_layers,
            },
        )
    except KeyError as e:
        raise ConvertError(f"{src}/config.json: an MLP speculator config needs {e.args[0]!r}") from None
    want = expected_shapes(config)
    if config.tie_weights:  # a loader that saved every stage's copy of a tied tensor: keep stage 0's, check the rest
        for name in [k for k in state if k not in want and k.split(".")[0] in ("emb", "ln", "proj")]:
            base = name.split(".")
            base[1] = "0" if base[0] != "proj" else "1"
            if ".".join(base) in state and torch.equal(state[".".join(base)], state[name]):
                del state[name]
                notes.append(f"{name}: a tied copy of {'.'.join(base)}, dropped")
    maps = {k: state.pop(k) for k in ("d2t", "t2d") if k in state}
    missing, extra = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or extra:
        raise ConvertError(
            f"{where}: tensors that cannot be mapped: missing {missing or 'none'}, unexpected {extra or 'none'}"
        )
    wrong = {k: (tuple(state[k].shape), v) for k, v in want.items() if tuple(state[k].shape) != tuple(v)}
    if wrong:
        raise ConvertError(f"{where}: tensor shapes differ from the config's (got, want): {wrong}")
    if config.reduced:
        if not maps:
            raise ConvertError(f"{where}: heads of {config.draft_vocab_size} rows but no draft_vocab.safetensors map")
        _vocab_maps(maps, config.vocab_size, config.draft_vocab_size, where, notes)
        state.update(maps)
    return ForeignHead("mlp", "mlp_speculator", config.to_dict(), state, {}, notes, cfg)


# ---------------------------------------------------------------- any


def read_any(src: str | Path, target_config, layout: str | None = None) -> ForeignHead:
    """The head at `src` in `layout` (detected when None) as a draftsmith head for `target_config`'s target."""
    src = Path(src)
    found = None
    if layout is None or layout == "draftsmith":
        found = detect(src) if layout is None else "draftsmith"
    if layout in IDS_LAYOUTS or layout in ("eagle3", "speculators", "modelopt", "mlp"):
        read_config(src)  # a clear error for a directory without one
        found = layout
    if found is None:
        raise ConvertError(f"--from {layout!r}: one of {', '.join(LAYOUTS)}")
    notes: list[str] = []
    if found == "draftsmith":
        from draftsmith.train.checkpoint import read_head

        family, config, state, _ = read_head(src)
        return ForeignHead("draftsmith", family.name, dict(config), dict(state), {}, ["read as it is"], {})
    cfg = read_config(src)
    tensors = load_weights(src)
    bad = [k for k, t in tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise ConvertError(f"{src}: NaN or inf in {', '.join(sorted(bad)[:4])}")
    if found == "mlp":
        return _mlp(src, cfg, tensors, target_config, notes)
    if found == "speculators" and cfg.get("speculators_model_type") not in ("eagle3", "peagle"):
        raise ConvertError(f"{src}/config.json: --from speculators needs speculators_model_type eagle3 or peagle")
    if found == "eagle3" and (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") is not None:
        raise ConvertError(f"{src}/config.json: records aux ids in eagle_config: pass --from specforge or --from vllm")
    return _eagle3(src, found, cfg, tensors, target_config, notes)

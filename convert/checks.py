"""The doctor's static checks: a head (as `layouts.read_any` gives it, plus its directory) against its target's files.

Each check returns findings: `Finding(level, key, text)`, level `fail` (a known cause of low or no acceptance),
`warn` (worth knowing, measured where it can be) or `ok`. The measured checks are in doctor.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from draftsmith.convert.layouts import ForeignHead

FP16_MAX = 65504.0


@dataclass
class Finding:
    level: str  # ok | warn | fail
    key: str  # what it is about: embed_tokens, d2t, aux_layer_ids, rope, widths, tokenizer, dtype, ...
    text: str

    def line(self) -> str:
        return f"{self.level.upper():<4}  {self.key}: {self.text}"


def embeddings(head: ForeignHead, target_embed: torch.Tensor) -> list[Finding]:
    own = head.extra.get("embed_tokens.weight")
    if head.family == "mlp_speculator":
        return []  # the speculator's embeddings are its own weights, trained with it
    if own is None:
        return [Finding("ok", "embed_tokens", "not in the checkpoint: vLLM and draftsmith share the target's")]
    if tuple(own.shape) != tuple(target_embed.shape):
        return [Finding("fail", "embed_tokens", f"the checkpoint's embed_tokens.weight is {tuple(own.shape)}, the "
                        f"target's {tuple(target_embed.shape)}: vLLM refuses or mis-reads it")]  # fmt: skip
    a, b = own.float(), target_embed.float()
    if torch.allclose(a, b, rtol=1e-2, atol=1e-3):
        return [
            Finding("ok", "embed_tokens", "the checkpoint carries the target's embed_tokens (vLLM loads this copy)")
        ]
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1).mean().item()
    kind = "random (rows unrelated to the target's)" if abs(cos) < 0.2 else "not the target's"
    return [
        Finding(
            "fail",
            "embed_tokens",
            f"the checkpoint's embed_tokens.weight is {kind}: mean row cosine {cos:.3f} with the target's. vLLM loads "
            "the checkpoint's copy when the key is there, so the head reads other embeddings than it should; the "
            "fix drops it (the target's are shared). Measured below with and without the fix.",
        )
    ]


def widths(head: ForeignHead, target_config) -> list[Finding]:
    from draftsmith.train.heads import families

    out = [Finding("fail", "widths", p) for p in families.get(head.family).target_problems(head.config, target_config)]
    c = head.config
    if head.family != "mlp_speculator" and c["hidden_size"] != target_config.hidden_size:
        out.append(Finding("fail", "widths", f"hidden_size head={c['hidden_size']} target={target_config.hidden_size}:"
                           " the draft layer reads the target's embeddings, which are target-wide"))  # fmt: skip
    if not out:
        vd = c.get("draft_vocab_size")
        out.append(Finding("ok", "widths", f"vocab {c['vocab_size']}, draft vocab {vd}, target hidden "
                           f"{target_config.hidden_size} fit"))  # fmt: skip
    return out


def aux_ids(head: ForeignHead, target_config) -> list[Finding]:
    if head.family == "mlp_speculator":
        return []
    from draftsmith.convert.layouts import default_ids

    ids, n = head.config["aux_layer_ids"], target_config.num_hidden_layers
    note = "the EAGLE-3 default" if ids == default_ids(n) else "not the default " + str(default_ids(n))
    return [Finding("ok", "aux_layer_ids", f"{ids} in vLLM's numbering ({note}); the measurement tries ±1")]


def rope(head: ForeignHead, target_config) -> list[Finding]:
    if head.family == "mlp_speculator":
        return []
    from draftsmith.train.heads.eagle3 import Eagle3Config

    theirs = Eagle3Config.from_target(target_config, 1, [0])
    c = head.config
    out = []
    if abs(float(c["rope_theta"]) - theirs.rope_theta) > 1e-6 * theirs.rope_theta:
        out.append(Finding("warn", "rope", f"rope_theta head={c['rope_theta']:g} target={theirs.rope_theta:g}: a head "
                           "rotates its keys as trained; the measurement tries the target's"))  # fmt: skip
    kind = lambda s: (s or {}).get("rope_type") or (s or {}).get("type") or "default"  # noqa: E731
    if kind(c.get("rope_scaling")) != kind(theirs.rope_scaling):
        out.append(Finding("warn", "rope", f"rope scaling head={kind(c.get('rope_scaling'))} target="
                           f"{kind(theirs.rope_scaling)}"))  # fmt: skip
    if c.get("max_position_embeddings", 0) < theirs.max_position_embeddings:
        text = (f"max_position_embeddings head={c['max_position_embeddings']} < target="
                f"{theirs.max_position_embeddings}: vLLM refuses a max_model_len past the head's")  # fmt: skip
        out.append(Finding("warn", "positions", text))
    return out or [
        Finding("ok", "rope", f"theta {c['rope_theta']:g}, scaling {kind(c.get('rope_scaling'))}: the target's")
    ]


def tokenizer(src: Path, target: str) -> list[Finding]:
    """A head directory that ships a tokenizer: its vocabulary and chat template against the target's."""
    if not (src / "tokenizer_config.json").is_file():
        return []
    from transformers import AutoTokenizer

    mine, theirs = AutoTokenizer.from_pretrained(src), AutoTokenizer.from_pretrained(target)
    out = []
    if mine.get_vocab() != theirs.get_vocab():
        out.append(Finding("fail", "tokenizer", f"{src}'s tokenizer is not the target's ({len(mine)} vs {len(theirs)} "
                           "tokens or other ids): the head was trained on another token stream"))  # fmt: skip
    if (getattr(mine, "chat_template", None) or "") != (getattr(theirs, "chat_template", None) or ""):
        out.append(Finding("fail", "chat_template", f"{src}'s chat template differs from the target's: the head "
                           "learned other prompt formatting than the server renders"))  # fmt: skip
    return out or [Finding("ok", "tokenizer", "the head's tokenizer and chat template are the target's")]


def dtypes(src: Path, head: ForeignHead) -> list[Finding]:
    out = []
    floats = {t.dtype for t in head.state.values() if t.is_floating_point()}
    cfg = head.source
    said = cfg.get("torch_dtype") or (cfg.get("transformer_layer_config") or {}).get("torch_dtype")
    if said and len(floats) == 1 and str(next(iter(floats))).removeprefix("torch.") != said:
        out.append(Finding("warn", "dtype", f"config.json says torch_dtype {said}, the tensors are "
                           f"{str(next(iter(floats))).removeprefix('torch.')}"))  # fmt: skip
    big = [k for k, t in head.state.items() if t.is_floating_point() and t.abs().max().item() > FP16_MAX]
    if big:
        out.append(Finding("fail", "dtype", f"{', '.join(big[:3])} hold values beyond float16's range (±65504): "
                           "served in float16 they become inf"))  # fmt: skip
    halves = [k for k, t in head.state.items() if t.dtype == torch.float16 and t.abs().max().item() >= 0.99 * FP16_MAX]
    if halves:
        out.append(Finding("fail", "dtype", f"{', '.join(halves[:3])}: float16 values at the format's limit "
                           "(saturated in a conversion)"))  # fmt: skip
    return out or [
        Finding("ok", "dtype", f"tensors {sorted(str(d).removeprefix('torch.') for d in floats)}, all finite")
    ]


def verifier(src: Path, head: ForeignHead, target: str) -> list[Finding]:
    cfg = head.source
    said = ((cfg.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    if (src / "draftsmith.json").is_file():
        said = json.loads((src / "draftsmith.json").read_text()).get("verifier") or said
    if said and Path(str(said)).name != Path(target).name:
        return [Finding("warn", "target", f"the head records verifier {said!r}; checked against {target!r}")]
    return []

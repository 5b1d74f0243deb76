"""The frozen target: aux hidden states (vLLM's layer convention), final hidden state, logits.

This is the only file that knows transformers internals.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.errors import ConfigError


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's low/mid/high picks in vLLM's convention: (2, n//2, n-3)."""
    ids = [2, num_layers // 2, num_layers - 3]
    if len(set(ids)) != 3 or min(ids) < 0:
        # a shallow target would repeat a layer, and vLLM crashes at start-up on repeated ids
        raise ConfigError(f"target has {num_layers} layers: default aux layers {ids} collide; set target.aux_layer_ids")
    return ids


@dataclass
class Features:
    aux: torch.Tensor  # [B, T, n_aux*H] concatenated aux hidden states, low→high
    last: torch.Tensor  # [B, T, H] final post-norm hidden state (MLP speculator input)
    logits: torch.Tensor  # [B, T, V] (or [B, T, Vd] over the draft vocab) target logits; position t predicts t+1
    top: torch.Tensor | None = None  # [B, T] full-vocab argmax, when logits are restricted and it was asked for


def _aux_ids_and_pad(cfg, aux_layer_ids) -> tuple[list[int], int]:
    """The aux layer ids (default: EAGLE-3's picks) checked against the depth, and the pad id."""
    n = cfg.num_hidden_layers
    ids = list(aux_layer_ids) if aux_layer_ids else default_aux_layer_ids(n)
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        raise ConfigError(f"aux layer ids {bad} out of range for a target with {n} decoder layers")
    pad = getattr(cfg, "pad_token_id", None)
    return ids, pad if pad is not None else (cfg.eos_token_id if isinstance(cfg.eos_token_id, int) else 0)


def _ends(t: torch.Tensor) -> torch.Tensor:
    """The first and last 1,024 values of a tensor, rounded to bf16: a cheap identity of a weight."""
    flat = t.detach().reshape(-1)
    return torch.cat([flat[:1024], flat[-1024:]]).to(torch.bfloat16).cpu()


def checkpoint_files(path: str) -> dict[str, str] | None:
    """tensor name -> the safetensors file holding it (one file or a sharded index); None without safetensors."""
    import json
    from pathlib import Path

    root = Path(path)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        return {k: str(root / f) for k, f in json.loads(index.read_text())["weight_map"].items()}
    single = root / "model.safetensors"
    if not single.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as h:
        return {k: str(single) for k in h.keys()}


def stored_weight_ends(files: dict[str, str], dtype: torch.dtype):
    """(name, shape, ends) of every tensor a checkpoint stores, read a few rows at a time: the identity of the weights
    as stored, whatever the model class makes of them in memory (a MoE's experts are fused on load, a tied lm_head
    is not stored)."""
    from safetensors import safe_open

    for name in sorted(files):
        with safe_open(files[name], framework="pt") as h:
            sl = h.get_slice(name)
            shape = tuple(sl.get_shape())
            if not shape:
                continue
            cols = 1 if len(shape) == 1 else int(torch.tensor(shape[1:]).prod())
            k = -(-1024 // cols)  # rows holding the first / last 1,024 values
            head, tail = sl[:k].to(dtype), sl[max(0, shape[0] - k) :].to(dtype)
        flat_head, flat_tail = head.reshape(-1)[:1024], tail.reshape(-1)[-1024:]
        yield name, shape, torch.cat([flat_head, flat_tail]).to(torch.bfloat16)


class Target(nn.Module):
    """A frozen HF causal LM that returns the features a draft head trains on."""

    def __init__(self, model: nn.Module, aux_layer_ids: list[int] | None = None):
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        self.config = model.config
        self.aux_layer_ids, self.pad_id = _aux_ids_and_pad(self.config, aux_layer_ids)
        self.source: str | None = None  # the checkpoint dir it was loaded from (from_pretrained)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def output_weight(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """The lm_head rows of target ids `ids` ([len(ids), H]; all rows for None)."""
        weight = self.lm_head.weight  # [V, H]
        return weight if ids is None else weight[ids]

    def weight_ends(self):
        """What the features fingerprint hashes: the checkpoint's stored tensors when loaded from one (as TargetEnds
        reads them), else every parameter, tied ones once."""
        files = checkpoint_files(self.source) if self.source else None
        if files:
            yield from stored_weight_ends(files, self.dtype)
            return
        for name, p in sorted(self.model.named_parameters()):
            yield name, tuple(p.shape), _ends(p)

    @classmethod
    def from_pretrained(cls, name_or_path: str, aux_layer_ids=None, dtype: torch.dtype = torch.float32) -> "Target":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype)
        target = cls(model, aux_layer_ids)
        target.source = str(name_or_path)
        return target

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Linear:
        return self.model.get_output_embeddings()

    @property
    def norm(self) -> nn.Module:
        return self.model.model.norm

    def decoder_layer(self, idx: int) -> nn.Module:
        return self.model.model.layers[idx]

    @torch.no_grad()
    def features(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        vocab_ids: torch.Tensor | None = None,
        full_top: bool = False,
    ) -> Features:
        """One no-grad forward pass. input_ids: [B, T].

        Args:
            vocab_ids: if given, logits only over these target ids (the draft vocab): [B, T, Vd]. The lm_head
                over the full vocab is the target's most expensive matmul at small H, and the loss needs only these.
            full_top: also return the argmax over the full vocab (exact accuracy when the draft vocab misses tokens).
        """
        out = self.model.model(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False
        )
        hs = out.hidden_states  # n+1 tensors [B, T, H]; hs[k] = residual stream entering layer k (vLLM's id k)
        aux = torch.cat([hs[k] for k in self.aux_layer_ids], dim=-1)  # [B, T, 3H]
        last = out.last_hidden_state  # [B, T, H] post final norm
        weight = self.lm_head.weight  # [V, H]
        logits = F.linear(last, weight if vocab_ids is None else weight[vocab_ids])  # [B, T, V or Vd]
        top = F.linear(last, weight).argmax(-1) if full_top and vocab_ids is not None else None  # [B, T]
        return Features(aux=aux, last=last, logits=logits, top=top)

    def new_cache(self):
        """An empty KV cache for `step` (the reference speculative decoder's incremental forwards)."""
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, cache) -> Features:
        """Incremental forward: input_ids [B, T] continue the sequence held in `cache`, which grows by T."""
        out = self.model.model(input_ids=input_ids, past_key_values=cache, use_cache=True, output_hidden_states=True)
        hs = out.hidden_states  # hs[k]: residual stream entering layer k, [B, T, H]
        aux = torch.cat([hs[k] for k in self.aux_layer_ids], dim=-1)  # [B, T, 3H]
        last = out.last_hidden_state  # [B, T, H]
        return Features(aux=aux, last=last, logits=self.lm_head(last))  # logits [B, T, V]

    @staticmethod
    def truncate_cache(cache, length: int) -> None:
        """Drop cached positions >= length (rejected draft tokens)."""
        extra = cache.get_seq_length() - length
        if extra > 0:
            cache.crop(-extra)  # transformers 5: a negative count removes that many trailing tokens


class TargetEnds(nn.Module):
    """A frozen target without its decoder layers: the embedding, the final norm and the lm_head rows asked for.

    What a training rank needs when the features come from disk (data.features=offline): the head copies the
    embedding, the loss rebuilds the target's logits from the stored final hidden states with the draft vocab's
    lm_head rows, and held-out eval reads stored features too. For a 70B target that is ~2 GB instead of 140.
    Tensors are read from the checkpoint's safetensors files alone (memory-mapped, a slice at a time).
    """

    def __init__(self, path: str, aux_layer_ids=None, dtype: torch.dtype = torch.float32):
        super().__init__()
        from transformers import AutoConfig

        self.path, self._dtype = str(path), dtype
        self.config = AutoConfig.from_pretrained(self.path)
        self.config._name_or_path = self.path
        self.aux_layer_ids, self.pad_id = _aux_ids_and_pad(self.config, aux_layer_ids)
        self._files = self._weight_files()
        self._names = names = self._param_names()
        embed = self._read(names["embed"])  # [V, H]
        self.embed_tokens = nn.Embedding.from_pretrained(embed, freeze=True)
        self.norm = nn.RMSNorm(embed.shape[1], eps=getattr(self.config, "rms_norm_eps", 1e-6))
        with torch.no_grad():
            self.norm.weight.copy_(self._read(names["norm"]))
        self.norm.requires_grad_(False)
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None  # (ids, weight rows) last asked for

    def _weight_files(self) -> dict[str, str]:
        """tensor name -> the safetensors file holding it (one file, or a sharded index)."""
        files = checkpoint_files(self.path)
        if files is None:
            raise ConfigError(
                f"target.name_or_path={self.path}: no model.safetensors (or index) to read the "
                "embedding and lm_head from; offline training reads safetensors checkpoints only"
            )
        return files

    def _param_names(self) -> dict[str, str]:
        """Where the embedding, final norm and lm_head live in this checkpoint (tied: the embedding's)."""
        keys = set(self._files)

        def find(*names: str) -> str | None:
            return next((n for n in names if n in keys), None)

        # Llama / Qwen / Mistral / MoE layouts, then the multimodal wrappers (the text model under language_model)
        prefixes = ("model.", "", "model.language_model.", "language_model.model.", "model.text_model.")
        embed = find(*(p + "embed_tokens.weight" for p in prefixes))
        norm = find(*(p + "norm.weight" for p in prefixes))
        heads = ("lm_head.weight", "language_model.lm_head.weight", "model.lm_head.weight")
        lm_head = find(*heads)
        tied = bool(getattr(self.config.get_text_config(), "tie_word_embeddings", False))
        missing = [
            f"{what} (one of {', '.join(names)})"
            for what, found, names in (
                ("the input embedding", embed, [p + "embed_tokens.weight" for p in prefixes]),
                ("the final norm", norm, [p + "norm.weight" for p in prefixes]),
                ("the lm_head (tie_word_embeddings is false)", lm_head or tied, heads),
            )
            if not found
        ]
        if missing:
            raise ConfigError(
                f"target {self.path}: its safetensors hold no tensor for {'; '.join(missing)}. This checkpoint's "
                "layout is not one offline training reads; data.features=online reads any layout transformers loads"
            )
        lm_head = lm_head or embed  # tied: the embedding is the output matrix
        return {"embed": embed, "norm": norm, "lm_head": lm_head}

    def _read(self, name: str, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Tensor `name` in this target's dtype; with `rows`, only those rows, in that order (8,192 at a time)."""
        from safetensors import safe_open

        with safe_open(self._files[name], framework="pt") as h:
            sl = h.get_slice(name)
            if rows is None:
                return sl[:].to(self._dtype)
            shape = sl.get_shape()
            out = torch.empty(len(rows), *shape[1:], dtype=self._dtype)  # [len(rows), H]
            for a in range(0, shape[0], 8192):
                where = ((rows >= a) & (rows < a + 8192)).nonzero().squeeze(1)  # positions of rows in this chunk
                if where.numel():
                    out[where] = sl[a : min(shape[0], a + 8192)][rows[where] - a].to(self._dtype)
        return out

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def output_weight(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """The lm_head rows of target ids `ids` ([len(ids), H]), read once per id set and kept."""
        if ids is None:
            raise ConfigError(
                "this target was loaded without its full lm_head (offline features); a full-vocab "
                "output needs data.features=online|memory|stream"
            )
        if self._rows is None or not torch.equal(self._rows[0], ids.cpu()):
            self._rows = (
                ids.cpu().clone(),
                self._read(self._names["lm_head"], ids.cpu()).to(self.embed_tokens.weight.device),
            )
        return self._rows[1]

    def weight_ends(self):
        """The same (name, shape, ends) as Target.weight_ends, read from the checkpoint without loading it."""
        return stored_weight_ends(self._files, self._dtype)

    def features(self, *args, **kwargs):
        raise ConfigError(
            "this target was loaded without its decoder layers (data.features=offline): its features "
            "come from the shards; a code path that runs the target needs the whole model"
        )

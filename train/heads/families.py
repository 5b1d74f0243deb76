"""The head families, in one table: everything that differs between EAGLE-3 and the MLP speculator.

    from draftsmith.train.heads import families
    family = families.get(cfg.head.family)          # ConfigError naming the valid families otherwise
    head = family.build(cfg.head, target, vocab)    # training: a fresh head for this target
    objective = family.objective(cfg.head)          # the features it needs and its loss
    family.fields                                   # the target features shards store for it
    family.exporter(state, config, out, ...)        # checkpoint -> vLLM directory
    family.drafter(head)                            # the reference decoder's drafter

Every other module asks this table instead of comparing family names. A new family writes its own pieces (config
dataclass + nn.Module + `target_problems` in train/heads/, a builder, an objective, an exporter, a drafter) and adds
one entry here; no code that runs all families changes. Entries name their callables as "module:attr" strings,
imported on first use: importing the table imports no torch, transformers or vLLM, and train/heads never imports
export/ or eval/ (tests/test_import_contract.py).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from draftsmith.errors import ConfigError


@dataclass(frozen=True)
class Ref:
    """A callable named "module:attr", imported when first called (or loaded)."""

    path: str

    def load(self) -> Any:
        module, attr = self.path.split(":")
        return getattr(importlib.import_module(module), attr)

    def __call__(self, *args, **kwargs):
        return self.load()(*args, **kwargs)


@dataclass(frozen=True)
class Family:
    name: str  # head.family, and the "family" a checkpoint's head.json / an export's draftsmith.json records
    config: Ref  # the head's config dataclass: config(**head_json["config"]); config.load().from_run(cfg.head, ...)
    module: Ref  # its nn.Module: module(config); parameter names are the checkpoint keys
    build: Ref  # build(cfg.head, target, vocab) -> a fresh head for training (vocab is None without draft_vocab)
    objective: Ref  # objective(cfg.head): the target features the loss needs, and the loss (train/objective.py)
    fields: tuple[str, ...]  # target features stored per token in shards, beside input_ids and loss_mask
    target_problems: Ref  # target_problems(config dict, target HF config) -> ["key head=x target=y", ...]
    # exporter(state, config, out, verifier=, dtype=, target_config=, source=, force=, trained_on=, **options)
    exporter: Ref
    export_options: tuple[str, ...]  # the `draftsmith export` options its exporter takes (dialect, k)
    read_export: Ref  # read_export(exported dir) -> (config dict, tensors under the checkpoint keys)
    drafter: Ref  # drafter(head, draft_sampling=, name=): the reference decoder's (eval/reference_decoder.py)
    draft_vocab: bool  # can predict over a draft vocab built from the data (head.draft_vocab_size); else the target's
    stage2: bool  # head.stage=2 trains on the target's own continuations (stage2.*, from head.init_from)
    memory: Ref  # memory(cfg, target HF config, activation bytes) -> (features, head activations) bytes, dry run
    inits: tuple[str, ...]  # the head.init values its `build` knows
    keys: tuple[str, ...]  # the head.* config keys it reads besides head.family and head.init
    shares_features_of: str | None = None  # a family whose stored features (shards, cache) this one reads as they are
    # head.draft_vocab_size 0 (its default) means the target's vocab: the draft vocab is an option, not the format
    draft_vocab_optional: bool = False
    reads_target_logits: bool = True  # its loss reads the target's logits over the draft vocab (lm_head rows)

    @property
    def features_family(self) -> str:
        """The family feature shards and the features cache are recorded under (one extraction serves both
        EAGLE-3 and P-EAGLE)."""
        return self.shares_features_of or self.name

    def uses_draft_vocab(self, head_cfg) -> bool:
        """Whether a run with these head.* keys builds a draft vocab from its data."""
        return self.draft_vocab and not (self.draft_vocab_optional and not head_cfg.get("draft_vocab_size"))

    def problems(self, head_cfg, target_vocab_size: int) -> list[str]:
        """`key=value: why` for every head.* value this family cannot work with (train/config.py)."""
        out = []
        if head_cfg.init not in self.inits:
            out.append(f"head.init={head_cfg.init}: expected one of {' | '.join(self.inits)} for {self.name} heads")
        if self.uses_draft_vocab(head_cfg) and not 1 <= head_cfg.draft_vocab_size <= target_vocab_size:
            full = " or 0 for the target's whole vocab" if self.draft_vocab_optional else ""
            out.append(
                f"head.draft_vocab_size={head_cfg.draft_vocab_size}: the draft vocab is a subset of the target's "
                f"{target_vocab_size} tokens: use 1..{target_vocab_size}{full} (4,096-32,000 is usual)"
            )
        if self.name == "peagle" and getattr(head_cfg, "norm_output", False):
            out.append(
                "head.norm_output=true: a P-EAGLE head's later steps read mask slots, not the step before, so it would "
                "change nothing (and vLLM's peagle reader drops it); it is for family eagle3"
            )
        mask = getattr(head_cfg, "mask_token_id", None)
        if "mask_token_id" in self.keys and mask is not None and not 0 <= mask < target_vocab_size:
            out.append(f"head.mask_token_id={mask}: a token id of the target's vocab, 0..{target_vocab_size - 1}")
        if "freeze_lm_head" in self.keys and getattr(head_cfg, "freeze_lm_head", False) and head_cfg.init == "random":
            out.append(
                "head.freeze_lm_head=true with head.init=random: the draft's output rows would stay noise; freeze them "
                "only when they start from the target's (head.init=output or target)"
            )
        if self.stage2 and head_cfg.stage == 2 and not head_cfg.init_from:
            out.append(
                "head.stage=2 without head.init_from: stage 2 continues a stage-1 head; set "
                "head.init_from=<stage-1 run dir> (or head.init_from=scratch for stage 2 from a fresh head)"
            )
        return out


EAGLE3 = Family(
    name="eagle3",
    config=Ref("draftsmith.train.heads.eagle3:Eagle3Config"),
    module=Ref("draftsmith.train.heads.eagle3:Eagle3Head"),
    build=Ref("draftsmith.train.build:build_eagle3"),
    objective=Ref("draftsmith.train.objective:EagleObjective"),
    fields=("aux", "last"),
    target_problems=Ref("draftsmith.train.heads.eagle3:target_problems"),
    exporter=Ref("draftsmith.export.vllm:export_eagle3"),
    export_options=("dialect", "k"),
    read_export=Ref("draftsmith.export.vllm:read_export"),
    drafter=Ref("draftsmith.eval.reference_decoder:Eagle3Drafter"),
    draft_vocab=True,
    stage2=False,
    memory=Ref("draftsmith.train.memory:eagle3_activation_bytes"),
    # output: the target's final norm + lm_head rows; target: also its last layer, fc = the top aux state
    inits=("random", "output", "target"),
    keys=(
        "draft_vocab_size",
        "ttt_steps",
        "ttt_decay",
        "norm_before_residual",
        "norm_before_fc",
        "fc_norm",
        "norm_output",
        "fc_outlier_ratio",
        "intermediate_size",
        "num_layers",
        "loss",
        "loss_topk",
        "feature_loss",
        "freeze_lm_head",
        "init_from",
    ),
)

# P-EAGLE: an EAGLE-3 head whose draft steps after the first read mask slots, so vLLM drafts all k tokens in one
# forward (`parallel_drafting: true`). Same features, module, vocab and exporter as EAGLE-3; the config's
# parallel_drafting flag (set from head.family) switches the unroll, the export dialect and the reference drafter.
PEAGLE = Family(
    **{
        **{f: getattr(EAGLE3, f) for f in EAGLE3.__dataclass_fields__},
        "name": "peagle",
        "keys": EAGLE3.keys + ("mask_token_id",),
        "shares_features_of": "eagle3",
    }
)

MLP_SPECULATOR = Family(
    name="mlp_speculator",
    config=Ref("draftsmith.train.heads.mlp_speculator:MLPSpeculatorConfig"),
    module=Ref("draftsmith.train.heads.mlp_speculator:MLPSpeculator"),
    build=Ref("draftsmith.train.build:build_mlp_speculator"),
    objective=Ref("draftsmith.train.objective:MLPObjective"),
    fields=("last",),
    target_problems=Ref("draftsmith.train.heads.mlp_speculator:target_problems"),
    exporter=Ref("draftsmith.export.mlp:export_mlp_speculator"),
    export_options=(),
    read_export=Ref("draftsmith.export.mlp:read_export"),
    drafter=Ref("draftsmith.eval.reference_decoder:MLPSpeculatorDrafter"),
    draft_vocab=True,  # head.draft_vocab_size rows per head, mapped back by d2t; 0 (the default) = the target's vocab
    draft_vocab_optional=True,
    reads_target_logits=False,  # per-head cross-entropy against token ids: no lm_head rows
    stage2=True,
    memory=Ref("draftsmith.train.memory:mlp_activation_bytes"),
    inits=("random", "output"),  # output: every head from the target's lm_head, every embedding from its input one
    # ttt_decay is head i's loss weight decay**i here (the key is shared with EAGLE-3's per-step weight)
    keys=(
        "n_predict",
        "inner_dim",
        "tie_weights",
        "scale_input",
        "ttt_decay",
        "stage",
        "init_from",
        "draft_vocab_size",
    ),
)

# DFlash: a block drafter (verified token + block_size - 1 mask slots in one non-causal forward over the context
# of the target's fused aux states). Same stored features and draft vocab as EAGLE-3; its own module, loss, exporter
# and drafter (vLLM method dflash).
DFLASH = Family(
    name="dflash",
    config=Ref("draftsmith.train.heads.dflash:DFlashConfig"),
    module=Ref("draftsmith.train.heads.dflash:DFlashHead"),
    build=Ref("draftsmith.train.build:build_dflash"),
    objective=Ref("draftsmith.train.objective:DFlashObjective"),
    fields=("aux", "last"),
    target_problems=Ref("draftsmith.train.heads.dflash:target_problems"),
    exporter=Ref("draftsmith.export.dflash:export_dflash"),
    export_options=("k",),
    read_export=Ref("draftsmith.export.dflash:read_export"),
    drafter=Ref("draftsmith.eval.reference_decoder:DFlashDrafter"),
    draft_vocab=True,
    stage2=False,
    memory=Ref("draftsmith.train.memory:dflash_activation_bytes"),
    inits=("random", "output"),  # output: the target's final norm + lm_head rows
    keys=(
        "draft_vocab_size",
        "block_size",
        "anchors",
        "ttt_decay",
        "slot_weights",
        "slot_weight_floor",
        "intermediate_size",
        "num_layers",
        "loss",
        "loss_topk",
        "mask_token_id",
        "init_from",
    ),
    shares_features_of="eagle3",
)

FAMILIES = {f.name: f for f in (EAGLE3, PEAGLE, MLP_SPECULATOR, DFLASH)}
NAMES = tuple(FAMILIES)
UNRECORDED = "eagle3"  # the family of a head whose head.json / draftsmith.json names none (made before MLP heads)


def get(name: str | None, where: str | None = None) -> Family:
    """The family called `name`; a ConfigError naming the valid ones otherwise (`where`: the file that recorded
    `name`, when it is not the config's head.family)."""
    if name not in FAMILIES:
        known = " | ".join(NAMES)
        raise ConfigError(
            f"{where}: records head family {name!r}, which this draftsmith does not know ({known})"
            if where
            else f"head.family={name!r}: no such head family; expected one of {known}"
        )
    return FAMILIES[name]

"""Config schemas: one dataclass per Hydra group, registered with ConfigStore.

The YAMLs under conf/ are validated against these at compose time, so a typo such as
`head.tt_steps=3` fails before anything runs, with a message naming the key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING, OmegaConf

from draftsmith.train.heads import families


@dataclass
class TargetConfig:
    name_or_path: str = MISSING  # HF hub id, local HF dir, or "smollm2" (the embedded default)
    hidden_size: int = MISSING  # checked against the loaded target: a preset for the wrong model fails fast
    num_hidden_layers: int = MISSING
    vocab_size: int = MISSING
    # vLLM convention: id k = residual stream entering decoder layer k = HF output_hidden_states[k].
    # None means (2, n//2, n-3).
    aux_layer_ids: Optional[list[int]] = None
    dtype: str = "auto"  # auto = bf16 where it is faster (GPUs with bf16; CPUs where a timed probe says so), else fp32
    # HF config fields beyond the three above (model_type, intermediate_size, heads, ...): lets the dry run build
    # the target on the meta device where no config.json is on disk. Training reads the real config.
    arch: Optional[dict[str, Any]] = None


@dataclass
class HeadConfig:
    """Every head family's keys in one schema (a preset may override any of them whatever its family); which keys a
    family reads, and its own checks, are its entry in train/heads/families.py (`keys`, `problems`)."""

    family: str = "eagle3"  # eagle3 | peagle | mlp_speculator | dflash (train/heads/families.py)
    init: str = "random"  # random | output (from the target's output side) | target (EAGLE-3: also its last layer)
    # the rows of the draft's output, the most frequent supervised tokens (EAGLE-3; the MLP speculator's heads, where
    # 0, its default in conf/head/mlp.yaml, keeps the target's whole vocab: the published HF format)
    draft_vocab_size: int = 32000
    # EAGLE-3 (family eagle3)
    ttt_steps: int = 7  # K: the head is unrolled K steps on its own outputs
    ttt_decay: float = 0.8  # step (EAGLE-3) / head (MLP speculator) i's loss weight is decay**i
    norm_before_residual: bool = False  # EAGLE-3 reference layout; exported explicitly either way
    norm_before_fc: bool = False  # one RMSNorm over the concatenated aux states before fc (vLLM: input_norm)
    fc_norm: bool = False  # one RMSNorm per aux state before fc (vLLM: fc_norm.{i})
    # the next TTT / draft step reads the state after the final norm (vLLM: norm_output; speculators 0.9's default)
    norm_output: bool = False
    # > 0: fc's input channels with RMS above this x the median are scaled to the median (measured on the first
    # training batch; folded into fc.weight on export, so the served format is unchanged). 0 = off
    fc_outlier_ratio: float = 0.0
    intermediate_size: Optional[int] = None  # None = the target's
    num_layers: int = 1  # draft decoder layers: the first reads [embeds, fused aux] (2·H), later ones H
    # what each TTT step is scored against: kl = the target's distribution over the draft vocab (forward KL up to a
    # constant), argmax = its greedy token (cross-entropy), topk = its top `loss_topk` tokens, renormalised
    loss: str = "kl"
    loss_topk: int = 8
    # EAGLE-3: > 0 adds to each TTT step's loss this weight x a smooth-L1 regression of the step's normed output onto
    # the target's final (post-norm) hidden state at the position it predicts from (EAGLE-1's feature loss): a dense
    # target beside the distribution, most useful with head.init=output, where the draft's output space is the target's
    feature_loss: float = 0.0
    # keep lm_head at its start (head.init=output / target: the target's own rows for the draft vocab), not trained
    freeze_lm_head: bool = False
    # P-EAGLE (family peagle: an EAGLE-3 head drafting all k tokens in one forward): the token id its mask slots read
    # (vLLM's mask_token_id); None = the target's pad token, else its first eos token
    mask_token_id: Optional[int] = None
    # DFlash (family dflash): the block trained on (the verified token + block_size - 1 mask slots; serve k up to
    # block_size - 1) and the anchors drawn per sequence per step (each one block, all in one forward). Its mask
    # token (mask_token_id above; None = the target's bos token unless that is an eos, else its pad) gets a learned
    # embedding; ttt_decay is slot j's loss weight decay**(j-1)
    block_size: int = 4
    anchors: int = 64
    # how a block's slots are weighted: decay = ttt_decay**(j-1); acceptance = slot j's share of the expected
    # accepted length (sum over m >= j of the product over i <= m of (1 - floor)·q_i + floor, q_i the draft's
    # probability of the target's token at slot i, not differentiated): a slot learns most where the slots before
    # it already draft right (train/block_loss.py)
    slot_weights: str = "decay"
    slot_weight_floor: float = 0.5
    # MLP speculator (family mlp_speculator): n_predict stages of width inner_dim (0 = the target's hidden size)
    n_predict: int = 3
    inner_dim: int = 0
    tie_weights: bool = False
    scale_input: bool = False
    stage: int = 1  # 1: the data's own tokens (input alignment); 2: the target's own continuations (output alignment)
    init_from: Optional[str] = None  # a checkpoint or run dir to start from (stage 2 starts from stage 1's)


@dataclass
class DataConfig:
    # "sharegpt" (embedded ShareGPT_V3), a JSON/JSONL file, hf:NAME[:SPLIT], or regen:SOURCE = SOURCE's first
    # turns re-answered by the target (draftsmith regenerate; generated once, cached, resumable); SOURCE may also be
    # pycode:stdlib or pycode:site-packages[:N], code-completion prompts read from the installed Python, or
    # doctask:summarize|qa[:N], long-document prompts built from the embedded ShareGPT file (train/data/doc_tasks.py)
    path: str = "sharegpt"
    # more sources trained on beside data.path, each named as data.path is (regen:SOURCE made with the regen_*
    # settings and num_conversations below): e.g. [regen:sharegpt] trains on the source's text and the target's own
    # answers to it. Held-out comes from data.path alone, and a conversation of these whose id data.path holds out
    # is left out, so the target's answers to a held-out prompt never reach training
    # An entry may also be a mapping {path: regen:SOURCE, regen_temperature: 0.7, seed: 1} (keys: regen_temperature,
    # regen_max_tokens, regen_turns, seed): that set is made with its own settings, e.g. sampled beside a greedy one;
    # and {path: SOURCE, num_conversations: N} trains on that source's first N conversations (a regen: one answers
    # only those): `draftsmith adapt` replays a share of a head's data this way
    also: list[Any] = field(default_factory=list)
    # a file of conversation ids never trained on (a JSONL of {"id": ...} records such as another run's
    # heldout_prompts.jsonl, or one id per line): `draftsmith adapt` keeps the adapted head off the held-out prompts
    # it is judged on
    exclude_ids: Optional[str] = None
    num_conversations: Optional[int] = None  # None = all
    heldout: int = 64  # conversations held out from training (eval + served prompts)
    max_length: int = 2048  # tokens per sample
    # a training conversation longer than max_length: truncate keeps its first max_length tokens; split cuts it into
    # consecutive windows of max_length tokens, each a sample (those with no supervised token dropped), so no token
    # of a long conversation is thrown away. Held-out samples are always truncated (evals comparable across settings)
    overflow: str = "truncate"
    # the chat template's extra variables, as vLLM's chat_template_kwargs passes them when serving: render training
    # data the way the deployment renders prompts (Qwen3 non-thinking: {enable_thinking: false})
    chat_template_kwargs: Any = None  # a mapping; typed Any so that a whole {k: v} override replaces it
    # an answer's reasoning (reasoning_content, or <think>...</think> inline): keep = rendered as the template renders
    # it and supervised (the model generates it); drop = removed before rendering
    reasoning: str = "keep"
    max_tokens_per_batch: int = 8192  # length-bucketed batches up to this many (padded) tokens
    max_batch_size: int = 16
    seed: int = 0
    # online: the target runs on every batch; memory: once per sample, its features kept for later epochs;
    # offline: read from shards `draftsmith extract` wrote to features_dir (unset: the run extracts them itself,
    # once, before its clock starts, into the cache, keyed by target + samples); stream: a producer thread extracts
    # ahead into a disk buffer (features_dir, default <output_dir>/stream_features) the trainer empties
    features: str = "online"
    features_dir: Optional[str] = None
    features_dtype: str = "auto"  # offline, extracted by the run: storage dtype (auto = the target's; bf16 halves it)
    # offline, extracted by the run or `draftsmith extract`: what computes the hidden states. hf: a transformers
    # forward; vllm: the serving engine's prefill (its extract_hidden_states method; one process)
    features_backend: str = "hf"
    max_disk: Optional[str] = None  # stream: bound on the buffer's bytes, e.g. 2G or 500M (binary units)
    # assistant: train on the assistant's tokens only; all: also on prompt rows (user turns, system prompt),
    # scored against the target's distribution there too (held-out eval stays on assistant tokens)
    supervise: str = "assistant"
    regen_max_tokens: int = 256  # regen: answer length cap
    regen_temperature: float = 0.0  # regen: 0 = greedy, what greedy serving sees
    regen_turns: int = 1  # regen: user turns answered per conversation, each after the target's own answers


@dataclass
class OptimConfig:
    # adamw | muon: Muon (momentum orthogonalised by Newton-Schulz) on the head's hidden matrices (fc, the draft
    # layer's projections), AdamW on the rest (lm_head, norms); both follow optim.lr (Muon scaled to AdamW's RMS)
    name: str = "adamw"
    # Muon's Newton-Schulz iterations per step (5 = Muon's reference); each costs ~2·m²n FLOPs per m x n matrix,
    # so on a CPU the iteration is a large share of a small head's step (bench/train_step.py --optim muon)
    ns_steps: int = 5
    lr: float = 1e-4
    weight_decay: float = 0.0  # decoupled (AdamW's), on the parameters optim.decay names
    decay: str = "all"  # all | matrices (not norm weights) | hidden (only the hidden matrices: not lm_head, norms)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    grad_clip: float = 0.5
    # passes over the data; null = no epoch cap, so the clock (max_minutes), max_tokens or max_steps ends the run
    epochs: Optional[int] = 1
    max_steps: Optional[int] = None  # None = epochs over the data
    max_minutes: Optional[float] = None  # wall-clock bound; the run saves and stops when reached
    max_tokens: Optional[int] = None  # supervised-token budget: the lr schedule spans it and the run stops there
    # micro-batches per optimizer step on each process: the global batch is processes x grad_accum micro-batches
    # of up to data.max_tokens_per_batch tokens, and the loss is the mean over all their supervised tokens
    grad_accum: int = 1


@dataclass
class Stage2Config:
    """MLP speculator stage 2: prompts cut from the training samples, continued by the frozen target."""

    num_prompts: int = 512  # prompts per temperature
    prompt_tokens: int = 64  # the last N tokens before a random assistant turn's start
    max_tokens: int = 256  # generated tokens per prompt
    temperatures: list[float] = field(default_factory=lambda: [0.0])  # 0 = greedy; several = one pass each
    seed: int = 0
    backend: str = "auto"  # auto (vLLM when installed, else HF) | vllm | hf
    batch_size: int = 64  # prompts per generate call


@dataclass
class Config:
    target: TargetConfig = field(default_factory=TargetConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    stage2: Stage2Config = field(default_factory=Stage2Config)
    run_name: str = "run"
    output_dir: str = "outputs/${run_name}"
    seed: int = 0
    resume: Optional[str] = None  # a checkpoint dir, or "auto" = the latest in output_dir (none yet: from step 0)
    # a fresh run (no resume) into an output_dir that holds an earlier run is refused unless this is true,
    # which deletes that run's checkpoints and metrics first
    overwrite: bool = False
    log_every: int = 10
    eval_every: int = 200
    save_every: int = 200
    keep_checkpoints: int = 2
    eval_batches: int = 8
    mixed_precision: str = "auto"  # auto | no | bf16
    # are bf16 kernels faster here? null: a timed probe decides at start-up (docs/data.md "Precision"); the answer is
    # recorded in every checkpoint, and a resumed run takes it from there (exact resume whatever a re-probe says).
    # It sets mixed_precision=auto, target.dtype=auto and Muon's Newton-Schulz dtype; true/false overrides the probe
    fast_bf16: Optional[bool] = None
    dry_run: bool = False  # print per-rank memory (train/memory.py) from shapes alone, then stop
    dry_run_processes: int = 8  # the process count the dry run shards over
    # prepare the data and the features (offline: extracted into the cache), write the run's held-out prompts, then
    # stop before training; the same command with resume=auto trains (the quickstart serves the baselines between)
    prepare_only: bool = False
    wandb: dict[str, Any] = field(default_factory=lambda: {"mode": "offline", "project": "draftsmith"})


CHOICES = {
    "head.family": families.NAMES,
    "data.features": ("online", "memory", "offline", "stream"),
    "data.features_dtype": ("auto", "bf16", "fp16", "fp32"),
    "data.features_backend": ("hf", "vllm"),
    "data.reasoning": ("keep", "drop"),
    "data.supervise": ("assistant", "all"),
    "data.overflow": ("truncate", "split"),
    "target.dtype": ("auto", "float32", "bfloat16", "float16"),
    "mixed_precision": ("auto", "no", "bf16", "fp16"),
    "stage2.backend": ("auto", "vllm", "hf"),
    "optim.name": ("adamw", "muon"),
    "optim.decay": ("all", "matrices", "hidden"),
}


# the regen settings, checked where data. sets them and where a data.also mapping entry sets its own (a mapping's
# values are untyped, hence the type checks)
REGEN_CHECKS = {
    "regen_max_tokens": (lambda v: isinstance(v, int) and v >= 1, "answer length cap, >= 1"),
    "regen_temperature": (
        lambda v: isinstance(v, (int, float)) and v >= 0,
        "0 (greedy) or a sampling temperature > 0",
    ),
    "regen_turns": (lambda v: isinstance(v, int) and v >= 1, "user turns answered per conversation, >= 1"),
}


PROMPT_SOURCES = ("pycode:", "doctask:")  # prompts with no answers: trained on only as regen:SOURCE


def also_problems(entries, prompts_only: str) -> list[str]:
    """config_problems' lines for data.also: each entry a source name, or a mapping of a source and its own
    settings (regen settings for a regen: source; num_conversations for any)."""
    regen_only = {**REGEN_CHECKS, "seed": (lambda v: isinstance(v, int), "an integer sampling seed")}
    checks = {**regen_only, "num_conversations": (lambda v: isinstance(v, int) and v >= 1, "conversations, >= 1")}
    problems = []
    for i, e in enumerate(entries or []):
        key = f"data.also[{i}]"
        if isinstance(e, str):
            if not e.strip():
                problems.append(f"{key}={e!r}: an empty source (expected a source name, as data.path takes)")
            elif e.startswith(PROMPT_SOURCES):
                problems.append(f"{key}={e}: {prompts_only}")
            continue
        if not hasattr(e, "keys"):
            problems.append(f"{key}={e}: expected a source name or a mapping {{path: regen:SOURCE, ...}}")
            continue
        path = e.get("path")
        if not isinstance(path, str) or not path.strip():
            problems.append(f"{key}.path={path}: a mapping entry names its source (path: regen:SOURCE, a file, ...)")
        elif not path.startswith("regen:") and set(e.keys()) & set(regen_only):
            problems.append(
                f"{key}.path={path}: {', '.join(sorted(set(e.keys()) & set(regen_only)))} make a regen:SOURCE set; "
                "this source is read as it is"
            )
        for k in e.keys():
            if k == "path":
                continue
            if k not in checks:
                problems.append(f"{key}.{k}: unknown key (a mapping entry takes path, {', '.join(checks)})")
            elif not checks[k][0](e.get(k)):
                problems.append(f"{key}.{k}={e.get(k)}: {checks[k][1]}")
    return problems


def config_problems(cfg) -> list[str]:
    """Every key whose value cannot work, as `key=value: why` lines (empty when the config is usable).

    Hydra checks names and types at compose time; this checks ranges and combinations, so a bad value fails
    at start-up naming its key instead of as a traceback deep inside torch (or, worse, silently).
    """
    problems: list[str] = []

    def get(key: str):
        node = cfg
        for part in key.split("."):
            node = node.get(part) if hasattr(node, "get") else None
        return node

    def need(key: str, ok, why: str) -> None:
        value = get(key)
        if not ok(value):
            problems.append(f"{key}={value}: {why}")

    for key, allowed in CHOICES.items():
        need(key, lambda v, a=allowed: v in a, "expected one of " + " | ".join(map(str, allowed)))

    def optional_min(lo):
        return lambda v: v is None or v >= lo

    need("optim.lr", lambda v: v > 0, "the peak learning rate must be > 0 (the presets use 1e-4 to 3e-3)")
    need("optim.weight_decay", lambda v: v >= 0, "must be >= 0")
    need("optim.ns_steps", lambda v: v >= 1, "Muon's Newton-Schulz iterations per step, >= 1 (5 = the reference)")
    need("optim.betas", lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "two AdamW betas in [0, 1)")
    need("optim.warmup_steps", lambda v: v >= 0, "must be >= 0")
    need("optim.min_lr_ratio", lambda v: 0 <= v <= 1, "the cosine's floor as a share of the peak lr, in [0, 1]")
    need("optim.grad_clip", lambda v: v > 0, "the gradient-norm clip must be > 0 (0 would zero every update)")
    need("optim.epochs", optional_min(1), "passes over the data, >= 1, or null for no epoch cap (clock/tokens/steps)")
    if get("optim.epochs") is None and all(
        get(k) is None for k in ("optim.max_steps", "optim.max_tokens", "optim.max_minutes")
    ):
        problems.append(
            "optim.epochs=null: with no optim.max_minutes, optim.max_tokens or optim.max_steps, nothing would end "
            "the run"
        )
    need("optim.max_steps", optional_min(1), "optimizer steps, >= 1, or null for no step cap (epochs/tokens/clock)")
    need("optim.max_minutes", lambda v: v is None or v > 0, "minutes of training, > 0, or null for no clock")
    need("optim.max_tokens", optional_min(1), "supervised tokens, >= 1, or null for no token budget")
    need("optim.grad_accum", lambda v: v >= 1, "micro-batches per optimizer step, >= 1")
    head_checks = {  # checked for the keys the run's head family reads (its `keys`)
        "ttt_steps": (lambda v: v >= 1, "the head is unrolled at least 1 step (EAGLE-3 TTT depth)"),
        "ttt_decay": (lambda v: v > 0, "each step's loss weight is decay**i: must be > 0"),
        "n_predict": (lambda v: v >= 1, "MLP speculator stages, >= 1"),
        "inner_dim": (lambda v: v >= 0, "0 (the target's hidden size) or a width > 0"),
        "stage": (lambda v: v in (1, 2), "1 (input alignment) or 2 (output alignment, from head.init_from)"),
        "intermediate_size": (optional_min(1), "null (the target's) or >= 1"),
        "num_layers": (lambda v: v >= 1, "draft decoder layers, >= 1 (vLLM's eagle3 drafter loads any number)"),
        "loss": (lambda v: v in ("kl", "argmax", "topk"), "expected one of kl | argmax | topk"),
        "loss_topk": (lambda v: v >= 1, "the target's top tokens the loss keeps, >= 1"),
        "feature_loss": (lambda v: v >= 0, "the feature regression's weight, >= 0 (0 = off)"),
        "fc_outlier_ratio": (lambda v: v == 0 or v > 1, "0 (off) or a ratio to the median channel RMS above 1"),
        "slot_weights": (lambda v: v in ("decay", "acceptance"), "expected one of decay | acceptance"),
        "slot_weight_floor": (lambda v: 0 <= v <= 1, "the weights' floor per slot, in [0, 1]"),
    }
    family = families.FAMILIES.get(get("head.family"))  # an unknown one is named by the CHOICES check above
    if family is not None:
        for key in family.keys:
            if key in head_checks:
                need("head." + key, *head_checks[key])
        problems += family.problems(cfg.head, get("target.vocab_size"))
    need("data.num_conversations", optional_min(1), "conversations to train on, >= 1, or null for all")
    need("data.heldout", lambda v: v >= 0, "held-out conversations, >= 0")
    need("data.max_length", lambda v: v >= 2, "tokens per sample, >= 2")
    need(
        "data.max_tokens_per_batch",
        lambda v: v >= get("data.max_length"),
        f"a batch must hold one sample of data.max_length={get('data.max_length')} tokens",
    )
    need("data.max_batch_size", lambda v: v >= 1, "samples per batch, >= 1")
    need(
        "data.chat_template_kwargs",
        lambda v: v is None or OmegaConf.is_dict(v) or isinstance(v, dict),
        "the chat template's variables as a mapping, e.g. 'data.chat_template_kwargs={enable_thinking:false}'",
    )
    for key, (ok, why) in REGEN_CHECKS.items():
        need("data." + key, ok, why)
    prompts_only = (
        "pycode: and doctask: sources are prompts with no answers; regen:pycode:... or regen:doctask:... has the "
        "target answer them"
    )
    need("data.path", lambda v: not str(v).startswith(PROMPT_SOURCES), prompts_only)
    problems += also_problems(get("data.also"), prompts_only)
    if get("data.max_disk") is not None:
        from draftsmith.train.features.shards import parse_size

        try:
            parse_size(get("data.max_disk"))
        except ValueError as e:
            problems.append(f"data.max_disk={get('data.max_disk')}: {e}")
    need("log_every", lambda v: v >= 1, "steps between log lines, >= 1")
    need("eval_every", lambda v: v >= 0, "steps between held-out evals, >= 0 (0: only at the end)")
    need("save_every", lambda v: v >= 0, "steps between checkpoints, >= 0 (0: only at the end)")
    need("keep_checkpoints", lambda v: v >= 1, "checkpoints kept, >= 1")
    need("eval_batches", lambda v: v >= 1, "held-out batches per eval, >= 1")
    need("stage2.num_prompts", lambda v: v >= 1, "prompts per temperature, >= 1")
    need("stage2.max_tokens", lambda v: v >= 1, "generated tokens per prompt, >= 1")
    resume = get("resume")
    if resume not in (None, "auto") and not os.path.isdir(str(resume)):
        problems.append(
            f"resume={resume}: no such checkpoint or run directory (resume=auto takes the latest in output_dir)"
        )
    return problems


def validate_config(cfg) -> None:
    """Raise ConfigError listing every key whose value cannot work."""
    problems = config_problems(cfg)
    if problems:
        from draftsmith.errors import ConfigError

        raise ConfigError(
            "the config cannot work: " + "; ".join(problems) + ". Fix the key(s) on the command "
            "line (key=value) or in the preset under conf/."
        )


def conf_dir() -> Path:
    """The Hydra config tree `conf/`: package data `draftsmith.conf` (the repo's conf/ in an editable install)."""
    from importlib.resources import files

    return Path(str(files("draftsmith.conf")))


def hydra_value(v) -> str:
    """`v` in Hydra's override grammar (strings quoted, so `regen:sharegpt` or a path stays one string)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(hydra_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{hydra_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as a Hydra value")


def compose_config(overrides: list[str]):
    """The run config `draftsmith train` / train/run.py builds from the same `key=value` overrides (conf=NAME too)."""
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="schema", node=Config)
    cs.store(group="target", name="schema", node=TargetConfig)
    cs.store(group="head", name="schema", node=HeadConfig)
    cs.store(group="data", name="schema", node=DataConfig)
    cs.store(group="optim", name="schema", node=OptimConfig)

"""Build the pieces a run needs from its config: target, data, draft vocab, head."""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from pathlib import Path

import torch

from draftsmith.assets import cache_dir, resolve_target
from draftsmith.atomic import atomic_write
from draftsmith.errors import ConfigError
from draftsmith.train.data.conversations import DataError
from draftsmith.train.data.dataset import also_entries, overflow, prepare_data
from draftsmith.train.data.render import special_ids
from draftsmith.train.data.vocab import build_draft_vocab, vocab_from_d2t
from draftsmith.train.heads import families
from draftsmith.train.heads.eagle3 import Eagle3Config, Eagle3Head, freeze_output_side
from draftsmith.train.target import Target, TargetEnds

_PINNED: list[bool] = []  # a training run's decision (pin_fast_bf16): what fast_bf16 answers from then on


def pin_fast_bf16(value: bool) -> None:
    """Make `fast_bf16` answer `value` in this process from now on. A training run pins the decision it records in
    its checkpoints, so that a resumed run keeps the kernels it started with: the timed probe is noisy (1.5x-3.4x
    on one idle 2-core EPYC, five runs in a row), and a re-probe that lands on the other side of 1.2x would switch
    autocast, the target's dtype and Muon's Newton-Schulz mid-run, and break exact resume."""
    _PINNED[:] = [bool(value)]


def fast_bf16(device: torch.device) -> bool:
    """Whether bf16 kernels are faster here: the training run's decision once train/run.py pinned it (`fast_bf16`
    in its config and checkpoints), else `probe_fast_bf16`."""
    return _PINNED[0] if _PINNED else probe_fast_bf16(device)


def probe_fast_bf16(device: torch.device) -> bool:
    """bf16 where it is faster here: Ampere+ GPUs; on CPUs with AVX512-BF16 or AMX, only when a timed probe says so.

    CPU flags alone mislead: on a 2-core AVX512-BF16 EPYC the bf16 head step ran 2-3x faster than fp32, on a
    2-core AVX512-BF16 Xeon without AMX it ran 1.5x slower (bench/train_step.py). So `auto` times one matmul of a
    head-layer shape in both dtypes (~0.1 s, once per process) and takes bf16 only at >= 1.2x.
    """
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    if " avx512_bf16" not in flags and " amx_bf16" not in flags:
        return False
    return _cpu_bf16_speedup() >= 1.2


@functools.lru_cache(maxsize=1)
def _cpu_bf16_speedup() -> float:
    """fp32 time / bf16 time of a [512, 1152] x [1152, 1536] matmul (a draft layer's MLP), best of 5 each."""

    def best(dtype) -> float:
        a, w = torch.randn(512, 1152, dtype=dtype), torch.randn(1152, 1536, dtype=dtype)
        a @ w  # warm-up: oneDNN picks and caches its kernel
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            a @ w
            times.append(time.perf_counter() - t0)
        return min(times)

    return best(torch.float32) / best(torch.bfloat16)


def target_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if fast_bf16(device) else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_target_config(name_or_path: str):
    """(local path or hub id, HF config) of a target, or a ConfigError saying what to set instead.

    transformers answers a missing local path with "Repo id must be in the form ..." and an unreachable hub
    with a connection traceback; a user needs to hear which of the three it is and what to set.
    """
    from transformers import AutoConfig

    key = f"target.name_or_path={name_or_path}"
    path = resolve_target(name_or_path)
    local = Path(path).expanduser()
    if local.exists():
        if not local.is_dir() or not (local / "config.json").is_file():
            raise ConfigError(
                f"{key}: {local} is not a Hugging Face model directory (no config.json in it); point "
                "it at the directory that holds config.json, the tokenizer and the weights"
            )
    elif Path(path).is_absolute() or path.startswith((".", "~")) or path.count("/") != 1:
        raise ConfigError(
            f"{key}: no such directory {local}, and not a hub id (ORG/NAME); point it at a local "
            "model directory, or use target.name_or_path=smollm2 for the embedded default"
        )
    where = str(local) if local.exists() else path
    try:
        return where, AutoConfig.from_pretrained(where)
    except (OSError, ValueError) as e:
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"{key}: cannot load it from the model hub ({reason}). On a machine without hub access, "
            f"download {path} where there is one and set target.name_or_path=/path/to/its/directory"
        ) from None


def build_target(cfg, device: torch.device, ends_only: bool = False) -> tuple[Target | TargetEnds, str]:
    """Load the frozen target and check it is the model the preset describes.

    ends_only: only its embedding, final norm and (on demand) lm_head rows, for training from stored features.
    """
    path, tc = load_target_config(cfg.name_or_path)  # before the weights: a wrong 70B preset fails in seconds
    got = {"hidden_size": tc.hidden_size, "num_hidden_layers": tc.num_hidden_layers, "vocab_size": tc.vocab_size}
    want = {k: cfg[k] for k in got}
    if got != want:
        raise ConfigError(
            f"target {cfg.name_or_path!r} is not the model this preset describes: config has {got}, "
            f"preset says {want}; fix target.* or pick the right conf="
        )
    dtype = target_dtype(cfg.dtype, device)
    if ends_only:
        return TargetEnds(path, cfg.aux_layer_ids, dtype=dtype), path
    return Target.from_pretrained(path, cfg.aux_layer_ids, dtype=dtype), path


# head.init_from=scratch: stage 2 from a fresh head instead of a stage-1 one (the stage-2 A/B's "stage 2 only" arm)
SCRATCH = "scratch"


def init_dir(head_cfg) -> str | None:
    """The run or checkpoint head.init_from names; None for a fresh head (unset, or `scratch`)."""
    value = head_cfg.get("init_from")
    return None if not value or value == SCRATCH else value


def build_head(cfg, target: Target, vocab):
    """A head of head.family for this target (`vocab`: the draft vocab, None for a family without one): fresh, or
    with head.init_from's weights (`draftsmith adapt` and stage 2 continue a trained head)."""
    family = families.get(cfg.family)
    head = family.build(cfg, target, vocab)
    if init_dir(cfg):
        load_init_weights(head, cfg, family)
    return head


# head config keys that are training settings, not weights: a head may continue under other values of them
TRAINING_ONLY_KEYS = ("target", "ttt_steps")


def init_checkpoint(head_cfg, family) -> tuple[dict, dict]:
    """head.init_from's (head.json meta, tensors), refused with one message when it holds another family's head."""
    from draftsmith.train.checkpoint import read_head

    src = Path(head_cfg.init_from)
    ours = (src / "draftsmith.json").is_file() or (src / "head.json").is_file() or (src / "checkpoints").is_dir()
    if (src / "config.json").is_file() and not ours:
        raise ConfigError(
            f"head.init_from={src}: a head in another project's layout (config.json, no draftsmith checkpoint); "
            f"convert it first, `draftsmith convert {src} OUT --target TARGET`, and start from head.init_from=OUT "
            "(convert prints the overrides that give the run its shape)"
        )
    found, config, state, _ = read_head(src)  # a run, a checkpoint, or an export of ours (draftsmith.json)
    meta = {"family": found.name, "config": config}
    theirs = found.name
    if theirs != family.name:
        raise ConfigError(
            f"head.init_from={head_cfg.init_from}: holds a {theirs!r} head, not {family.name} (head.family)"
        )
    return meta, state


def load_init_weights(head, cfg, family) -> None:
    """Copy head.init_from's weights (and its draft vocab buffers) into `head`, whose config must match."""
    meta, state = init_checkpoint(cfg, family)
    # a key the head's config gained after that head was saved holds its default there
    defaults = {f.name: f.default for f in dataclasses.fields(head.config) if f.default is not dataclasses.MISSING}
    theirs = {k: v for k, v in {**defaults, **meta["config"]}.items() if k not in TRAINING_ONLY_KEYS}
    ours = {k: v for k, v in head.config.to_dict().items() if k not in TRAINING_ONLY_KEYS}
    if theirs != ours:
        diff = {
            k: (theirs.get(k), ours.get(k)) for k in sorted(set(theirs) | set(ours)) if theirs.get(k) != ours.get(k)
        }
        raise ConfigError(
            f"head.init_from={cfg.init_from}: its head differs from this run's in {diff} (theirs, ours); a head "
            "continues only with the same shape: drop the head.* overrides that change it"
        )
    result = head.load_state_dict(state, strict=False)
    frozen_or_tied = set(head.state_dict()) - set(head.trainable_state_dict())
    missing = sorted(set(result.missing_keys) - frozen_or_tied)
    if missing or result.unexpected_keys:
        raise ConfigError(
            f"head.init_from={cfg.init_from}: its tensors do not fit a {family.name} head "
            f"(missing {missing[:4]}, unexpected {sorted(result.unexpected_keys)[:4]})"
        )


def build_eagle3(cfg, target: Target, vocab) -> Eagle3Head:
    head = Eagle3Head(Eagle3Config.from_run(cfg, target.config, target.aux_layer_ids))
    head.attach_target(target)
    head.set_vocab(vocab.d2t, vocab.t2d)
    freeze_output_side(head, cfg)
    if init_dir(cfg):
        return head  # build_head copies head.init_from's weights in
    if cfg.init == "target":
        warm_start(head, target)
    elif cfg.init == "output":
        warm_start_output(head, target)
    elif cfg.init != "random":
        raise ConfigError(f"head.init={cfg.init!r}: expected random | output | target")
    return head


def build_dflash(cfg, target: Target, vocab):
    from draftsmith.train.heads.dflash import DFlashConfig, DFlashHead

    try:
        config = DFlashConfig.from_run(cfg, target.config, target.aux_layer_ids)
        head = DFlashHead(config)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    head.attach_target(target)
    with torch.no_grad():  # mask slots start at the mean token embedding: a point inside the embeddings' cloud
        head.mask_embedding.copy_(target.embed_tokens.weight.float().mean(0))
    head.set_vocab(vocab.d2t, vocab.t2d)
    if init_dir(cfg):
        return head
    if cfg.init == "output":
        warm_start_output(head, target)
    elif cfg.init != "random":
        raise ConfigError(f"head.init={cfg.init!r}: expected random | output for dflash heads")
    return head


@torch.no_grad()
def warm_start_output(head: Eagle3Head, target: Target) -> None:
    """Only the output side from the target: final norm and the lm_head rows of the draft vocab.

    The draft's last hidden state then lives where the target's does, and every draft token starts with
    the target's own output embedding instead of noise; the layer and fc learn from scratch.
    """
    head.norm.weight.copy_(target.norm.weight.float())
    head.lm_head.weight.copy_(target.output_weight(head.draft_to_target).float())


@torch.no_grad()
def warm_start(head: Eagle3Head, target: Target) -> None:
    """Start from the target instead of noise: the draft layer copies the target's last decoder layer
    (its weights read the hidden half of the 2·H input; the embedding half starts at zero), `fc` passes
    the highest aux state through, and norm/lm_head are the target's final norm and output rows."""
    H = head.config.hidden_size
    n_aux = len(head.config.aux_layer_ids)
    src = target.decoder_layer(target.config.num_hidden_layers - 1)
    dst = head.layers[0]
    for name in ("q_proj", "k_proj", "v_proj"):
        w = getattr(src.self_attn, name).weight.float()  # [out, H]
        new = torch.zeros_like(getattr(dst.self_attn, name).weight)  # [out, 2H]
        new[:, H:] = w
        getattr(dst.self_attn, name).weight.copy_(new)
    dst.self_attn.o_proj.weight.copy_(src.self_attn.o_proj.weight.float())
    for name in ("gate_proj", "up_proj", "down_proj"):
        getattr(dst.mlp, name).weight.copy_(getattr(src.mlp, name).weight.float())
    dst.hidden_norm.weight.copy_(src.input_layernorm.weight.float())
    dst.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight.float())
    fc = torch.zeros_like(head.fc.weight)  # [H, n_aux*H]
    fc[:, (n_aux - 1) * H :] = torch.eye(H)
    head.fc.weight.copy_(fc)
    warm_start_output(head, target)


def regen_pool_path(data_cfg, target_path: str) -> Path:
    """The cached pool of answers that data.path=regen:SOURCE draws on: one file per (target, source, length cap,
    temperature, seed), under the draftsmith cache."""
    import hashlib

    source = data_cfg.path[len("regen:") :]
    kwargs = template_kwargs(data_cfg)  # a mode other than the template's default is another pool
    key = json.dumps(
        [str(target_path), source, data_cfg.regen_max_tokens, data_cfg.regen_temperature, data_cfg.seed]
        + ([kwargs] if kwargs else []),
        sort_keys=True,
    )
    return cache_dir() / "regen" / (hashlib.sha1(key.encode()).hexdigest()[:16] + ".jsonl")


def regenerated_path(data_cfg, target_path: str) -> str:
    """For data.path=regen:SOURCE, the JSONL of SOURCE's user turns re-answered by the target (the first
    `data.regen_turns` of each conversation), made once, cached under the draftsmith cache; a killed run resumes it.

    The answers live in one pool per (target, source, length cap, temperature, seed): raising
    `num_conversations` or `regen_turns` generates only the turns not answered yet. Each size gets its own view,
    the pool's records of SOURCE's first `num_conversations` conversations in source order, each cut back to its
    first `regen_turns` answers, so the data (and its held-out split) for a size never depends on what larger sizes
    were made before."""
    from draftsmith.train.data.regenerate import read_pool, regenerate, truncate_turns

    source = data_cfg.path[len("regen:") :]
    pool = regen_pool_path(data_cfg, target_path)
    n = data_cfg.num_conversations
    turns = int(data_cfg.get("regen_turns", 1))
    name = pool.stem + (f".first{n}" if n is not None else ".all") + (f".turns{turns}" if turns > 1 else "")
    view = pool.with_name(name + ".jsonl")
    if (view.parent / (view.name + ".complete")).is_file():
        return str(view)
    stats = regenerate(
        str(target_path),
        source,
        str(pool),
        n,
        data_cfg.regen_max_tokens,
        data_cfg.regen_temperature,
        data_cfg.seed,
        turns=turns,
        chat_template_kwargs=template_kwargs(data_cfg) or None,
    )
    records, _ = read_pool(pool)  # the last line of each id: its answers so far (regenerate left the file clean)
    lines = [json.dumps(truncate_turns(records[i], turns), ensure_ascii=False) + "\n" for i in stats["ids"]]
    atomic_write(view, "".join(lines).encode())
    (view.parent / (view.name + ".complete")).touch()
    return str(view)


def resolve_data_cfg(data_cfg, target_path: str):
    """`data_cfg` as `prepare_data` reads it: a regen:SOURCE path (data.path, or one of data.also) becomes its
    regenerated view (made if missing)."""
    from omegaconf import OmegaConf

    def view(path: str, more: int = 0, settings: dict | None = None) -> str:
        if not path.startswith("regen:"):
            return path
        n = data_cfg.num_conversations
        n = None if n is None else n + more
        return regenerated_path(
            OmegaConf.merge(data_cfg, {"path": path, "num_conversations": n, **(settings or {})}), target_path
        )

    def also_view(path: str, settings: dict):
        # an also regen:SOURCE answers SOURCE's first num_conversations + heldout conversations: when SOURCE is
        # data.path, that is every one data.path trains on (its held-out ones among them are then left out); a
        # mapping entry's own settings make its set, its own num_conversations its size
        if "num_conversations" not in settings:
            return view(path, data_cfg.heldout, settings)
        path = view(path, 0, settings)
        return {"path": path, "num_conversations": settings["num_conversations"]}

    out = {}
    extra = also_entries(data_cfg)
    if any(p.startswith("regen:") or s for p, s in extra):
        out["also"] = [also_view(p, settings) for p, settings in extra]
    if str(data_cfg.path).startswith("regen:"):
        out.update(path=view(str(data_cfg.path)), num_conversations=None)
    return OmegaConf.merge(data_cfg, out) if out else data_cfg


def build_data_and_vocab(cfg, tokenizer, run_dir: Path, log=print):
    """Prepared (cached) data plus, for a family that drafts over one, the draft vocab from its supervised-token
    counts (None otherwise)."""
    data_cfg = resolve_data_cfg(cfg.data, tokenizer.name_or_path)
    if (
        len(tokenizer) > cfg.target.vocab_size
    ):  # token ids past the target's embedding rows: a different model's tokenizer
        raise DataError(
            f"tokenizer {tokenizer.name_or_path!r} has {len(tokenizer)} tokens but the target "
            f"{cfg.target.name_or_path!r} has {cfg.target.vocab_size} embeddings: they are not a pair"
        )
    data = prepare_data(data_cfg, tokenizer, cache_dir())
    shown = ("render_errors", "no_supervised_tokens", "no_supervised_after_truncation", "truncated", "extra_windows")
    render = {
        f"{split} {k}": v for split, t in data.stats.get("render", {}).items() for k, v in t.items() if k in shown and v
    }
    if data.stats.get("skipped") or data.stats.get("trimmed") or data.stats.get("file_truncated") or render:
        log(
            f"data problems (skipped records are not trained on):\n{data.stats['read']}"
            + ("\nrendering: " + ", ".join(f"{k}={v}" for k, v in render.items()) if render else "")
        )
    train_render = data.stats.get("render", {}).get("train", {})
    lost = train_render.get("tokens_before_truncation", 0) - data.stats.get("train_tokens", 0)
    if train_render.get("truncated") and overflow(cfg.data) == "truncate" and lost > 0:
        log(
            f"data: {train_render['truncated']} training conversations are longer than data.max_length="
            f"{cfg.data.max_length}; truncating them drops {lost} of {train_render['tokens_before_truncation']} "
            f"tokens ({lost / train_render['tokens_before_truncation']:.0%}); data.overflow=split keeps them as "
            "windows of max_length tokens"
        )
    for a in data.stats.get("also", []):
        log(
            f"data: + {a['kept']} training conversations from {a['source']} (data.also: {a['read']})"
            + (f"; {a['held_out_ids']} left out: data.path holds their ids out" if a["held_out_ids"] else "")
            + (f"; {a['excluded_ids']} left out: data.exclude_ids names them" if a.get("excluded_ids") else "")
        )
    vocab, stats, line = None, dict(data.stats), ""
    family = families.get(cfg.head.family)
    if family.uses_draft_vocab(cfg.head):
        if init_dir(cfg.head):  # the rows that head trained, whatever this data's most frequent tokens are
            vocab = vocab_from_d2t(init_checkpoint(cfg.head, family)[1]["d2t"], cfg.target.vocab_size)
            whose = f"head.init_from's draft vocab ({vocab.draft_vocab_size})"
        else:
            pinned = sorted(special_ids(tokenizer))
            vocab = build_draft_vocab(data.counts, cfg.head.draft_vocab_size, pinned_ids=pinned)
            whose = f"draft vocab {cfg.head.draft_vocab_size}"
        stats["draft_vocab_coverage"] = coverage = vocab.coverage(data.counts)
        line = f"; {whose} covers {coverage:.2%}"
    log(
        f"data: {len(data.train)} train / {len(data.heldout)} held-out samples, "
        f"{int(data.counts.sum())} supervised tokens{line}"
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "heldout_prompts.jsonl", "w") as f:
        for p in data.heldout_prompts:
            f.write(json.dumps(p) + "\n")
    (run_dir / "data_stats.json").write_text(json.dumps(stats, indent=2, default=str))
    return data, vocab


def build_mlp_speculator(cfg, target: Target, vocab=None):
    """A fresh MLP speculator for the target (with head.init_from, build_head then copies that head's weights in:
    stage 2 continues stage 1).

    init=output starts each head from the target's lm_head and each stage's embedding from the target's
    input embedding (needs inner_dim == hidden size); random keeps the scale-preserving init.
    """
    from draftsmith.train.heads.mlp_speculator import MLPSpeculator, MLPSpeculatorConfig

    hcfg = MLPSpeculatorConfig.from_run(cfg, target.config)
    head = MLPSpeculator(hcfg)
    if hcfg.reduced:
        if vocab is None:
            raise ConfigError(f"head.draft_vocab_size={hcfg.draft_vocab_size}: the run built no draft vocab for it")
        head.set_vocab(vocab.d2t, vocab.t2d)
    if init_dir(cfg):
        return head  # build_head copies head.init_from's weights and draft vocab in
    if cfg.init == "output":
        if hcfg.inner_dim != hcfg.emb_dim:
            raise ConfigError(f"head.init=output needs inner_dim == the target's hidden size {hcfg.emb_dim}")
        with torch.no_grad():
            for i in range(hcfg.n_predict):
                head.head[i].weight.copy_(target.output_weight(head.draft_to_target).float())
                head.emb[i].weight.copy_(target.embed_tokens.weight.float())
    elif cfg.init != "random":
        raise ConfigError(f"head.init={cfg.init!r}: expected random | output for an MLP speculator")
    return head


def template_kwargs(data_cfg) -> dict:
    """data.chat_template_kwargs as a plain dict ({} for a config saved before the key existed)."""
    from omegaconf import OmegaConf

    kwargs = data_cfg.get("chat_template_kwargs") or {}
    return OmegaConf.to_container(kwargs, resolve=True) if OmegaConf.is_config(kwargs) else dict(kwargs)


def apply_template_options(tokenizer, data_cfg) -> None:
    """The run's data.chat_template_kwargs and data.reasoning, kept with its tokenizer for every render."""
    from draftsmith.train.data.render import TemplateOptions, set_template_options

    set_template_options(tokenizer, TemplateOptions.of(template_kwargs(data_cfg), data_cfg.get("reasoning", "keep")))


def build_run(cfg, device, stats_dir: Path | None, log=print, ends_only: bool = False):
    """Target, tokenizer, training data and draft vocab (None for a family without one) of a run: what training
    and `draftsmith extract` share.

    `stats_dir` receives data_stats.json and heldout_prompts.jsonl (None: a temporary dir, e.g. other ranks).
    """
    import tempfile

    from transformers import AutoTokenizer

    target, target_path = build_target(cfg.target, device, ends_only)
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    apply_template_options(tokenizer, cfg.data)
    if stats_dir is not None:
        data, vocab = build_data_and_vocab(cfg, tokenizer, stats_dir, log=log)
    else:
        with tempfile.TemporaryDirectory(prefix="draftsmith-extract-") as tmp:
            data, vocab = build_data_and_vocab(cfg, tokenizer, Path(tmp), log=log)
    if families.get(cfg.head.family).stage2 and cfg.head.stage == 2:  # the target's own continuations
        from draftsmith.train.data.continuations import build_stage2_data

        data = build_stage2_data(cfg, data, target_path, cache_dir(), log=log)
    return target, tokenizer, data, vocab

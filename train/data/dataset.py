"""Conversations → rendered, masked samples (cached), plus length-bucketed batches and padding.

Held-out choice: the held-out set is picked by `split_heldout` (smallest sha1(seed, id)) among the
first `max(HELDOUT_WINDOW, heldout)` kept conversations of the file, so it stays the same when only
`num_conversations` changes and evals stay comparable across runs. Training then takes the first
`num_conversations` kept conversations whose id is not held out, in file order.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.atomic import atomic_file
from draftsmith.errors import ConfigError
from draftsmith.train.data.conversations import (
    Conversation,
    DataError,
    ReadStats,
    read_conversations,
    resolve_path,
    split_heldout,
)
from draftsmith.train.data.render import (
    Sample,
    TemplateOptions,
    render_many,
    split_windows,
    template_options,
    truncate,
)
from draftsmith.train.data.vocab import count_supervised

# bump when rendering, masking or selection changes: old caches are then ignored (2: reasoning, tool calls)
CODE_VERSION = 2
HELDOUT_WINDOW = 2048


@dataclass
class PreparedData:
    train: list[Sample]
    heldout: list[Sample]
    heldout_prompts: list[dict]  # {"id", "messages" (up to the first answer), "reference" (that answer)}
    counts: torch.LongTensor  # [V] supervised-token counts over train only
    stats: dict = field(default_factory=dict)


def _source_fingerprint(path: str) -> dict:
    if path.startswith("hf:"):
        return {"source": path}  # a hub dataset: the name is all we can know offline
    p = resolve_path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file or directory")
    p = p.resolve()
    if p.is_dir():  # a save_to_disk directory: its files' sizes and times
        files = sorted(f for f in p.rglob("*") if f.is_file())
        return {
            "source": str(p),
            "files": [(str(f.relative_to(p)), f.stat().st_size, f.stat().st_mtime_ns) for f in files],
        }
    st = p.stat()
    return {"source": str(p), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def overflow(cfg) -> str:
    """data.overflow, "truncate" for a config saved before the key existed (a run's config.yaml read back)."""
    return getattr(cfg, "overflow", "truncate")


def also_entries(cfg) -> list[tuple[str, dict]]:
    """data.also as (source, settings) pairs, empty for a config saved before the key existed. An entry is a source
    name, or a mapping {path: regen:SOURCE, regen_temperature: ..., seed: ...}: its regen: set made with those
    settings instead of data.'s (a sampled set beside a greedy one of the same prompts)."""
    out = []
    for e in getattr(cfg, "also", None) or []:
        if isinstance(e, str):
            out.append((e, {}))
        else:
            e = dict(e)
            out.append((str(e.pop("path", "")), e))
    return out


def also(cfg) -> list[str]:
    """data.also's sources (each entry's path), empty for a config saved before the key existed."""
    return [path for path, _ in also_entries(cfg)]


def read_excluded_ids(cfg) -> set[str]:
    """data.exclude_ids: a JSONL of {"id": ...} records (a run's heldout_prompts.jsonl) or one id per line."""
    path = getattr(cfg, "exclude_ids", None)
    if not path:
        return set()
    p = Path(path)
    if not p.is_file():
        raise DataError(f'data.exclude_ids={path}: no such file (a JSONL of {{"id": ...}} records or one id per line)')
    ids = set()
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise DataError(f'{p}:{n}: not JSON ({e}); data.exclude_ids reads {{"id": ...}} lines') from None
            if "id" not in rec:
                raise DataError(f'{p}:{n}: a record without "id"; data.exclude_ids reads {{"id": ...}} lines')
            line = str(rec["id"])
        ids.add(line)
    return ids


def source_id(conv_id: str) -> str:
    """The conversation a sample came from: its id without the `#w` of a window `split_windows` cut."""
    head, sep, tail = conv_id.rpartition("#")
    return head if sep and tail.isdigit() else conv_id


def cache_key(cfg, tokenizer) -> str:
    """sha1 over everything that changes the prepared data: source file, tokenizer, data settings, code."""
    vocab = "\0".join(f"{t}\1{i}" for t, i in sorted(tokenizer.get_vocab().items()))
    options = template_options(tokenizer)
    parts = {
        "source": _source_fingerprint(str(cfg.path)),
        "chat_template": tokenizer.chat_template,
        **({"template": options.describe()} if options != TemplateOptions() else {}),
        "vocab_size": len(tokenizer),
        "vocab_sha1": hashlib.sha1(vocab.encode("utf-8", errors="surrogatepass")).hexdigest(),
        "tokenizer_class": type(tokenizer).__name__,
        "max_length": cfg.max_length,
        **({"overflow": overflow(cfg)} if overflow(cfg) != "truncate" else {}),  # older caches keep their keys
        **({"also": [_source_fingerprint(p) for p in also(cfg)]} if also(cfg) else {}),
        **({"also_settings": [s for _, s in also_entries(cfg)]} if any(s for _, s in also_entries(cfg)) else {}),
        **({"exclude_ids": _source_fingerprint(cfg.exclude_ids)} if getattr(cfg, "exclude_ids", None) else {}),
        "num_conversations": cfg.num_conversations,
        "heldout": cfg.heldout,
        "seed": cfg.seed,
        "code_version": CODE_VERSION,
    }
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def _pack(samples: list[Sample]) -> dict:
    # One flat tensor per field: torch.save of 10^7 python ints would be slow and large.
    return {
        "input_ids": torch.tensor(list(itertools.chain.from_iterable(s.input_ids for s in samples)), dtype=torch.int64),
        "loss_mask": torch.tensor(list(itertools.chain.from_iterable(s.loss_mask for s in samples)), dtype=torch.bool),
        "lengths": torch.tensor([len(s.input_ids) for s in samples], dtype=torch.int64),
        "conv_ids": [s.conv_id for s in samples],
    }


def _unpack(packed: dict) -> list[Sample]:
    ids, mask = packed["input_ids"].tolist(), packed["loss_mask"].to(torch.uint8).tolist()
    out, start = [], 0
    for n, cid in zip(packed["lengths"].tolist(), packed["conv_ids"]):
        out.append(Sample(input_ids=ids[start : start + n], loss_mask=mask[start : start + n], conv_id=cid))
        start += n
    return out


def _save_atomic(obj: dict, path: Path) -> None:
    with atomic_file(path) as tmp:  # a kill mid-write leaves the old cache (or none), never half a file
        torch.save(obj, tmp)


def _render_all(
    tokenizer, convs: list[Conversation], max_length: int, desc: str, tally: dict, overflow: str = "truncate"
) -> list[Sample]:
    """Rendered samples of `convs`; one over `max_length` tokens is truncated or (overflow="split") cut into
    windows (`split_windows`)."""
    out = []
    pairs = ((c.id, c.messages) for c in convs)
    # Rendered untruncated so truncation can be counted; one odd conversation must not stop the run.
    for r in tqdm(render_many(tokenizer, pairs, sys.maxsize), total=len(convs), desc=desc, unit="conv", leave=False):
        if isinstance(r, DataError):
            tally["render_errors"] += 1
            if len(tally["examples"]) < 5:
                tally["examples"].append(str(r))
            continue
        if r is None:
            tally["no_supervised_tokens"] += 1
            continue
        tally["tokens_before_truncation"] += len(r.input_ids)
        if len(r.input_ids) > max_length:
            tally["truncated"] += 1
            if overflow == "split":
                windows = split_windows(r, max_length)
                tally["extra_windows"] += max(0, len(windows) - 1)
                if not windows:
                    tally["no_supervised_after_truncation"] += 1
                out += windows
                continue
        s = truncate(r, max_length)
        if s is None:
            tally["no_supervised_after_truncation"] += 1
            continue
        out.append(s)
    return out


def heldout_prompt(conv: Conversation) -> dict:
    """The conversation up to its first assistant answer, and that answer as the reference."""
    k = next(i for i, m in enumerate(conv.messages) if m["role"] == "assistant")
    return {"id": conv.id, "messages": conv.messages[:k], "reference": conv.messages[k]["content"]}


def _build(cfg, tokenizer) -> PreparedData:
    if cfg.heldout < 0 or cfg.max_length <= 0 or (cfg.num_conversations is not None and cfg.num_conversations < 0):
        raise ConfigError(
            f"bad data config: heldout={cfg.heldout}, max_length={cfg.max_length}, "
            f"num_conversations={cfg.num_conversations}"
        )
    window = max(HELDOUT_WINDOW, cfg.heldout)
    limit = None if cfg.num_conversations is None else max(cfg.num_conversations + cfg.heldout, window)
    read = ReadStats()
    t0 = time.perf_counter()
    convs = list(read_conversations(str(cfg.path), limit=limit, stats=read))
    read_s = time.perf_counter() - t0
    _, held = split_heldout(convs[:window], cfg.heldout, cfg.seed)
    held_ids = {c.id for c in held}
    train_convs = [c for c in convs if c.id not in held_ids]
    if cfg.num_conversations is not None:
        train_convs = train_convs[: cfg.num_conversations]
    if not train_convs:
        raise DataError(
            f"{cfg.path}: no training conversations left ({read.kept} kept, {len(held)} held out)\n" + read.summary()
        )
    also_stats = []
    excluded = read_excluded_ids(cfg)
    if excluded:
        train_convs = [c for c in train_convs if source_id(c.id) not in excluded]
    for extra, settings in also_entries(cfg):  # each (its first num_conversations), less those held out (by id)
        more = ReadStats()
        convs_x = list(read_conversations(extra, limit=settings.get("num_conversations"), stats=more))
        held_x = [c for c in convs_x if source_id(c.id) in held_ids]
        kept = [c for c in convs_x if source_id(c.id) not in held_ids and source_id(c.id) not in excluded]
        train_convs += kept
        also_stats.append(
            {
                "source": extra,
                "read": more.summary(),
                "kept": len(kept),
                "held_out_ids": len(held_x),
                **({"excluded_ids": len(convs_x) - len(kept) - len(held_x)} if excluded else {}),
            }
        )
    tallies = {
        name: {
            "render_errors": 0,
            "no_supervised_tokens": 0,
            "no_supervised_after_truncation": 0,
            "truncated": 0,
            "tokens_before_truncation": 0,
            "extra_windows": 0,
            "examples": [],
        }
        for name in ("train", "heldout")
    }
    train = _render_all(tokenizer, train_convs, cfg.max_length, "render train", tallies["train"], overflow(cfg))
    heldout = _render_all(tokenizer, held, cfg.max_length, "render held-out", tallies["heldout"])
    if not train:
        raise DataError(f"{cfg.path}: no training sample has a supervised token after rendering: {tallies['train']}")
    counts = count_supervised(train, len(tokenizer))
    stats = {
        "source": str(cfg.path),
        "read": read.summary(),
        "read_seconds": round(read_s, 2),
        "records_read": read.read,
        "conversations_kept": read.kept,
        "skipped": dict(read.skipped),
        "trimmed": dict(read.trimmed),
        "file_truncated": read.truncated,
        **({"also": also_stats} if also_stats else {}),
        "train_conversations": len(train_convs),
        "heldout_conversations": len(held),
        "train_samples": len(train),
        "heldout_samples": len(heldout),
        "train_tokens": sum(len(s.input_ids) for s in train),
        "train_supervised_tokens": int(counts.sum()),
        "heldout_tokens": sum(len(s.input_ids) for s in heldout),
        "render": tallies,
    }
    return PreparedData(
        train=train, heldout=heldout, heldout_prompts=[heldout_prompt(c) for c in held], counts=counts, stats=stats
    )


def prepare_data(cfg, tokenizer, cache_dir: Path | None) -> PreparedData:
    """Read, split, render and count once; later calls with the same inputs load `cache_dir/data/<key>.pt`."""
    path = None
    if cache_dir is not None:
        key = cache_key(cfg, tokenizer)
        path = Path(cache_dir) / "data" / f"{key}.pt"
        if path.exists():
            try:
                blob = torch.load(path, weights_only=True)
                return PreparedData(
                    train=_unpack(blob["train"]),
                    heldout=_unpack(blob["heldout"]),
                    heldout_prompts=blob["heldout_prompts"],
                    counts=blob["counts"],
                    stats={**blob["stats"], "cache": str(path), "cache_hit": True},
                )
            except Exception as e:  # a damaged cache is rebuilt, not trusted
                warnings.warn(f"{path}: unreadable data cache ({type(e).__name__}: {e}); rebuilding", stacklevel=2)
    data = _build(cfg, tokenizer)
    if path is not None:
        _save_atomic(
            {
                "code_version": CODE_VERSION,
                "train": _pack(data.train),
                "heldout": _pack(data.heldout),
                "heldout_prompts": data.heldout_prompts,
                "counts": data.counts,
                "stats": data.stats,
            },
            path,
        )
        data.stats.update(cache=str(path), cache_hit=False)
    return data


def epoch_batches(data, cfg, epoch: int, rank: int, world: int) -> list[list[int]]:
    """This rank's micro-batches (sample indices) for one epoch, `optim.grad_accum` per optimizer step.

    Optimizer step s consumes the epoch's micro-batches [s*G, (s+1)*G), G = world * grad_accum, and rank r
    takes every world-th of them: the global batch depends on G only, so 2 ranks x 1 micro-batch train the
    same steps as 1 rank x 2 micro-batches. Deterministic in (seed, epoch).
    """
    lengths = [len(s.input_ids) for s in data.train]
    batches = make_batches(lengths, cfg.data.max_tokens_per_batch, cfg.data.max_batch_size, cfg.data.seed, epoch)
    group = world * cfg.optim.grad_accum
    usable = len(batches) // group * group  # every rank takes the same number of steps
    return batches[rank:usable:world]


def make_batches(lengths: list[int], max_tokens: int, max_batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Length-bucketed batches of indices, each with len(batch) * longest <= max_tokens; deterministic per
    (seed, epoch)."""
    if max_tokens <= 0 or max_batch_size <= 0:
        raise ValueError(f"max_tokens and max_batch_size must be > 0, got {max_tokens}, {max_batch_size}")
    too_long = [(i, n) for i, n in enumerate(lengths) if n > max_tokens]
    if too_long:
        i, n = too_long[0]
        raise ConfigError(
            f"{len(too_long)} samples are longer than max_tokens={max_tokens} (e.g. sample {i}: "
            f"{n} tokens); raise max_tokens_per_batch or lower max_length"
        )
    rng = random.Random(f"draftsmith-batches:{seed}:{epoch}")  # str seeds hash with sha512: stable across runs
    order = list(range(len(lengths)))
    rng.shuffle(order)
    # Sorting only within chunks keeps batches random across the epoch while padding stays small.
    chunk = max_batch_size * 64
    batches: list[list[int]] = []
    for c in range(0, len(order), chunk):
        part = sorted(order[c : c + chunk], key=lambda i: lengths[i])  # stable: ties keep the shuffled order
        batch: list[int] = []
        longest = 0
        for i in part:
            n = max(longest, lengths[i])
            if batch and ((len(batch) + 1) * n > max_tokens or len(batch) >= max_batch_size):
                batches.append(batch)
                batch, n = [], lengths[i]
            batch.append(i)
            longest = n
        if batch:
            batches.append(batch)
    rng.shuffle(batches)
    return batches


def collate(samples: list[Sample], pad_id: int) -> dict:
    """Right-pad to the longest sample: input_ids/attention_mask LongTensor [B, T], loss_mask FloatTensor [B, T]."""
    if not samples:
        raise ValueError("collate needs at least one sample")
    B, T = len(samples), max(len(s.input_ids) for s in samples)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)  # [B, T]
    loss_mask = torch.zeros((B, T), dtype=torch.float32)  # [B, T]
    attention_mask = torch.zeros((B, T), dtype=torch.long)  # [B, T]
    for b, s in enumerate(samples):
        n = len(s.input_ids)
        input_ids[b, :n] = torch.tensor(s.input_ids, dtype=torch.long)
        loss_mask[b, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        attention_mask[b, :n] = 1
    return {"input_ids": input_ids, "loss_mask": loss_mask, "attention_mask": attention_mask}

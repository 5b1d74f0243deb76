"""`draftsmith extract`: a training config's target features, written once as safetensors shards + a manifest.

    draftsmith extract --out features/eagle3_smollm2 conf=eagle3_smollm2 --max-disk 20G
    accelerate launch --num_processes 8 -m draftsmith.cli extract --out DIR conf=eagle3_llama8b      # GPUs
    ACCELERATE_USE_CPU=1 torchrun --standalone --nproc_per_node 2 -m draftsmith.cli extract --out DIR ...  # gloo, CPU
    draftsmith extract --validate features/eagle3_smollm2                   # shards vs manifest
    draftsmith extract --validate features/eagle3_smollm2 conf=eagle3_smollm2   # ... and vs this run's target/data
    python train/run.py conf=eagle3_smollm2 data.features=offline data.features_dir=features/eagle3_smollm2

The samples are the run's training samples (the same Hydra overrides as train/run.py pick them), then its held-out
samples into DIR/heldout (with the target's full-vocab argmax), so a run training from DIR evaluates without the
target. More aux layers than a head takes (target.aux_layer_ids=[...]) serve a run on any choice among them.
Under `accelerate launch` rank r takes samples i % world == r and
writes its own shards; rank 0 merges the manifest. Re-running the same command resumes: finished shards are
kept, a shard a kill cut short is redone. `--max-disk` stops before the directory would exceed the budget
and the manifest records what was covered; the same command with a larger budget carries on (exit status 0:
what was written is kept). A budget too small for even one shard writes nothing and exits 2, naming the smallest
--max-disk that lets extraction start. A shard deleted from the directory is extracted again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from draftsmith.atomic import atomic_write, atomic_write_json
from draftsmith.errors import ConfigError
from draftsmith.lock import acquire_dir
from draftsmith.train.build import build_run
from draftsmith.train.config import compose_config, validate_config
from draftsmith.train.features.shards import (
    COMPRESSIONS,
    DTYPE_NAMES,
    DTYPES,
    FORMAT,
    HELDOUT_DIR,
    HELDOUT_FIELDS,
    INT_FIELDS,
    VERSION,
    ShardError,
    fingerprint_differences,
    fingerprint_sha1,
    fmt_size,
    fmt_size_up,
    forget_shards,
    load_manifest,
    missing_shards,
    orphan_files,
    pack_shard,
    parse_size,
    part_path,
    row_of,
    run_fingerprint,
    shard_name,
    validate,
    write_manifest,
)
from draftsmith.train.features.vllm_source import VllmFeatures, check_backend
from draftsmith.train.heads import families


@torch.no_grad()
def feature_rows(target, samples, indices: list[int], fields, dtype: torch.dtype, pad_id: int, device) -> list[dict]:
    """One target forward over the collated samples `indices`; each sample's unpadded features, in order."""
    from draftsmith.train.data.dataset import collate

    batch = collate([samples[i] for i in indices], pad_id)
    ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
    none = torch.zeros(0, dtype=torch.long, device=device)  # no logits: rebuilt from `last` at training time
    f = target.features(ids, mask, none, full_top="top" in fields)
    rows = []
    for b, i in enumerate(indices):
        n = len(samples[i].input_ids)
        rows.append(row_of(samples[i], i, {k: getattr(f, k)[b, :n] for k in fields}, dtype))  # [n, D] ([n]: top)
    return rows


def forward_groups(samples, indices: list[int], max_tokens: int, max_batch: int) -> list[list[int]]:
    """Length-sorted groups of `indices`, each at most max_tokens padded tokens and max_batch samples."""
    groups, cur, longest = [], [], 0
    for i in sorted(indices, key=lambda i: len(samples[i].input_ids)):
        n = max(longest, len(samples[i].input_ids))
        if cur and ((len(cur) + 1) * n > max_tokens or len(cur) >= max_batch):
            groups.append(cur)
            cur, n = [], len(samples[i].input_ids)
        cur.append(i)
        longest = n
    return groups + ([cur] if cur else [])


def call_groups(samples, indices: list[int], tokens: int) -> list[list[int]]:
    """`indices` in order, cut into groups of about `tokens` tokens (at least one sample each): one vLLM call each,
    so that the progress bar moves within a shard (a 2-core AVX2 machine takes ~3 minutes for a shard's 58k)."""
    groups, cur, n = [], [], 0
    for i in indices:
        if cur and n + len(samples[i].input_ids) > tokens:
            groups.append(cur)
            cur, n = [], 0
        cur.append(i)
        n += len(samples[i].input_ids)
    return groups + ([cur] if cur else [])


def dir_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


def header_for(
    cfg, target, tokenizer, data, vocab, dtype: torch.dtype, compression: str = "none", split: str = "train"
) -> dict:
    family = families.get(cfg.head.family)
    fp = run_fingerprint(cfg, target, data.train if split == "train" else data.heldout, tokenizer)
    H = target.config.hidden_size
    draft_vocab = None  # a head without a draft vocab (a full-vocab MLP speculator) predicts over the target's
    if vocab is not None:
        d2t_sha1 = hashlib.sha1(vocab.d2t.cpu().numpy().tobytes()).hexdigest()
        draft_vocab = {"size": cfg.head.draft_vocab_size, "d2t_sha1": d2t_sha1}
    return {
        "format": FORMAT,
        "version": VERSION,
        "family": family.features_family,
        "fields": list(family.fields) + (list(HELDOUT_FIELDS) if split == "heldout" else []),
        "split": split,
        "dtype": DTYPE_NAMES[dtype],
        "compression": compression,
        "hidden_size": H,
        "aux_dim": len(target.aux_layer_ids) * H,
        "fingerprint": fp,
        "fingerprint_sha1": fingerprint_sha1(fp),
        # informational: the stored features do not depend on the draft vocab (logits are rebuilt per run)
        "draft_vocab": draft_vocab,
        "shards": [],
    }


def shard_meta(header: dict) -> dict:
    """The metadata every shard carries (what validate checks it against)."""
    return {"format": FORMAT, "fingerprint_sha1": header["fingerprint_sha1"], "family": header["family"]}


def shard_record(name: str, rank: int, seq: int, rows: list[dict], tokens: int, blob: bytes) -> dict:
    """A shard's manifest entry."""
    return {
        "name": name,
        "rank": rank,
        "seq": seq,
        "samples": [r["index"] for r in rows],
        "tokens": tokens,
        "bytes": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
    }


def shard_cost(blob: bytes, record: dict) -> int:
    """What a shard adds to the directory under --max-disk: its file and its entries in the rank part and manifest."""
    return len(blob) + 2 * len(json.dumps(record, indent=1)) + 64


def estimate_cost(tokens: int, n_samples: int, per_token: float) -> int:
    """The pre-check's guess at a shard's cost, before its features are computed."""
    overhead = 1024 + 48 * n_samples  # safetensors header, offsets, ids, conv ids + manifest entries
    return math.ceil(tokens * per_token) + overhead


def forget_missing(root: Path, log) -> None:
    """Drop listed shards whose file is gone or has another size (deleted as the checksum error advises, or
    replaced), so this extraction redoes their samples; the file of a wrong-sized one then goes as an orphan."""
    gone = missing_shards(root, load_manifest(root))
    if gone:
        log(
            f"extract: {len(gone)} shard(s) the manifest lists are missing or of another size; extracting their "
            f"samples again: " + "; ".join(list(gone.values())[:5])
        )
        forget_shards(root, gone)


def packed(rows: list[dict], rank: int, seq: int, dtype, fields, header: dict, compression: str):
    """(bytes, manifest entry, cost under the budget) of the shard holding `rows`."""
    tokens = sum(len(r["input_ids"]) for r in rows)
    blob = pack_shard(rows, dtype, fields, shard_meta(header), compression)
    record = shard_record(shard_name(rank, seq), rank, seq, rows, tokens, blob)
    return blob, record, shard_cost(blob, record)


def smallest_start(
    target, samples, index: int, fields, dtype, header, compression, device, rank: int, seq: int, per_token: float,
    rows_of=feature_rows,
) -> int:  # fmt: skip
    """Bytes of budget the smallest possible first shard (sample `index` alone) needs: its exact cost, or the
    pre-check's estimate where that is larger (a shard is written only when both fit)."""
    rows = rows_of(target, samples, [index], fields, dtype, target.pad_id, device)
    blob, _, exact = packed(rows, rank, seq, dtype, fields, header, compression)
    # compressed sizes follow the values, which move in the last bits when the sample is computed in a batch
    slack = 0 if compression == "none" else len(blob) // 100 + 64
    return max(exact + slack, estimate_cost(len(samples[index].input_ids), 1, per_token))


def budget_too_small(
    max_disk, root: Path, dir0: int, need: int, world: int, todo_tokens: int, per_token: float, num_samples: int
) -> str:
    """The message when --max-disk stops extraction before a single sample is written."""
    smallest = dir0 + world * need  # each process gets an equal share of what the directory has left
    each = f" for each of the {world} processes" if world > 1 else ""
    return (
        f"--max-disk {max_disk} ({parse_size(max_disk):,} bytes) is too small to write even one shard, so "
        f"nothing was written (no new shard in {root}). The directory takes {dir0:,} bytes (its "
        f"manifest and any earlier shards) and the smallest first shard (one sample, with its manifest entries) "
        f"needs {need:,} bytes{each}: the smallest --max-disk that lets extraction start is "
        f"{fmt_size_up(smallest)}; all {num_samples} samples need about "
        f"{fmt_size_up(dir0 + math.ceil(todo_tokens * per_token))} (~{per_token:,.0f} bytes/token x "
        f"{todo_tokens:,} tokens). Re-run the same command with a larger --max-disk, or train with "
        "data.features=stream, which needs only a bounded buffer"
    )


def check_compatible(existing: dict, header: dict, root: Path) -> None:
    """Refuse to resume into a directory written for another target, data, family, dtype or compression."""
    diffs = fingerprint_differences(existing["fingerprint"], header["fingerprint"])
    for k in ("family", "dtype", "compression"):
        if existing.get(k, "none") != header[k]:
            diffs.append(f"{k}: {existing.get(k, 'none')} there, {header[k]} now")
    if diffs:
        raise ShardError(
            f"{root} holds features of another extraction; use a new --out or delete it:\n  " + "\n  ".join(diffs)
        )


def extract(
    cfg,
    out,
    max_disk=None,
    dtype: str = "auto",
    shard_size="256M",
    log=print,
    inputs=None,
    compression: str = "none",
    accelerator=None,
    split: str = "train",
    backend: str | None = None,
    engine=None,
) -> dict:
    """Extract (or finish extracting) the features of `cfg`'s training samples into `out`; returns a summary.

    Then the held-out samples' into `out/heldout` (with the target's full-vocab argmax per token), so a run
    training from these features evaluates from disk too and needs no decoder layer of the target.

    Args:
        inputs: (target, tokenizer, data, vocab) already built for `cfg` (bench/extract.py reuses one load).
        compression: "none" | "zlib" (shards.compress_field: lossless, ~0.74 of the bytes for bf16 states).
        accelerator: the training run's (a run that extracts its own features); None = a new one.
        backend: "hf" (a transformers forward of `target`) or "vllm" (the serving engine's prefill,
            train/features/vllm_source.py: `target` may then be a TargetEnds); None = data.features_backend.
        engine: the held-out pass reuses the training pass's vLLM engine.
    """
    from accelerate import Accelerator

    # reads the launcher's env (torchrun + ACCELERATE_USE_CPU=1 gives gloo processes on CPU)
    state = accelerator if accelerator is not None else Accelerator()
    rank, world, device = state.process_index, state.num_processes, state.device
    main = state.is_main_process
    backend = backend or cfg.data.get("features_backend", "hf")
    check_backend(backend, world)
    root = Path(out)
    budget = parse_size(max_disk) if max_disk else None
    shard_bytes = parse_size(shard_size)
    fresh = not root.exists()  # made by this call: removed again if not one sample fits the disk budget
    if main:  # one process per features directory (another run extracting the same data is refused, named)
        acquire_dir(root, f"extracting features into {root}")
    with state.main_process_first():  # rank 0 renders/caches the data, the others then read the cache
        target, tokenizer, data, vocab = inputs or build_run(  # vLLM loads the decoder layers itself
            cfg, device, root if main else None, log=log if main else (lambda *a: None), ends_only=backend == "vllm"
        )
    target.to(device)
    store_dtype = target.dtype if dtype == "auto" else DTYPES[dtype]
    header = header_for(cfg, target, tokenizer, data, vocab, store_dtype, compression, split)
    fields, samples = tuple(header["fields"]), data.train if split == "train" else data.heldout

    if (root / "manifest.json").is_file():
        check_compatible(load_manifest(root), header, root)  # every rank checks: all fail alike, none hangs
    state.wait_for_everyone()
    if main:
        if not (root / "manifest.json").is_file():
            write_manifest(root, header)
        forget_missing(root, log)
        merged = load_manifest(root)
        for p in orphan_files(root, merged):  # a shard a kill cut off from its manifest entry: redone below
            p.unlink()
        for part in (root / "parts").glob("rank-*.json"):  # an earlier budget stop no longer holds
            body = json.loads(part.read_text())
            if body.get("stopped"):
                atomic_write_json(part, {**body, "stopped": None})
    state.wait_for_everyone()

    manifest = load_manifest(root)
    done = {i for s in manifest["shards"] for i in s["samples"]}
    mine = [s for s in manifest["shards"] if s["rank"] == rank]
    seq = 1 + max((s["seq"] for s in mine), default=-1)
    part = {"rank": rank, "shards": mine, "stopped": None}
    dir0 = dir_bytes(root)
    share = None if budget is None else (budget - dir0) // world  # this rank's part of what is left
    per_token = (
        sum({"aux": manifest["aux_dim"], "last": manifest["hidden_size"]}.get(f, 0) for f in fields)
        * store_dtype.itemsize
        + sum(INT_FIELDS[f].itemsize for f in fields if f in INT_FIELDS)
        + 4
        + 1
    )  # features (+ int32 top) + int32 id + uint8 mask
    if manifest["covered_tokens"]:
        per_token = manifest["bytes"] / manifest["covered_tokens"]  # measured: includes headers

    todo = [i for i in range(len(samples)) if i % world == rank and i not in done]
    todo_tokens = sum(len(samples[i].input_ids) for i in todo)
    rows_of, own_engine = feature_rows, None
    if backend == "vllm" and todo:
        if engine is None:
            longest = max(len(s.input_ids) for s in (*data.train, *data.heldout))
            engine = own_engine = VllmFeatures(target, longest, cfg.data.max_tokens_per_batch, root, log=log)
        rows_of = engine.rows
    bar = tqdm(
        total=todo_tokens,
        desc=f"extract (rank {rank}/{world})" if world > 1 else "extract",
        unit="tok",
        unit_scale=True,
        disable=not main,
        dynamic_ncols=True,
    )
    used, new_tokens, new_samples, start, cpu0, pos = 0, 0, 0, time.time(), time.process_time(), 0
    max_tokens, max_batch = cfg.data.max_tokens_per_batch, cfg.data.max_batch_size
    while pos < len(todo):
        chunk, tokens = [], 0
        target_tokens = max(1, int(shard_bytes / per_token))
        while pos < len(todo) and (not chunk or tokens + len(samples[todo[pos]].input_ids) <= target_tokens):
            chunk.append(todo[pos])
            tokens += len(samples[todo[pos]].input_ids)
            pos += 1
        if share is not None:
            while chunk and used + estimate_cost(tokens, len(chunk), per_token) > share:  # shrink to what fits
                pos -= 1
                tokens -= len(samples[chunk.pop()].input_ids)
            if not chunk:
                part["stopped"] = (
                    f"--max-disk {max_disk}: the next sample ({len(samples[todo[pos]].input_ids)} tokens, "
                    f"~{fmt_size(len(samples[todo[pos]].input_ids) * per_token)}) would take rank {rank} "
                    f"past its share {fmt_size(share)} of the budget (used {fmt_size(used)})"
                )
                break
        rows, shown = [], 0
        if backend == "vllm":  # vLLM batches each call's samples itself: calls of two engine steps' tokens
            groups = call_groups(samples, chunk, 2 * max_tokens)
        else:
            groups = forward_groups(samples, chunk, max_tokens, max_batch)
        for group in groups:
            rows += rows_of(target, samples, group, fields, store_dtype, target.pad_id, device)
            done_tokens = sum(len(samples[i].input_ids) for i in group)
            bar.update(done_tokens)  # the shard is not written yet: a stop here redoes it, the bar only shows work
            shown += done_tokens
        rows.sort(key=lambda r: r["index"])
        blob, record, cost = packed(rows, rank, seq, store_dtype, fields, header, compression)
        while share is not None and used + cost > share and len(rows) > 1:  # the estimate was low: fewer samples
            rows = rows[: max(1, min(len(rows) - 1, int(len(rows) * (share - used) / cost)))]
            blob, record, cost = packed(rows, rank, seq, store_dtype, fields, header, compression)
        name = record["name"]
        if share is not None and used + cost > share:
            part["stopped"] = (
                f"--max-disk {max_disk}: shard {name} ({fmt_size(len(blob))}) would take rank {rank} "
                f"past its share {fmt_size(share)} of the budget"
            )
            break
        pos -= len(chunk) - len(rows)  # samples dropped to fit go back to the queue (rows follow chunk's order)
        tokens = record["tokens"]
        atomic_write(root / name, blob)
        part["shards"].append(record)
        atomic_write_json(part_path(root, rank), part)  # the shard counts as done from here on
        if main:
            write_manifest(root, load_manifest(root))
        used += cost
        per_token = len(blob) / tokens if new_tokens == 0 and not manifest["covered_tokens"] else per_token
        seq, new_tokens, new_samples = seq + 1, new_tokens + tokens, new_samples + len(rows)
        bar.update(tokens - shown)  # samples dropped to fit the disk budget go back to the queue
    bar.close()
    elapsed, cpu_s = time.time() - start, time.process_time() - cpu0
    need = 0  # when not one sample fit: what the smallest first shard would take, for the message
    if part["stopped"] and new_samples == 0:
        need = smallest_start(
            target, samples, todo[0], fields, store_dtype, header, compression, device, rank, seq, per_token, rows_of
        )
    atomic_write_json(part_path(root, rank), part)
    if world > 1:
        log(
            f"rank {rank}: {new_samples} samples, {new_tokens} tokens in {elapsed:.1f} s "
            f"({new_tokens / max(elapsed, 1e-9):.0f} tok/s)"
        )
    state.wait_for_everyone()
    final = load_manifest(root)
    if main:
        write_manifest(root, final)
    totals = torch.tensor([new_tokens, new_samples, todo_tokens], dtype=torch.long)
    needs = torch.tensor([need], dtype=torch.long)
    if world > 1:  # every rank's new tokens, for the overall rate, and the largest first shard
        import torch.distributed as dist

        totals, needs = totals.to(device), needs.to(device)
        dist.all_reduce(totals)
        dist.all_reduce(needs, op=dist.ReduceOp.MAX)
        totals, needs = totals.cpu(), needs.cpu()
    if final["stopped"] and int(totals[1]) == 0:  # every rank raises alike: none is left waiting
        message = budget_too_small(
            max_disk,
            root,
            dir_bytes(root),
            int(needs[0]),
            world,
            int(totals[2]),
            per_token,
            final["fingerprint"]["data"]["num_samples"],
        )
        state.wait_for_everyone()
        if main and fresh:  # nothing was extracted: leave no manifest, parts/ or stats behind
            shutil.rmtree(root, ignore_errors=True)
        raise ConfigError(message)
    summary = {
        "dir": str(root),
        "new_tokens": int(totals[0]),
        "new_samples": int(totals[1]),
        "seconds": round(elapsed, 2),
        "cpu_seconds": round(cpu_s, 2),  # this process's CPU time: a rate that other jobs on the cores do not skew
        "tok_per_s": round(int(totals[0]) / max(elapsed, 1e-9), 1),
        "processes": world,
        "covered_samples": final["covered_samples"],
        "num_samples": final["fingerprint"]["data"]["num_samples"],
        "covered_tokens": final["covered_tokens"],
        "bytes": final["bytes"],
        "bytes_per_token": round(final["bytes"] / max(1, final["covered_tokens"]), 1),
        "complete": final["complete"],
        "stopped": final["stopped"],
        "backend": backend,
    }
    if main:
        log(
            f"extract: {summary['new_samples']} samples / {summary['new_tokens']} tokens in {elapsed:.1f} s = "
            f"{summary['tok_per_s']:.0f} tok/s ({world} process{'es' if world > 1 else ''}) with {backend}; "
            f"{root} covers {summary['covered_samples']}/{summary['num_samples']} samples, "
            f"{summary['covered_tokens']} tokens, {fmt_size(summary['bytes'])} "
            f"({summary['bytes_per_token']:.0f} bytes/token, {header['dtype']})"
        )
        if final["stopped"]:
            log(
                "extract: stopped before exceeding the disk budget: "
                + "; ".join(final["stopped"].values())
                + f"\n  the manifest records the {summary['covered_samples']} covered samples; re-run with a larger "
                "--max-disk to continue, or train with data.features=stream"
            )
    if split == "train" and summary["complete"] and data.heldout:  # small: no budget, same dtype and resumability
        held = extract(
            cfg,
            root / HELDOUT_DIR,
            None,
            DTYPE_NAMES[store_dtype],
            shard_size,
            log,
            (target, tokenizer, data, vocab),
            "none",
            state,
            split="heldout",
            backend=backend,
            engine=engine,
        )
        summary["heldout"] = {k: held[k] for k in ("dir", "covered_samples", "num_samples", "bytes", "complete")}
    if own_engine is not None:
        own_engine.close()
    return summary


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="draftsmith extract", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "overrides", nargs="*", help="training config overrides, as for train/run.py (conf=NAME key=value ...)"
    )
    p.add_argument("--out", default=None, help="features directory (default: data.features_dir)")
    p.add_argument("--max-disk", default=None, help="disk budget for the directory, e.g. 20G or 500M (binary units)")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", *DTYPES],
        help="storage dtype of the hidden states (auto = the target's, lossless)",
    )
    p.add_argument(
        "--compress",
        default="none",
        choices=list(COMPRESSIONS),
        help="zlib: feature bytes grouped by significance, then zlib (bf16 SmolLM2 states: ~0.74 of the size; "
        "costs CPU on write and read)",
    )
    p.add_argument("--shard-size", default="256M", help="target size of one shard file (default 256M)")
    p.add_argument(
        "--backend",
        default=None,
        choices=["hf", "vllm"],
        help="what computes the hidden states: hf (a transformers forward) or vllm (the serving engine's prefill, "
        "its extract_hidden_states method); default data.features_backend (hf)",
    )
    p.add_argument(
        "--validate",
        metavar="DIR",
        default=None,
        help="check DIR's shards (checksum, shapes, sample ids, fingerprint); with overrides, also "
        "against that run's target and data",
    )
    args = p.parse_args(argv)
    # a budget too small to start (exit 2), a bad directory (exit 1): one paragraph. A budget that stops the run
    # part way exits 0: what was written is kept and the same command with a larger budget carries on.
    return run_main(p, args)  # errors: one paragraph from draftsmith/cli.py's handler


def run_main(p: argparse.ArgumentParser, args) -> int:
    """`draftsmith extract` after argument parsing: validate a directory, or extract into one."""
    if args.validate:
        return run_validate(args.validate, args.overrides)
    cfg = compose_config(args.overrides)
    validate_config(cfg)  # the same checks as training: a bad key fails here, naming it
    out = args.out or cfg.data.get("features_dir")
    if not out:
        p.error("--out DIR (or data.features_dir=DIR) is required")
    extract(cfg, out, args.max_disk, args.dtype, args.shard_size, compression=args.compress, backend=args.backend)
    return 0


def run_validate(root: str, overrides: list[str]) -> int:
    """`draftsmith extract --validate DIR [overrides]`: the training shards, then the held-out ones if present."""
    cfg = data = target = tokenizer = None
    if overrides:
        cfg = compose_config(overrides)
        target, tokenizer, data, _ = build_run(cfg, torch.device("cpu"), None, log=lambda *a: None)
    bad = 0
    for where, samples in ((Path(root), data and data.train), (Path(root) / HELDOUT_DIR, data and data.heldout)):
        if where.name == HELDOUT_DIR and not (where / "manifest.json").is_file():
            print(f"note: {where}: no held-out features (extracted before they were stored, or no held-out samples)")
            continue
        run_fp = run_fingerprint(cfg, target, samples, tokenizer) if data is not None else None
        manifest, problems, notes = validate(where, run_fp, samples if data is not None else None)
        for n in notes:
            print(f"note: {n}")
        for pr in problems:
            print(f"BAD: {pr}")
        print(
            f"{where}: {len(manifest['shards'])} shards, {manifest['covered_samples']}/"
            f"{manifest['fingerprint']['data']['num_samples']} samples, {manifest['covered_tokens']} tokens, "
            f"{fmt_size(manifest['bytes'])}, {manifest['family']} {manifest['dtype']}: "
            + ("OK" if not problems else f"{len(problems)} problem(s)")
        )
        bad += len(problems)
    return 1 if bad else 0

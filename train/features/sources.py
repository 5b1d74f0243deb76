"""Where a training batch's target features come from (data.features).

`online` runs the frozen target on every batch. `memory` runs it once per sample, on the sample's first
use, and keeps the sample's aux states and final hidden state (not the logits: [T, Vd] per token would
be several times larger, and one matmul with the target's lm_head rows rebuilds them). Every later epoch
then costs only the head: on SmolLM2 + a 2-core CPU the target forward is ~55 % of an online step.
Memory: (n_aux + 1) * H values per token in the target's dtype, 4.6 KB/token for SmolLM2 in bf16.

`offline` reads the same two tensors per sample from shards `draftsmith extract` wrote (data.features_dir), after
checking they were extracted for this run's target, aux layers, tokenizer and samples (and, as each shard is first
read, that its bytes are still the ones extracted: size and sha256 against the manifest). `stream` runs the target
in a producer process ahead of the trainer into a disk buffer bounded by data.max_disk (stream_process.py,
stream.py), so the training rank holds only the target's ends (embedding, final norm, lm_head rows).
Every mode hands the objective the same tensors: stored features are cast back to the target's dtype and the
logits rebuilt from `last`, so a batch's loss is the same whichever mode produced its features.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from draftsmith.train.target import Features

MODES = ("online", "memory", "offline", "stream")


class FeatureSource:
    def __init__(self, target, vocab_ids: torch.Tensor | None, mode: str = "online", disk=None, stream=None):
        """
        Args:
            disk: a ShardStore (mode offline); stream: a StreamProducer (mode stream).
        """
        if mode not in MODES:
            raise ValueError(f"data.features={mode!r}: expected one of {MODES}")
        self.target, self.vocab_ids, self.mode = target, vocab_ids, mode
        self.disk, self.stream = disk, stream
        self.store: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # sample index -> (aux [n, A], last [n, H])
        self.computed_tokens = 0  # tokens the target has run on (the rest came from the store)
        self.dtype = target.dtype  # what the target computes online

    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.store.values())

    def close(self) -> None:
        """Stop a stream producer and empty its buffer (a no-op for the other modes)."""
        if self.stream is not None:
            self.stream.close()
            self.computed_tokens = self.stream.stats["target_tokens"]

    def _rows(self, indices: list[int], batch: dict) -> list[tuple]:
        """(aux [n, A] or None, last [n, H], top [n] or None) per sample of the batch, unpadded."""
        ids, mask = batch["input_ids"], batch["attention_mask"]
        lengths = mask.sum(1).tolist()
        if self.mode == "memory":
            missing = [b for b, i in enumerate(indices) if i not in self.store]
            if missing:
                sub_ids, sub_mask = ids[missing], mask[missing]
                width = int(sub_mask.sum(1).max())
                f = self.target.features(sub_ids[:, :width], sub_mask[:, :width], self.vocab_ids)
                self.computed_tokens += int(sub_mask.sum())
                for row, b in enumerate(missing):
                    n = int(lengths[b])
                    # clone: a slice would keep the whole batch tensor alive
                    self.store[indices[b]] = (f.aux[row, :n].cpu().clone(), f.last[row, :n].cpu().clone())
            return [(*self.store[i], None) for i in indices]
        if self.mode == "stream":
            rows = self.stream.take(indices)
            self.computed_tokens = self.stream.stats["target_tokens"]
            return [(r.get("aux"), r["last"], r["top"].long() if "top" in r else None) for r in rows]
        out = []  # offline
        ids_cpu = ids.cpu()
        for b, i in enumerate(indices):
            r = self.disk.get(i)
            n = int(lengths[b])
            # the shard must hold this run's sample i: the same tokens (features depend on nothing else; which
            # rows are supervised is the loss's business, e.g. data.supervise=all widens the batch's mask)
            if r["input_ids"].shape[0] != n or not torch.equal(r["input_ids"], ids_cpu[b, :n]):
                from draftsmith.train.features.shards import ShardError

                raise ShardError(
                    f"{self.disk.root / r['shard']}: sample {i} holds other tokens than this run's sample "
                    f"{i} (run `draftsmith extract --validate {self.disk.root}` with this run's overrides)"
                )
            out.append((r.get("aux"), r["last"], r["top"].long() if "top" in r else None))
        return out

    def __call__(self, indices: list[int], batch: dict) -> Features:
        """Features for the collated `batch` of samples `indices` (right-padded: [B, T])."""
        ids, mask = batch["input_ids"], batch["attention_mask"]
        if self.mode == "online":
            self.computed_tokens += int(mask.sum())
            return self.target.features(ids, mask, self.vocab_ids)
        rows = self._rows(indices, batch)
        B, T = ids.shape
        device = ids.device
        H = rows[0][1].shape[-1]
        A = rows[0][0].shape[-1] if rows[0][0] is not None else 0  # no aux stored for an MLP speculator
        aux = torch.zeros(B, T, A, dtype=self.dtype)  # [B, T, n_aux*H]; padding rows are masked out of the loss
        last = torch.zeros(B, T, H, dtype=self.dtype)  # [B, T, H]
        for b, (a, h, _) in enumerate(rows):
            if a is not None:
                aux[b, : a.shape[0]] = a
            last[b, : h.shape[0]] = h
        aux, last = aux.to(device), last.to(device)
        logits = F.linear(last, self.target.output_weight(self.vocab_ids))  # [B, T, Vd]
        top = None
        if rows[0][2] is not None:  # held-out shards keep the target's full-vocab argmax (exact eval accuracy)
            top = torch.zeros(B, T, dtype=torch.long)  # [B, T]; padding rows are masked out
            for b, (_, _, t) in enumerate(rows):
                top[b, : t.shape[0]] = t
            top = top.to(device)
        return Features(aux=aux, last=last, logits=logits, top=top)


def features_complete(root, samples=None) -> bool:
    """Whether `root` holds a finished extraction whose listed shards are all there (stat only); with `samples`,
    also that it holds exactly these samples (the held-out split's check)."""
    from draftsmith.train.features.shards import load_manifest, missing_shards, samples_fingerprint

    root = Path(root)
    if not (root / "manifest.json").is_file():
        return False
    manifest = load_manifest(root)  # the merged view: a kill between a rank part and the manifest is read right
    same = samples is None or manifest["fingerprint"]["data"] == samples_fingerprint(samples)
    return manifest["complete"] and same and not missing_shards(root, manifest)


def ensure_offline_features(cfg, target, tokenizer, data, vocab, accelerator=None, log=print, load_whole=None) -> str:
    """data.features=offline without a features_dir: extract this run's features once into the cache, under
    features/<fingerprint of target, tokenizer and samples>-<head family>-<dtype>, or reuse them when an earlier
    run did. Returns the directory. Runs before training starts, so optim.max_minutes counts head training only;
    resumable like `draftsmith extract` (a kill keeps the finished shards).

    Args:
        target: the run's target; a TargetEnds (no decoder layers) is enough when the features exist already.
        load_whole: () -> the whole target, called only when something must be extracted (then freed).
    """
    from draftsmith.assets import cache_dir
    from draftsmith.train.features.extract import extract
    from draftsmith.train.features.shards import (
        DTYPE_NAMES,
        DTYPES,
        HELDOUT_DIR,
        ShardError,
        fingerprint_sha1,
        load_manifest,
        run_fingerprint,
    )
    from draftsmith.train.heads import families

    dtype = cfg.data.get("features_dtype", "auto")
    if dtype != "auto" and dtype not in DTYPES:
        raise ValueError(f"data.features_dtype={dtype!r}: expected auto | {' | '.join(DTYPES)}")
    name = DTYPE_NAMES[target.dtype] if dtype == "auto" else dtype
    digest = fingerprint_sha1(run_fingerprint(cfg, target, data.train, tokenizer))[:16]
    # the families store different fields (P-EAGLE reads EAGLE-3's: features_family)
    family = families.get(cfg.head.family)
    root = cache_dir() / "features" / f"{digest}-{family.features_family}-{name}"

    def complete(path: Path) -> bool:
        # a listed shard deleted since (a bad one, as the checksum error advises) sends the run back to extraction
        return features_complete(path) and (not data.heldout or features_complete(path / HELDOUT_DIR, data.heldout))

    if complete(root):
        log(f"features: extracted earlier, {root}")
        return str(root)
    # another family's extraction of the same target and samples that stores every field this one reads (an
    # EAGLE-3 extraction holds the final hidden states an MLP speculator trains on): the target need not run again
    for other in sorted(root.parent.glob(f"{digest}-*-{name}")):
        if other != root and complete(other):
            manifest = load_manifest(other)
            if set(family.fields) <= set(manifest["fields"]):
                log(f"features: extracted earlier for {manifest['family']} heads, which store this head's too, {other}")
                return str(other)
    log(
        f"features: extracting the target's features for {len(data.train)} training and {len(data.heldout)} "
        f"held-out samples once, into {root} (not counted in optim.max_minutes; later runs with the same target "
        f"and data reuse them)"
    )
    if cfg.data.get("features_backend", "hf") == "vllm":
        # the engine loads the decoder layers itself, in a process of its own: vLLM binds the OpenMP threads of the
        # process it runs in, which would be the training process's
        summary = extract_in_child(cfg, root, name, accelerator)
    else:
        whole = load_whole() if load_whole is not None else target
        summary = extract(
            cfg, root, dtype=name, log=log, inputs=(whole, tokenizer, data, vocab), accelerator=accelerator
        )
        del whole  # the decoder layers are not needed past extraction
    if not summary["complete"]:
        why = "; ".join((summary["stopped"] or {}).values()) or "the extraction stopped early"
        raise ShardError(
            f"data.features=offline: extracting this run's features into {root} covered "
            f"{summary['covered_samples']} of {summary['num_samples']} training samples ({why}), so "
            "training did not start. Run the same command again to carry on (the finished shards are "
            "kept), or train with data.features=online or stream, which need no features on disk"
        )
    return str(root)


def _extract_child(config_yaml: str, root: str, dtype: str, result: str) -> None:
    """The body of `extract_in_child`'s process: the same extraction, its summary written to `result`."""
    import os

    for k in [k for k in os.environ if k.startswith(("ACCELERATE_", "FSDP_"))] + [
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    ]:  # fmt: skip
        os.environ.pop(k, None)  # one process: not a rank of the training run's process group
    from omegaconf import OmegaConf

    from draftsmith.atomic import atomic_write_json
    from draftsmith.train.features.extract import extract

    try:
        summary = extract(OmegaConf.create(config_yaml), root, dtype=dtype, backend="vllm")
    except KeyboardInterrupt:  # Ctrl-C reaches this process too: the parent says what was kept, in one line
        raise SystemExit(130) from None
    atomic_write_json(Path(result), summary)


def extract_in_child(cfg, root: Path, dtype: str, accelerator=None) -> dict:
    """`extract(cfg, root, backend="vllm")` in a spawned process (one, on the main rank; the others wait); returns
    its summary. The child prepares the same data (from the data cache) and reads the same shards' manifest."""
    import multiprocessing
    import tempfile

    from omegaconf import OmegaConf

    from draftsmith.errors import DraftsmithError
    from draftsmith.train.features.shards import load_manifest

    main = accelerator is None or accelerator.is_main_process
    if main:
        with tempfile.TemporaryDirectory(prefix="draftsmith-vllm-extract-") as tmp:
            result = Path(tmp) / "summary.json"
            proc = multiprocessing.get_context("spawn").Process(
                target=_extract_child, args=(OmegaConf.to_yaml(cfg, resolve=True), str(root), dtype, str(result))
            )
            proc.start()
            proc.join()
            if proc.exitcode != 0 or not result.is_file():
                raise DraftsmithError(
                    f"data.features_backend=vllm: the extraction process failed (exit status {proc.exitcode}; its "
                    f"output is above). The shards it finished in {root} are kept: run the same command again to "
                    "carry on, or set data.features_backend=hf"
                )
            summary = json.loads(result.read_text())
    if accelerator is not None:
        accelerator.wait_for_everyone()
    if not main:
        m = load_manifest(root)
        summary = {k: m[k] for k in ("covered_samples", "complete", "stopped")}
        summary["num_samples"] = m["fingerprint"]["data"]["num_samples"]
    return summary


def build_feature_source(cfg, target, vocab_ids, data, family: str, accelerator) -> FeatureSource:
    """The FeatureSource data.features asks for; offline checks the shards belong to this run first."""
    mode = cfg.data.features
    if mode in ("online", "memory"):
        return FeatureSource(target, vocab_ids, mode)
    from draftsmith.errors import ConfigError
    from draftsmith.train.features.shards import ShardError, parse_size
    from draftsmith.train.heads import families

    fields = families.get(family).fields  # the target features this family's loss reads

    if mode == "offline":
        from draftsmith.train.features.shards import (
            ShardStore,
            fingerprint_differences,
            load_manifest,
            missing_shards,
            redo_advice,
            run_fingerprint,
        )

        root = cfg.data.get("features_dir")
        if not root:
            raise ConfigError("data.features=offline needs data.features_dir=DIR (written by `draftsmith extract`)")
        manifest = load_manifest(root)
        tokenizer = None
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(target.config._name_or_path)
        except Exception:  # no tokenizer beside the weights: the samples' token ids are still compared exactly
            pass
        run_fp = run_fingerprint(cfg, target, data.train, tokenizer)
        diffs = fingerprint_differences(manifest["fingerprint"], run_fp, subset_ok=True)
        missing = set(fields) - set(manifest["fields"])
        if missing:
            diffs.append(
                f"head family: extracted for {manifest['family']} (fields {manifest['fields']}), this "
                f"{family} run also needs {sorted(missing)}"
            )
        if diffs:
            raise ShardError(
                f"data.features_dir={root} was extracted for another run:\n  "
                + "\n  ".join(diffs)
                + "\n  re-extract with this run's overrides: draftsmith extract --out NEW_DIR <overrides>"
            )
        if not manifest["complete"]:
            why = f" (stopped: {'; '.join(manifest['stopped'].values())})" if manifest["stopped"] else ""
            raise ShardError(
                f"data.features_dir={root} covers {manifest['covered_samples']} of "
                f"{manifest['fingerprint']['data']['num_samples']} training samples{why}; finish it by "
                f"re-running the same `draftsmith extract` (with a larger --max-disk), or use data.features=stream"
            )
        gone = missing_shards(root, manifest)  # a stat per shard; the sha256 is checked as each shard is first read
        if gone:
            raise ShardError(
                f"data.features_dir={root}: {len(gone)} shard(s) the manifest lists are missing or of "
                f"another size ({'; '.join(list(gone.values())[:5])}). " + redo_advice(root)
            )
        # the run's aux layers may be some of the stored ones; fields it does not read are not read
        store = ShardStore(root, manifest, aux_layer_ids=target.aux_layer_ids, fields=fields)
        return FeatureSource(target, vocab_ids, mode, disk=store)
    if mode == "stream":  # the target runs in a producer process of this rank's own (stream_process.py)
        from draftsmith.train.features.stream_process import StreamClient

        rank, world = accelerator.process_index, accelerator.num_processes
        base = Path(cfg.data.get("features_dir") or Path(cfg.output_dir) / "stream_features")
        max_disk = cfg.data.get("max_disk")
        budget = parse_size(max_disk) // world if max_disk else None  # each process buffers its own batches
        client = StreamClient(cfg, rank, world, base / f"rank-{rank:05d}", budget, accelerator.device, fields)
        return FeatureSource(target, vocab_ids, mode, stream=client)
    return FeatureSource(target, vocab_ids, mode)  # raises: an unknown mode


def heldout_feature_source(cfg, target, vocab_ids, data, features: FeatureSource | None = None) -> FeatureSource | None:
    """Held-out eval without the target's decoder layers on this rank: with data.features=stream, from the run's
    producer process (`features`, the training source); with offline, from FEATURES_DIR/heldout when it holds exactly
    this run's held-out samples (extracted with the training ones since they carry the target's argmax). Else None,
    and held-out eval runs the target online."""
    from draftsmith.train.features.shards import HELDOUT_DIR, ShardStore, load_manifest

    if cfg.data.features == "stream" and features is not None and data.heldout:
        return FeatureSource(target, vocab_ids, "stream", stream=features.stream.heldout)

    root = cfg.data.get("features_dir")
    if cfg.data.features != "offline" or not root or not data.heldout:
        return None
    held = Path(root) / HELDOUT_DIR
    if not features_complete(held, data.heldout):
        return None
    from draftsmith.train.features.shards import HELDOUT_FIELDS
    from draftsmith.train.heads import families

    fields = families.get(cfg.head.family).fields + HELDOUT_FIELDS
    store = ShardStore(held, load_manifest(held), aux_layer_ids=target.aux_layer_ids, fields=fields)
    return FeatureSource(target, vocab_ids, "offline", disk=store)

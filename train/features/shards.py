"""Target features on disk: safetensors shards plus a JSON manifest (`draftsmith extract`, offline|stream).

    DIR/manifest.json                      header (family, dtype, fingerprint) + every finished shard, merged
    DIR/parts/rank-00000.json              one rank's finished shards, rewritten atomically after each shard
    DIR/shard-r00000-000000.safetensors    one rank's samples, concatenated along the token axis

A shard holds, for its samples in order, `offsets` [n+1] (token offsets), `sample_index` [n] (index into the run's
training samples), `input_ids` [N] int32, `loss_mask` [N] uint8, and the head family's `fields`
(train/heads/families.py): `last` [N, H] (final post-norm hidden state) and, for EAGLE-3, `aux` [N, n_aux*H] (the aux
hidden states, low→high). Logits are not stored: one matmul with the target's lm_head rows rebuilds them, exactly as
memory mode does (sources.py).

Every file is written beside its final name, fsynced and renamed, so a kill leaves either the old file or the
new one. A shard on disk that no manifest part lists is the remains of a kill between its rename and the part
update: the next extraction deletes and redoes it, so no sample is ever dropped or stored twice. A listed shard
that is gone (or of another size) is dropped from the manifest by the next extraction, which redoes its samples.

Reading checks each shard's size and sha256 against the manifest the first time a process opens it, so bytes
changed on disk since extraction stop training (ShardError) instead of moving its losses silently.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import zlib
from array import array
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save as st_save

from draftsmith.atomic import atomic_write_json
from draftsmith.errors import DraftsmithError
from draftsmith.train.data.dataset import also_entries, overflow
from draftsmith.train.heads import families

FORMAT, VERSION = "draftsmith-features", 1
# held-out shards also keep the target's full-vocab argmax per token, so eval needs no lm_head beyond the draft rows
HELDOUT_FIELDS = ("top",)
INT_FIELDS = {"top": torch.int32}  # stored as is: never cast to the feature dtype, never compressed
HELDOUT_DIR = "heldout"  # FEATURES_DIR/heldout: the held-out samples' features, a features directory of its own
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
SHARD_RE = re.compile(r"^shard-r(\d{5})-(\d{6})\.safetensors$")
HASH_CHUNK = 8 << 20  # sha256 reads: big enough to run at the hash's speed, small next to a shard
UNITS = {
    "": 1,
    "B": 1,
    "K": 2**10,
    "KB": 2**10,
    "KIB": 2**10,
    "M": 2**20,
    "MB": 2**20,
    "MIB": 2**20,
    "G": 2**30,
    "GB": 2**30,
    "GIB": 2**30,
    "T": 2**40,
    "TB": 2**40,
    "TIB": 2**40,
}


class ShardError(DraftsmithError, ValueError):
    """A features directory that does not match its manifest, or a run it was not extracted for."""


def parse_size(text) -> int:
    """'20G', '500M', '1.5GiB', '4096' -> bytes (binary units: 1K = 1024)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in UNITS:
        raise ValueError(f"size {text!r}: expected a number with an optional unit K, M, G or T (e.g. 20G, 500M)")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def fmt_size(n: float) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n}"


def fmt_size_up(n: int) -> str:
    """`n` bytes rounded up to one decimal of a binary unit: a size to pass back as a budget, never below `n`."""
    for unit, scale in (("K", 2**10), ("M", 2**20), ("G", 2**30), ("T", 2**40)):
        if n < 1024 * scale or unit == "T":
            return f"{math.ceil(n * 10 / scale) / 10:.1f}{unit}"
    return f"{n}B"


# ---------------------------------------------------------------------------------------------------- fingerprints


def _sha1(*chunks: bytes) -> str:
    h = hashlib.sha1()
    for c in chunks:
        h.update(c)
    return h.hexdigest()


def target_fingerprint(target) -> dict:
    """What makes two targets compute the same features: config, weights, dtype, aux layer ids.

    The weights digest reads the first and last 1,024 values of every parameter, rounded to bf16, so it costs
    milliseconds on an 8B model and is the same whether the target was loaded in fp32 or bf16 (the dtype is
    compared on its own: features of a bf16 target are not what an fp32 target computes online).
    """
    skip = {"_name_or_path", "dtype", "torch_dtype", "transformers_version", "_attn_implementation_autoset"}
    config = {k: v for k, v in target.config.to_dict().items() if k not in skip and not k.startswith("_attn")}
    h = hashlib.sha1()
    for name, shape, ends in target.weight_ends():  # TargetEnds reads the same values from the checkpoint alone
        h.update(f"{name}:{shape}".encode())
        h.update(ends.view(torch.int16).numpy().tobytes())
    dtype = target.dtype
    return {
        "config_sha1": _sha1(json.dumps(config, sort_keys=True, default=str).encode()),
        "weights_sha1": h.hexdigest(),
        "dtype": str(dtype).replace("torch.", ""),
        "aux_layer_ids": list(target.aux_layer_ids),
    }


def samples_fingerprint(samples) -> dict:
    """sha1 over every training sample's token ids and loss mask, in order: the features' exact inputs."""
    h = hashlib.sha1()
    tokens = 0
    for s in samples:
        h.update(len(s.input_ids).to_bytes(8, "little"))
        h.update(array("q", s.input_ids).tobytes())
        h.update(bytes(s.loss_mask))
        tokens += len(s.input_ids)
    return {"samples_sha1": h.hexdigest(), "num_samples": len(samples), "num_tokens": tokens}


def tokenizer_fingerprint(tokenizer) -> str:
    vocab = "\0".join(f"{t}\1{i}" for t, i in sorted(tokenizer.get_vocab().items()))
    return _sha1(vocab.encode("utf-8", errors="surrogatepass"), str(tokenizer.chat_template).encode())


def data_config_summary(cfg) -> dict:
    """The settings that choose the samples (shown when samples differ; batching keys do not change features)."""
    d = cfg.data
    out = {
        k: d.get(k)
        for k in ("path", "num_conversations", "heldout", "max_length", "seed", "regen_max_tokens", "regen_temperature")
    }
    out["path"] = str(out["path"])
    if d.get("regen_turns", 1) != 1:
        out["regen_turns"] = d.get("regen_turns")
    if overflow(d) != "truncate":
        out["overflow"] = overflow(d)
    extra = also_entries(d)
    if extra:
        out["also"] = [path if not own else {"path": path, **own} for path, own in extra]
    if families.get(cfg.head.family).stage2:  # which stage picks the samples (stage 2: the target's continuations)
        out["head.stage"] = cfg.head.stage
        if cfg.head.stage == 2:
            out["stage2"] = {
                k: cfg.stage2.get(k) for k in ("num_prompts", "prompt_tokens", "max_tokens", "temperatures", "seed")
            }
    return json.loads(json.dumps(out, default=str))


def row_of(sample, index: int, features: dict, dtype) -> dict:
    """One sample's row as a shard stores it: its identity and token rows, then `features` ({field: [n, D] or [n]}
    tensors) on the CPU, the hidden states in `dtype`, integer fields (top) in theirs."""
    row = {"index": index, "input_ids": sample.input_ids, "loss_mask": sample.loss_mask, "conv_id": sample.conv_id}
    row.update({k: v.to("cpu", INT_FIELDS.get(k, dtype)) for k, v in features.items()})
    return row


def run_fingerprint(cfg, target, samples, tokenizer=None) -> dict:
    """Everything a features directory must agree with before a run may train on it."""
    fp = {
        "target": target_fingerprint(target),
        "data": samples_fingerprint(samples),
        "data_config": data_config_summary(cfg),
        "target_name_or_path": str(target.config._name_or_path),
    }
    if tokenizer is not None:
        fp["tokenizer_sha1"] = tokenizer_fingerprint(tokenizer)
    return fp


def fingerprint_sha1(fp: dict) -> str:
    """The digest of the parts that decide equality (names and paths are informational)."""
    key = {"target": fp["target"], "data": fp["data"]}
    return _sha1(json.dumps(key, sort_keys=True).encode())


def fingerprint_differences(stored: dict, run: dict, subset_ok: bool = False) -> list[str]:
    """Human-readable differences between a manifest's fingerprint and this run's; [] when they match.

    subset_ok: a run that reads the features (not one that adds shards to them) may use aux layer ids that are
    among the extracted ones: the reader takes their columns (`aux_columns`).
    """
    out = []
    a, b = stored["target"], run["target"]
    ids_a, ids_b = a["aux_layer_ids"], b["aux_layer_ids"]
    if ids_a != ids_b and not (subset_ok and set(ids_b) <= set(ids_a)):
        hint = " (features extracted with more aux layers serve any run whose ids are among them)" if subset_ok else ""
        out.append(f"aux layer ids: extracted {ids_a}, this run uses {ids_b}{hint}")
    if a["config_sha1"] != b["config_sha1"]:
        out.append(
            f"target config: extracted from {stored.get('target_name_or_path')!r}, this run's target "
            f"{run.get('target_name_or_path')!r} has another architecture config"
        )
    if a["weights_sha1"] != b["weights_sha1"]:
        out.append(
            f"target weights: extracted from {stored.get('target_name_or_path')!r}, this run's target "
            f"{run.get('target_name_or_path')!r} has other weights"
        )
    if a["dtype"] != b["dtype"]:
        out.append(f"target dtype: extracted with a {a['dtype']} target, this run's is {b['dtype']} (set target.dtype)")
    if "tokenizer_sha1" in stored and "tokenizer_sha1" in run and stored["tokenizer_sha1"] != run["tokenizer_sha1"]:
        out.append("tokenizer: another vocabulary or chat template than the extraction's")
    if stored["data"] != run["data"]:
        sa, sb = stored["data"], run["data"]
        keys = sorted(set(stored["data_config"]) | set(run["data_config"]))
        changed = [
            f"{k}: {stored['data_config'].get(k)!r} -> {run['data_config'].get(k)!r}"
            for k in keys
            if stored["data_config"].get(k) != run["data_config"].get(k)
        ]
        why = "; ".join(changed) if changed else "same data settings, so the source file or the rendering changed"
        out.append(
            f"training samples: extracted {sa['num_samples']} samples / {sa['num_tokens']} tokens, this run has "
            f"{sb['num_samples']} / {sb['num_tokens']} ({why})"
        )
    return out


def aux_columns(stored_ids, run_ids, hidden_size: int) -> torch.Tensor | None:
    """The columns of a stored `aux` [N, len(stored_ids)*H] that hold the run's aux states, in the run's order
    ([len(run_ids)*H] int64), or None when the run's ids are the stored ones (the stored tensor is used as is).

    So one extraction with a superset of layers (`target.aux_layer_ids=[2,9,12,15,18,21,24]`) trains heads on any
    choice among them: the target's forward, the expensive part, runs once for all of them.
    """
    stored_ids, run_ids = list(stored_ids), list(run_ids)
    if stored_ids == run_ids:
        return None
    missing = [i for i in run_ids if i not in stored_ids]
    if missing:
        raise ShardError(f"aux layer ids {missing} were not extracted (the features hold {stored_ids})")
    H = hidden_size
    return torch.cat([torch.arange(stored_ids.index(i) * H, (stored_ids.index(i) + 1) * H) for i in run_ids])


# ---------------------------------------------------------------------------------------------------- manifest


def shard_name(rank: int, seq: int) -> str:
    return f"shard-r{rank:05d}-{seq:06d}.safetensors"


def part_path(root: Path, rank: int) -> Path:
    return Path(root) / "parts" / f"rank-{rank:05d}.json"


def read_json(path: Path, what: str):
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ShardError(f"{path}: unreadable {what} ({e})") from None


def load_manifest(root) -> dict:
    """The header of DIR/manifest.json with every rank part's shards merged in (a killed run's included)."""
    root = Path(root)
    path = root / "manifest.json"
    if not path.is_file():
        raise ShardError(f"{root}: no manifest.json (not a features directory; write one with `draftsmith extract`)")
    manifest = read_json(path, "manifest")
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ShardError(
            f"{path}: format {manifest.get('format')!r} v{manifest.get('version')}, expected {FORMAT} v{VERSION}"
        )
    shards = {s["name"]: s for s in manifest.get("shards", [])}
    stopped = {}  # from the parts only: a resumed extraction clears them
    for part in sorted((root / "parts").glob("rank-*.json")):
        body = read_json(part, "manifest part")
        for s in body.get("shards", []):
            shards[s["name"]] = s
        if body.get("stopped"):
            stopped[str(body["rank"])] = body["stopped"]
    manifest["shards"] = sorted(shards.values(), key=lambda s: s["name"])
    seen: dict[int, str] = {}
    for s in manifest["shards"]:
        for i in s["samples"]:
            if i in seen:
                raise ShardError(f"{root}: sample {i} is in both {seen[i]} and {s['name']} (a damaged manifest)")
            seen[i] = s["name"]
    manifest["covered_samples"] = len(seen)
    manifest["covered_tokens"] = sum(s["tokens"] for s in manifest["shards"])
    manifest["bytes"] = sum(s["bytes"] for s in manifest["shards"])
    manifest["complete"] = len(seen) == manifest["fingerprint"]["data"]["num_samples"]
    manifest["stopped"] = stopped or None
    return manifest


def write_manifest(root, manifest: dict) -> None:
    """Rewrite DIR/manifest.json (atomically) from the merged view."""
    atomic_write_json(Path(root) / "manifest.json", manifest)


def orphan_files(root, manifest: dict) -> list[Path]:
    """Shard and temporary files no manifest lists: what a kill mid-shard leaves behind."""
    listed = {s["name"] for s in manifest["shards"]}
    root = Path(root)
    out = [p for p in root.glob("shard-r*.safetensors") if p.name not in listed]
    out += list(root.glob(".tmp-*")) + list((root / "parts").glob(".tmp-*"))
    return sorted(out)


def missing_shards(root, manifest: dict) -> dict[str, str]:
    """Listed shards whose file is gone or has another size than recorded: name -> what is wrong (stat only)."""
    out = {}
    for s in manifest["shards"]:
        path = Path(root) / s["name"]
        if not path.is_file():
            out[s["name"]] = f"{path}: missing"
        elif path.stat().st_size != s["bytes"]:
            out[s["name"]] = f"{path}: {path.stat().st_size} bytes, the manifest recorded {s['bytes']}"
    return out


def forget_shards(root, names) -> None:
    """Drop shards from every rank part and from manifest.json, so the next extraction redoes their samples."""
    root, names = Path(root), set(names)
    for path in [*sorted((root / "parts").glob("rank-*.json")), root / "manifest.json"]:
        body = read_json(path, "manifest")
        kept = [s for s in body.get("shards", []) if s["name"] not in names]
        if len(kept) != len(body.get("shards", [])):
            atomic_write_json(path, {**body, "shards": kept})


# ---------------------------------------------------------------------------------------------------- checksums


_verified: dict[str, tuple] = {}  # shard path -> (sha256, size, mtime, inode) this process has checked


def file_sha256(path) -> str:
    """sha256 of a file, read HASH_CHUNK bytes at a time (a shard can be hundreds of MB)."""
    h = hashlib.sha256()
    buf = bytearray(HASH_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def redo_advice(root) -> str:
    """What to do about shards that are not what was extracted."""
    return (
        f"`draftsmith extract --validate {root}` lists every bad shard; delete each one and re-run the same "
        "`draftsmith extract` (for features a training run extracted itself, the same training command): it "
        "extracts the samples of deleted shards again. Or extract into a new directory"
    )


def verify_shard(root, record: dict) -> None:
    """Raise ShardError unless the shard file has the size and sha256 its manifest entry records.

    Hashed once per file per process (again only if the file's size, mtime or inode change), before the first
    read of its data: sha256 ran at ~1.4 GiB/s on this project's CPU, against minutes of training on a shard.
    """
    root = Path(root)
    path = root / record["name"]
    if not path.is_file():
        raise ShardError(f"{path}: shard listed in the manifest of {root} is missing. " + redo_advice(root))
    st = path.stat()
    key, seen = str(path.resolve()), (record["sha256"], st.st_size, st.st_mtime_ns, st.st_ino)
    if _verified.get(key) == seen:
        return
    if st.st_size != record["bytes"]:
        raise ShardError(
            f"{path}: {st.st_size} bytes, but the manifest of the features directory {root} recorded "
            f"{record['bytes']} (truncated or replaced since extraction); none of its data was used. "
            + redo_advice(root)
        )
    found = file_sha256(path)
    if found != record["sha256"]:
        raise ShardError(
            f"{path}: sha256 {found}, but the manifest of the features directory {root} recorded "
            f"{record['sha256']} (the same {st.st_size:,} bytes, overwritten or corrupted on disk since "
            "extraction); none of its data was used. " + redo_advice(root)
        )
    _verified[key] = seen


# ---------------------------------------------------------------------------------------------------- shard files


COMPRESSIONS = ("none", "zlib")


def compress_field(t: torch.Tensor) -> torch.Tensor:
    """[N, D] features -> uint8 [M]: the bytes regrouped by significance (byte planes), then zlib level 1.

    A hidden state's high bytes (sign, exponent) repeat a lot, its low mantissa bytes hardly at all; grouping
    them lets zlib find the repeats (SmolLM2 bf16 states: 0.74 of the raw size, against 0.83 compressed as is).
    """
    planes = t.contiguous().view(torch.uint8).reshape(-1, t.element_size()).T.contiguous()  # [itemsize, N*D]
    return torch.frombuffer(bytearray(zlib.compress(planes.numpy().tobytes(), 1)), dtype=torch.uint8)


def decompress_field(blob: torch.Tensor, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    planes = torch.frombuffer(bytearray(zlib.decompress(blob.numpy().tobytes())), dtype=torch.uint8)
    return planes.reshape(dtype.itemsize, -1).T.contiguous().view(dtype).reshape(shape)  # [N, D]


def read_field(h, key: str, dtype: torch.dtype) -> torch.Tensor:
    """A feature field of an open shard, whole, decompressed if the shard says it is compressed."""
    meta = h.metadata() or {}
    if meta.get("compression", "none") == "none" or key in INT_FIELDS:
        return h.get_tensor(key)
    return decompress_field(h.get_tensor(key), json.loads(meta[f"{key}_shape"]), dtype)


def pack_shard(
    rows: list[dict], dtype: torch.dtype, fields: tuple[str, ...], meta: dict, compression: str = "none"
) -> bytes:
    """One shard's bytes. rows: [{"index", "input_ids", "loss_mask", "conv_id", <fields>: [n, D] tensors}].

    compression="zlib" stores each feature field as compressed bytes (`compress_field`), its shape in the metadata.
    """
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression={compression!r}: expected one of {COMPRESSIONS}")
    lengths = [len(r["input_ids"]) for r in rows]
    offsets = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)  # [n+1]
    tensors = {
        "offsets": offsets,
        "sample_index": torch.tensor([r["index"] for r in rows], dtype=torch.int64),  # [n]
        "input_ids": torch.tensor([t for r in rows for t in r["input_ids"]], dtype=torch.int32),  # [N]
        "loss_mask": torch.tensor([m for r in rows for m in r["loss_mask"]], dtype=torch.uint8),  # [N]
    }
    meta = {**meta, "conv_ids": json.dumps([r.get("conv_id", "") for r in rows]), "compression": compression}
    for f in fields:
        if f in INT_FIELDS:
            tensors[f] = torch.cat([r[f] for r in rows]).to(INT_FIELDS[f]).contiguous()  # [N]
            continue
        t = torch.cat([r[f] for r in rows]).to(dtype).contiguous()  # [N, D]
        if compression == "zlib":
            meta[f"{f}_shape"] = json.dumps(list(t.shape))
            t = compress_field(t)  # [M] uint8
        tensors[f] = t
    return st_save(tensors, metadata={k: str(v) for k, v in meta.items()})


class ShardStore:
    """Reads samples out of a features directory; shards are opened lazily (memory-mapped) and kept open."""

    def __init__(self, root, manifest: dict | None = None, max_open: int = 64, aux_layer_ids=None, fields=None):
        """aux_layer_ids: the run's, when they are a subset of the extracted ones (`get` returns their columns).
        fields: the stored fields the run reads (None: all); an MLP speculator reading an EAGLE-3 extraction skips
        the aux states, 3/4 of its bytes."""
        self.root = Path(root)
        self.manifest = manifest or load_manifest(self.root)
        self.fields = tuple(f for f in self.manifest["fields"] if fields is None or f in fields)
        self.aux_cols = None
        if aux_layer_ids is not None and "aux" in self.fields:
            stored = self.manifest["fingerprint"]["target"]["aux_layer_ids"]
            self.aux_cols = aux_columns(stored, aux_layer_ids, self.manifest["hidden_size"])
        self.where: dict[int, tuple[str, int]] = {}  # sample index -> (shard name, row in shard)
        self.records = {s["name"]: s for s in self.manifest["shards"]}
        for s in self.manifest["shards"]:
            for row, i in enumerate(s["samples"]):
                self.where[i] = (s["name"], row)
        self.dtype = DTYPES[self.manifest["dtype"]]
        self.compressed = self.manifest.get("compression", "none") != "none"
        self.open: dict[str, tuple] = {}  # name -> (handle, offsets list, decompressed fields or None)
        # compressed shards are decompressed whole into memory, so fewer of them stay open
        self.max_open = min(max_open, 4) if self.compressed else max_open

    def _handle(self, name: str):
        if name not in self.open:
            if len(self.open) >= self.max_open:
                self.open.pop(next(iter(self.open)))
            path = self.root / name
            verify_shard(self.root, self.records[name])  # overwritten bytes would train silently otherwise
            try:
                h = safe_open(str(path), framework="pt")
                offsets = h.get_tensor("offsets").tolist()
                fields = {k: read_field(h, k, self.dtype) for k in self.fields} if self.compressed else None
            except Exception as e:  # a truncated or overwritten file: name it, not a Rust panic
                raise ShardError(
                    f"{path}: unreadable shard ({type(e).__name__}: {e}); "
                    f"run `draftsmith extract --validate {self.root}`"
                ) from None
            self.open[name] = (h, offsets, fields)
        return self.open[name]

    def get(self, index: int) -> dict[str, torch.Tensor]:
        """Sample `index`: {"input_ids" [n], "loss_mask" [n], and each stored field [n, D]}."""
        if index not in self.where:
            raise ShardError(
                f"{self.root}: sample {index} is not in any shard (the extraction covered "
                f"{len(self.where)} of {self.manifest['fingerprint']['data']['num_samples']} samples)"
            )
        name, row = self.where[index]
        h, offsets, fields = self._handle(name)
        a, b = offsets[row], offsets[row + 1]
        out = {k: h.get_slice(k)[a:b] for k in ("input_ids", "loss_mask", *([] if fields else self.fields))}
        out.update({k: t[a:b] for k, t in (fields or {}).items()})
        if self.aux_cols is not None:  # a run on some of the extracted aux layers
            out["aux"] = out["aux"].index_select(1, self.aux_cols)
        out["input_ids"] = out["input_ids"].long()
        out["shard"] = name  # for error messages
        return out


def validate(root, run_fp: dict | None = None, samples=None) -> tuple[dict, list[str], list[str]]:
    """Check every shard against the manifest: checksum, size, keys, shapes, dtypes, sample ids, fingerprint,
    finite values. With `run_fp`/`samples` (a composed run), also the fingerprint and token ids against that run.

    Returns (manifest, problems, notes); each problem names the shard and, where it applies, the sample.
    """
    root = Path(root)
    manifest = load_manifest(root)
    problems, notes = [], []
    fp = manifest["fingerprint"]
    want_sha = manifest["fingerprint_sha1"]
    if fingerprint_sha1(fp) != want_sha:
        problems.append(f"{root / 'manifest.json'}: fingerprint_sha1 does not match its fingerprint (edited by hand?)")
    if run_fp is not None:
        diffs = fingerprint_differences(fp, run_fp, subset_ok=True)
        problems += [f"{root}: extracted for another run: {d}" for d in diffs]
    dtype = DTYPES[manifest["dtype"]]
    widths = {"aux": manifest["aux_dim"], "last": manifest["hidden_size"]}
    num_samples = fp["data"]["num_samples"]
    for s in manifest["shards"]:
        path = root / s["name"]
        where, before = f"{path}", len(problems)
        if not path.is_file():
            problems.append(f"{where}: missing")
            continue
        size = path.stat().st_size
        if size != s["bytes"]:
            problems.append(f"{where}: {size} bytes, the manifest says {s['bytes']} (truncated or replaced)")
            continue
        if file_sha256(path) != s["sha256"]:
            problems.append(f"{where}: sha256 differs from the manifest's (corrupted on disk)")
            continue
        try:
            h = safe_open(str(path), framework="pt")
            meta = h.metadata() or {}
            keys = set(h.keys())
        except Exception as e:
            problems.append(f"{where}: unreadable safetensors ({type(e).__name__}: {e})")
            continue
        want_keys = {"offsets", "sample_index", "input_ids", "loss_mask", *manifest["fields"]}
        if keys != want_keys:
            problems.append(f"{where}: tensors {sorted(keys)}, expected {sorted(want_keys)}")
            continue
        if meta.get("fingerprint_sha1") != want_sha:
            problems.append(
                f"{where}: written for target/data fingerprint {meta.get('fingerprint_sha1')}, "
                f"the manifest's is {want_sha}"
            )
        conv_ids = json.loads(meta.get("conv_ids", "[]"))
        index = h.get_tensor("sample_index").tolist()
        offsets = h.get_tensor("offsets")
        if index != s["samples"]:
            problems.append(f"{where}: holds samples {index[:8]}..., the manifest lists {s['samples'][:8]}...")
            continue
        bad_range = [i for i in index if not 0 <= i < num_samples]
        if bad_range:
            problems.append(f"{where}: sample {bad_range[0]} is outside the run's {num_samples} samples")
        N = int(offsets[-1])
        if (
            offsets.numel() != len(index) + 1
            or int(offsets[0]) != 0
            or bool((offsets.diff() <= 0).any())
            or N != s["tokens"]
        ):
            problems.append(f"{where}: token offsets do not describe {len(index)} samples of {s['tokens']} tokens")
            continue
        for k in ("input_ids", "loss_mask"):
            if list(h.get_slice(k).get_shape()) != [N]:
                problems.append(f"{where}: {k} has shape {h.get_slice(k).get_shape()}, expected [{N}]")
        if meta.get("compression", "none") != manifest.get("compression", "none"):
            problems.append(
                f"{where}: compression {meta.get('compression', 'none')!r}, the manifest says "
                f"{manifest.get('compression', 'none')!r}"
            )
            continue
        for k in manifest["fields"]:
            try:
                t = read_field(h, k, dtype)
            except (zlib.error, KeyError, ValueError, RuntimeError) as e:
                problems.append(f"{where}: {k} does not decompress ({type(e).__name__}: {e})")
                continue
            if k in INT_FIELDS:
                if list(t.shape) != [N] or t.dtype != INT_FIELDS[k]:
                    problems.append(f"{where}: {k} is {t.dtype} {list(t.shape)}, expected {INT_FIELDS[k]} [{N}]")
                continue
            if list(t.shape) != [N, widths[k]] or t.dtype != dtype:
                problems.append(f"{where}: {k} is {t.dtype} {list(t.shape)}, expected {dtype} [{N}, {widths[k]}]")
                continue
            finite = torch.isfinite(t).all(-1)  # [N]
            if not bool(finite.all()):
                tok = int((~finite).nonzero()[0])
                row = int(torch.searchsorted(offsets, torch.tensor(tok), right=True)) - 1
                problems.append(
                    f"{where}: sample {index[row]} (conversation {conv_ids[row] if row < len(conv_ids) else '?'}) "
                    f"has non-finite {k} at token {tok - int(offsets[row])}"
                )
        if samples is not None and len(problems) == before:
            ids = h.get_tensor("input_ids").long()
            mask = h.get_tensor("loss_mask")
            for row, i in enumerate(index):
                a, b = int(offsets[row]), int(offsets[row + 1])
                if 0 <= i < len(samples) and (
                    ids[a:b].tolist() != list(samples[i].input_ids) or mask[a:b].tolist() != list(samples[i].loss_mask)
                ):
                    problems.append(
                        f"{where}: sample {i} (conversation {samples[i].conv_id}) holds other tokens "
                        f"than this run's sample {i}"
                    )
                    break
    for p in orphan_files(root, manifest):
        notes.append(f"{p}: not in the manifest (left by a killed extraction); ignored, removed by the next extract")
    if not manifest["complete"]:
        notes.append(
            f"{root}: covers {manifest['covered_samples']} of {num_samples} samples"
            + (f" (stopped: {manifest['stopped']})" if manifest["stopped"] else " (not finished)")
        )
    return manifest, problems, notes

"""data.features=stream: a producer thread runs the target ahead of training into a bounded buffer of shards on disk.

The producer walks the same batch schedule as the loop (`epoch_batches`), computes each batch's features with the
same collated forward the loop would run online, and writes them as one shard file (shards.py format);
the trainer reads the shard for its batch and deletes it. The buffer holds at most `ahead` shards and, with a
budget, never more bytes than the budget: the producer serializes a shard in memory first, so it knows its
exact size and waits until it fits before writing it.

The producer finds where it is in the schedule from the batch the trainer asks for (within an epoch every
sample is in exactly one batch, so a batch names its position), so a resumed run needs no bookkeeping. When the
trainer asks for a batch the buffer does not hold, that batch is computed online (the numbers are the same)
and the producer restarts behind it.
"""

from __future__ import annotations

import collections
import json
import os
import stat
import threading
from pathlib import Path

import torch
from safetensors.torch import load as st_load

from draftsmith.train.features.shards import FORMAT, ShardError, fmt_size, pack_shard

MAX_SEARCH_EPOCHS = 1000


def _dir_bytes(root: Path) -> int:
    """Bytes of the files in root now. The training rank deletes shards it has read while this runs, so a file
    listed a moment ago may be gone: it no longer counts."""
    total = 0
    for p in root.iterdir():
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
    return total


class StreamProducer:
    def __init__(
        self,
        root,
        target,
        samples,
        schedule,
        fields,
        dtype: torch.dtype,
        budget: int | None,
        ahead: int = 16,
        log=print,
    ):
        """
        Args:
            schedule: epoch -> this rank's batches (lists of sample indices), in the order the trainer takes them.
            budget: bytes the buffer directory may hold (None: only `ahead` bounds it).
        """
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        for p in self.root.glob("stream-*"):  # a killed run's leftovers
            p.unlink()
        self.target, self.samples, self.schedule = target, samples, schedule
        self.fields, self.dtype, self.budget, self.ahead, self.log = tuple(fields), dtype, budget, ahead, log
        self.cond = threading.Condition()
        self.queue: collections.deque = collections.deque()  # (indices tuple, path, bytes)
        self.used = 0  # bytes of the shard files now in the buffer
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.error: BaseException | None = None
        self.seq = 0
        self.epoch = 0  # the epoch the producer is in (where a resync searches first)
        self.stats = {
            "shards": 0,
            "bytes_written": 0,
            "peak_disk_bytes": 0,
            "target_tokens": 0,
            "resyncs": 0,
            "budget_bytes": budget,
            "ahead": ahead,
            "pid": os.getpid(),  # the process the target ran in
        }

    def _compute(self, indices: list[int]) -> list[dict]:
        from draftsmith.train.features.extract import feature_rows

        device = next(self.target.model.parameters()).device
        # the whole batch in one forward, exactly the loop's online call (same padding, same kernels)
        return feature_rows(
            self.target, self.samples, list(indices), self.fields, self.dtype, self.target.pad_id, device
        )

    def _run(self, epoch: int, i: int) -> None:
        try:
            while True:
                batches = self.schedule(epoch)
                if not batches:
                    raise ShardError(f"stream: the batch schedule of epoch {epoch} is empty")
                with self.cond:
                    self.epoch = epoch
                while i < len(batches):
                    idx = batches[i]
                    rows = self._compute(idx)
                    blob = pack_shard(rows, self.dtype, self.fields, {"format": FORMAT, "stream": "1"})
                    if self.budget is not None and len(blob) > self.budget:
                        raise ShardError(
                            f"data.max_disk: one batch's features take {fmt_size(len(blob))}, more than the "
                            f"stream buffer's budget {fmt_size(self.budget)} per process; raise data.max_disk "
                            f"or lower data.max_tokens_per_batch"
                        )
                    with self.cond:
                        while not self.stopping and (
                            len(self.queue) >= self.ahead
                            or (self.budget is not None and self.used + len(blob) > self.budget)
                        ):
                            self.cond.wait()
                        if self.stopping:
                            return
                    path = self.root / f"stream-{self.seq:08d}.safetensors"
                    tmp = self.root / f"stream-{self.seq:08d}.tmp"
                    tmp.write_bytes(blob)  # no fsync: a crash deletes the whole buffer on restart anyway
                    tmp.replace(path)
                    self.seq += 1
                    with self.cond:
                        self.queue.append((tuple(idx), path, len(blob)))
                        self.used += len(blob)
                        self.stats["shards"] += 1
                        self.stats["bytes_written"] += len(blob)
                        self.stats["target_tokens"] += sum(len(self.samples[j].input_ids) for j in idx)
                        self.stats["peak_disk_bytes"] = max(self.stats["peak_disk_bytes"], _dir_bytes(self.root))
                        self.cond.notify_all()
                    i += 1
                epoch, i = epoch + 1, 0
        except BaseException as e:  # handed to the trainer on its next call
            with self.cond:
                self.error = e
                self.cond.notify_all()

    def _locate(self, indices: list[int], first_epoch: int) -> tuple[int, int] | None:
        for epoch in range(first_epoch, first_epoch + MAX_SEARCH_EPOCHS):
            for i, b in enumerate(self.schedule(epoch)):
                if list(b) == list(indices):
                    return epoch, i
        return None

    def _stop(self) -> None:
        if self.thread is not None:
            with self.cond:
                self.stopping = True
                self.cond.notify_all()
            self.thread.join()
            self.thread = None
        for _, path, _ in self.queue:
            path.unlink(missing_ok=True)
        self.queue.clear()
        self.used, self.stopping = 0, False

    def _start(self, epoch: int, i: int) -> None:
        self.thread = threading.Thread(target=self._run, args=(epoch, i), name="draftsmith-stream", daemon=True)
        self.thread.start()

    def take_file(self, indices: list[int]) -> tuple[Path, int]:
        """The shard file holding the batch `indices` (its rows in order) and its bytes, which stay counted against
        the budget until `release`: the reader deletes the file once read. From the buffer, or computed now when
        the batch is not buffered (the first call, or the trainer left the schedule: a resume)."""
        key = tuple(indices)
        with self.cond:
            while self.thread is not None and not self.queue and self.error is None:
                self.cond.wait()
            if self.error is not None:
                raise self.error
            keys = [q[0] for q in self.queue]
            if key in keys:
                for _ in range(keys.index(key)):  # batches the trainer skipped (e.g. an epoch's unused tail)
                    _, path, n = self.queue.popleft()
                    path.unlink(missing_ok=True)
                    self.used -= n
                _, path, n = self.queue.popleft()
                return path, n  # still counted in self.used: the reader deletes it, then `release`
        first = self.thread is None and self.stats["shards"] == 0
        self.stats["resyncs"] += 0 if first else 1
        self._stop()
        found = self._locate(indices, 0 if first else self.epoch)
        rows = self._compute(indices)
        self.stats["target_tokens"] += sum(len(self.samples[j].input_ids) for j in indices)
        blob = pack_shard(rows, self.dtype, self.fields, {"format": FORMAT, "stream": "1"})
        path = self.root / f"stream-resync-{self.stats['resyncs']:06d}.safetensors"
        path.write_bytes(blob)
        with self.cond:
            self.used += len(blob)
        if found is None:
            self.log(
                f"stream: batch {list(indices)[:8]} is not in the next {MAX_SEARCH_EPOCHS} epochs' schedule; "
                "computed online"
            )
        else:
            self._start(found[0], found[1] + 1)
        return path, len(blob)

    def release(self, nbytes: int) -> None:
        """A shard `take_file` handed out was read and deleted: its bytes leave the budget."""
        with self.cond:
            self.used -= nbytes
            self.cond.notify_all()

    def close(self) -> dict:
        """Stop the producer, delete the buffer, and write stream_stats.json (peak disk use, shards, resyncs)."""
        self._stop()
        for p in self.root.glob("stream-*"):
            p.unlink()
        (self.root / "stream_stats.json").write_text(json.dumps(self.stats, indent=1) + "\n")
        return self.stats


def read_rows(path: Path, fields) -> list[dict]:
    """A stream shard's per-sample rows; the file is deleted once read (the buffer's bytes are the reader's)."""
    tensors = st_load(Path(path).read_bytes())
    Path(path).unlink()
    return _rows(tensors, fields)


def _rows(tensors: dict, fields) -> list[dict]:
    """Split a shard's concatenated tensors back into per-sample rows."""
    offsets = tensors["offsets"].tolist()
    out = []
    for r, i in enumerate(tensors["sample_index"].tolist()):
        a, b = offsets[r], offsets[r + 1]
        row = {"index": i, "input_ids": tensors["input_ids"][a:b].long()}
        for k in fields:
            row[k] = tensors[k][a:b]
        out.append(row)
    return out

"""data.features=stream with the target in a process of its own: the training rank never holds its decoder layers.

    client = StreamClient(cfg, rank, world, root, budget, device)   # starts the producer process, waits until ready
    rows = client.take(indices)                                     # a training batch's feature rows
    rows = client.heldout.take(indices)                             # held-out rows, with the target's argmax (eval)
    stats = client.close()

The producer process builds the run's data and the whole target from the same resolved config (data from the
cache the training rank just wrote), then runs a `StreamProducer` (stream.py): a thread computing the rank's batches
ahead into the bounded disk buffer. The two processes speak over a pipe, one request and one answer at a time:

    trainer -> producer: ("take", indices) | ("heldout", indices) | ("close",)
    producer -> trainer: ("file", path, stats) | ("stats", stats) | ("error", kind, message)

A "file" answer names a shard in the buffer; the trainer reads and deletes it, and the producer takes its bytes off
the budget when the next request arrives (so data.max_disk bounds the buffer including the shard being read).
The producer ignores Ctrl-C (the trainer finishes its step, saves, then closes it) and exits when the pipe closes,
so a killed trainer leaves no producer behind.
"""

from __future__ import annotations

import multiprocessing
import signal
import traceback
from pathlib import Path

import torch

from draftsmith.errors import DraftsmithError
from draftsmith.train.features.shards import ShardError
from draftsmith.train.features.stream import read_rows

HELDOUT_FIELDS = ("top",)
READY_TIMEOUT_S = 3600  # building the data and loading a large target can take minutes


def _serve(conn, cfg_dict: dict, rank: int, world: int, root: str, budget, threads: int, device: str) -> None:
    """The producer process: build the run, then answer the trainer's requests until "close" or a closed pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer decides when we stop (after its checkpoint)
    try:
        from omegaconf import OmegaConf

        from draftsmith.train.build import build_run
        from draftsmith.train.data.dataset import epoch_batches
        from draftsmith.train.features.extract import feature_rows
        from draftsmith.train.features.shards import FORMAT, pack_shard
        from draftsmith.train.features.stream import StreamProducer
        from draftsmith.train.heads import families

        torch.set_num_threads(threads)  # the trainer's count: the same kernels, so the same bits as online
        cfg = OmegaConf.create(cfg_dict)
        target, _, data, _ = build_run(cfg, torch.device(device), None, log=lambda *a: None)
        fields = families.get(cfg.head.family).fields
        producer = StreamProducer(
            Path(root),
            target,
            data.train,
            lambda epoch: epoch_batches(data, cfg, epoch, rank, world),
            fields,
            target.dtype,
            budget,
            log=lambda *a: print(*a, flush=True) if rank == 0 else None,
        )
        conn.send(("ready", {"target_dtype": str(target.dtype)}))
    except BaseException as e:  # noqa: BLE001 - reported to the trainer, which raises it
        _send_error(conn, e)
        return
    handed = 0  # bytes of the shard the trainer is reading (released on its next request)
    heldout_seq = 0
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the trainer is gone
            producer.close()
            return
        try:
            if handed:
                producer.release(handed)
                handed = 0
            if msg[0] == "take":
                path, handed = producer.take_file(msg[1])
                conn.send(("file", str(path), producer.stats))
            elif msg[0] == "heldout":  # eval: computed on demand (no budget: a few batches, read at once)
                rows = feature_rows(
                    target, data.heldout, list(msg[1]), (*fields, *HELDOUT_FIELDS), target.dtype, target.pad_id,
                    next(target.model.parameters()).device,
                )  # fmt: skip
                blob = pack_shard(rows, target.dtype, (*fields, *HELDOUT_FIELDS), {"format": FORMAT, "stream": "1"})
                path = Path(root) / f"heldout-{heldout_seq:06d}.safetensors"
                heldout_seq += 1
                path.write_bytes(blob)
                conn.send(("file", str(path), producer.stats))
            elif msg[0] == "close":
                conn.send(("stats", producer.close()))
                return
            else:
                raise ValueError(f"stream producer: unknown request {msg[0]!r}")
        except BaseException as e:  # noqa: BLE001
            _send_error(conn, e)
            producer.close()
            return


def _send_error(conn, e: BaseException) -> None:
    kind = "project" if isinstance(e, DraftsmithError) else "bug"
    message = str(e) if kind == "project" else "".join(traceback.format_exception(e))
    try:
        conn.send(("error", kind, message))
    except (OSError, EOFError):
        pass


class StreamClient:
    """The training rank's end: the same `take(indices)` / `stats` / `close()` as a StreamProducer."""

    def __init__(self, cfg, rank: int, world: int, root, budget, device, fields, log=print):
        from omegaconf import OmegaConf

        self.root, self.fields, self.log = Path(root), tuple(fields), log
        self.root.mkdir(parents=True, exist_ok=True)
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no copy of the trainer's state or threads
        self.conn, child = ctx.Pipe()
        args = (child, OmegaConf.to_container(cfg, resolve=True), rank, world, str(self.root), budget)
        self.proc = ctx.Process(
            target=_serve, args=(*args, torch.get_num_threads(), str(device)), name=f"draftsmith-stream-{rank}"
        )
        self.proc.daemon = True  # never outlives the trainer
        self.proc.start()
        child.close()
        self.stats: dict = {"target_tokens": 0, "resyncs": 0, "shards": 0, "peak_disk_bytes": 0}
        self.closed = False
        self._answer("ready", timeout=READY_TIMEOUT_S)
        self.heldout = _Heldout(self)

    def _answer(self, want: str, timeout: float | None = None):
        waited = 0.0
        while not self.conn.poll(1.0):
            waited += 1.0
            if not self.proc.is_alive():
                raise ShardError(
                    f"data.features=stream: the feature producer process (pid {self.proc.pid}) exited with code "
                    f"{self.proc.exitcode} (out of memory?); the last checkpoint is intact: resume=auto continues"
                )
            if timeout is not None and waited > timeout:
                raise ShardError(f"data.features=stream: the feature producer did not start within {timeout:.0f} s")
        kind, *rest = self.conn.recv()
        if kind == "error":
            self.closed = True
            if rest[0] == "project":
                raise ShardError(rest[1])
            raise RuntimeError("data.features=stream: the feature producer process failed:\n" + rest[1])
        if kind != want:
            raise RuntimeError(f"data.features=stream: expected {want!r} from the producer, got {kind!r}")
        return rest

    def _file(self, request: str, indices) -> list[dict]:
        self.conn.send((request, list(indices)))
        path, stats = self._answer("file")
        self.stats = stats
        return read_rows(Path(path), self.fields + (HELDOUT_FIELDS if request == "heldout" else ()))

    def take(self, indices) -> list[dict]:
        return self._file("take", indices)

    def close(self) -> dict:
        """Stop the producer (it empties the buffer and writes stream_stats.json); safe to call twice."""
        if not self.closed and self.proc.is_alive():
            self.closed = True
            try:
                self.conn.send(("close",))
                (self.stats,) = self._answer("stats", timeout=600)
            except (OSError, EOFError, ShardError):
                pass
        self.proc.join(timeout=60)
        if self.proc.is_alive():
            self.proc.kill()
        for p in self.root.glob("heldout-*"):
            p.unlink()
        return self.stats


class _Heldout:
    """The held-out samples' features (with the target's argmax), computed by the producer on request."""

    def __init__(self, client: StreamClient):
        self.client = client

    @property
    def stats(self) -> dict:
        return self.client.stats

    def take(self, indices) -> list[dict]:
        return self.client._file("heldout", indices)

    def close(self) -> dict:  # the client closes the producer
        return self.client.stats

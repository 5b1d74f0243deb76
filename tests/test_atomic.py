"""Atomic writes: the durable default fsyncs the file and its directory; durable=False (per-step telemetry such as
the served hybrid's stats) writes and renames the same way without them."""

from __future__ import annotations

import json
import os

from draftsmith.atomic import atomic_write_json


def test_atomic_write_fsyncs_unless_told_not_to(tmp_path, monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd) or real(fd))
    path = tmp_path / "a" / "stats.json"
    atomic_write_json(path, {"x": 1})
    assert json.loads(path.read_text()) == {"x": 1} and len(calls) == 2  # the file, then its directory
    atomic_write_json(path, {"x": 2}, durable=False)
    assert json.loads(path.read_text()) == {"x": 2} and len(calls) == 2
    assert [p.name for p in path.parent.iterdir()] == ["stats.json"]  # no temporary left behind

"""Command-line argument types shared by `draftsmith eval acceptance`, `draftsmith eval matrix` and `draftsmith
regenerate`."""

from __future__ import annotations

import argparse
import json

from draftsmith.eval.methods import BASELINES


def head_arg(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--head wants NAME=DIR, got {text!r}")
    return name, path


def methods_arg(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in methods if m not in BASELINES]
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown method(s) {bad}; choose from {','.join(BASELINES)} "
            "(EAGLE-3 / MLP speculator heads go in --head NAME=DIR)"
        )
    return methods


def json_object(text: str) -> dict:
    """An argparse type: a JSON object (argparse turns the ValueError into a usage error naming the flag)."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("a JSON object, e.g. '{\"enable_thinking\": false}'")
    return value

"""argparse types for numbers that must be positive: a bad value is a usage error naming the flag (exit 2), never a
traceback from deep inside a plan (`--budget nan`, `--budget inf`) nor a value silently replaced (`--k 0`)."""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (>= 1)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (nan and inf are refused: no plan or clock can be made of them)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (> 0)") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a finite number > 0")
    return value

"""argparse types for counts: a negative ``--limit`` or ``--max-cases`` would slice a list from
its end (``cases[:-1]`` silently drops a case), so counts are refused below their floor."""

from __future__ import annotations

import argparse


def _int(text: str, floor: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!r}") from None
    if value < floor:
        raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer of at least 1."""
    return _int(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    """An integer of at least 0."""
    return _int(text, 0, "0 or more")

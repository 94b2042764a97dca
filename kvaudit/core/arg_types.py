"""argparse types for counts and byte sizes.

Counts: a negative ``--limit`` or ``--max-cases`` would slice a list from its end (``cases[:-1]``
silently drops a case), so counts are refused below their floor.

Sizes (``--cache-budget`` of ``run``, ``replay`` and ``simulate``): one parser,
:func:`parse_size`, for every byte-size option: a positive, finite number of bytes with an
optional unit (docs/reports.md, "Sizes").
"""

from __future__ import annotations

import argparse
import math
import re
from decimal import Decimal

from kvaudit.core.errors import KvauditError, excerpt


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


# Decimal units (KB = 1000 B) and binary ones (KiB = 1024 B); case does not matter, no unit is bytes.
SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
MAX_SIZE = 2**63 - 1  # bytes: what an int64 counter (torch, numpy, the engines) holds
SIZE_SYNTAX = "a positive number of bytes with an optional unit, e.g. 500MB, 2GiB or 1.5TB " \
              "(B, KB, MB, GB, TB: powers of 1000; KiB, MiB, GiB, TiB: powers of 1024)"
_SIZE = re.compile(r"\s*([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*")


def parse_size(text: str) -> int:
    """Bytes of a size such as ``30GB`` (30 * 10**9), ``1.5GiB`` or ``4096``: whole bytes
    (a fraction of a byte is dropped), at least 1 and at most :data:`MAX_SIZE`. Anything else
    (``inf``, ``nan``, ``-1GB``, ``0``, ``1e9``, an unknown unit) raises :class:`KvauditError`."""
    m = _SIZE.fullmatch(text)
    if not m or m.group(3).lower() not in SIZE_UNITS:
        raise KvauditError(f"{excerpt(text, 40)!r} is not a size: give {SIZE_SYNTAX}")
    value = Decimal(m.group(2)) * SIZE_UNITS[m.group(3).lower()]
    if m.group(1) == "-" or value < 1:
        raise KvauditError(f"{excerpt(text, 40)!r}: a size must be at least 1 byte")
    if value > MAX_SIZE:
        raise KvauditError(f"{excerpt(text, 40)!r}: a size must be at most {MAX_SIZE:,} bytes (8 EiB)")
    return int(value)


def byte_size(text: str) -> int:
    """argparse type of a byte-size option (:func:`parse_size`): a bad size is argparse's error,
    which names the option, exit 2."""
    try:
        return parse_size(text)
    except KvauditError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def byte_sizes(text: str) -> list[tuple[str, int]]:
    """argparse type of a comma-separated list of sizes: ``[(label, bytes), ...]``, each label
    the size as written (``30GB``)."""
    labels = [t.strip() for t in text.split(",") if t.strip()]
    if not labels:
        raise argparse.ArgumentTypeError(f"give at least one size: {SIZE_SYNTAX}")
    return [(label, byte_size(label)) for label in labels]


def non_negative_float(text: str) -> float:
    """A finite number of at least 0 (``nan``, ``inf`` and negatives are argparse errors, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {excerpt(text, 40)!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number, 0 or more, got {excerpt(text, 40)}")
    return value


def positive_number(text: str, unit: str) -> float:
    """A finite number above 0 of ``unit`` (``nan``, ``inf``, 0 and negatives are argparse errors, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{excerpt(text, 40)!r} is not a number of {unit}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of {unit}, got {excerpt(text, 40)!r}")
    return value


def positive_seconds(text: str) -> float:
    """argparse type: a positive, finite number of seconds."""
    return positive_number(text, "seconds")

"""Where a case's documents go and the labels that placement gives it.

Zipf-skewed choice of the evidence document, the evidence slot for a position label, shuffled
arrangements and reorders, a total split over task families, and the ``evidence_position`` and
``doc_len_bucket`` strata.
"""

from __future__ import annotations

import bisect
import random
from typing import Any

from kvaudit.core.errors import KvauditError


class ZipfPicker:
    """Draws indices 0..n-1 with weight 1/rank**s; ranks are a seeded shuffle of the indices."""

    def __init__(self, n: int, s: float, rng: random.Random):
        ranks = list(range(n))
        rng.shuffle(ranks)
        self.items = ranks
        total = 0.0
        self.cum: list[float] = []
        for r in range(1, n + 1):
            total += 1.0 / r**s
            self.cum.append(total)
        self.total = total

    def pick(self, rng: random.Random) -> int:
        i = bisect.bisect_left(self.cum, rng.random() * self.total)
        return self.items[min(i, len(self.items) - 1)]


def position_label(slot: int, n: int) -> str:
    if slot == 0:
        return "first"
    return "last" if slot == n - 1 else "middle"


def target_slot(rng: random.Random, label: str, n: int) -> int:
    if label == "first" or n == 1:
        return 0
    if label == "last" or n == 2:
        return n - 1
    return rng.randint(1, n - 2)


def arrange(rng: random.Random, holder: Any, rest: list[Any], slot: int) -> list[Any]:
    """Shuffle ``rest`` and put ``holder`` at ``slot``."""
    rest = list(rest)
    rng.shuffle(rest)
    rest.insert(slot, holder)
    return rest


def new_order(rng: random.Random, order: list[Any]) -> list[Any]:
    """A permutation of ``order`` that differs from it (when it has two or more items)."""
    if len(order) < 2:
        return list(order)
    while True:
        out = list(order)
        rng.shuffle(out)
        if out != order:
            return out


def allocate(total: int, weights: dict[str, float]) -> dict[str, int]:
    """Split ``total`` over the keys in proportion to ``weights`` (largest remainder)."""
    wsum = sum(weights.values())
    if wsum <= 0:
        raise KvauditError("family weights must add up to more than 0")
    raw = {k: total * w / wsum for k, w in weights.items()}
    out = {k: int(v) for k, v in raw.items()}
    left = total - sum(out.values())
    for k in sorted(raw, key=lambda k: (out[k] - raw[k], list(raw).index(k)))[:left]:
        out[k] += 1
    return out


def len_bucket(words: float, lo: float, hi: float) -> str:
    """short / medium / long: which third of [lo, hi] a word count falls in."""
    third = (hi - lo) / 3
    if words < lo + third:
        return "short"
    return "medium" if words < lo + 2 * third else "long"

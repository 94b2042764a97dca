"""The context around a case's documents: the system prompts and the user-turn prefix variants.

A prefix variant is the user-turn text before the documents (nothing, a timestamp, a session id,
a user's earlier requests, or all three); each ends with a newline.
"""

from __future__ import annotations

import random

from kvaudit.core.dataset_format import DEFAULT_SYSTEM
from kvaudit.core.errors import KvauditError

SYSTEM_PROMPTS = (
    DEFAULT_SYSTEM,
    "You answer questions about the documents the user shares. Answer using only the documents.",
    "Use only the documents below. Reply with the answer alone.",
)
PREFIX_VARIANTS = ("none", "timestamp", "session", "history", "full")
_HISTORY = (
    "how to repot a fern", "for a quick soup recipe", "how to fix a squeaky door",
    "what a haiku is", "how to fold a paper crane", "for tips on learning to juggle",
    "how to clean a cast iron pan", "what makes bread rise", "how to tie a bowline knot",
    "for a packing list for a weekend trip", "how tides work", "how to store fresh herbs",
)


def make_prefix(rng: random.Random, variant: str) -> str:
    """The user-turn text before the documents for one prefix variant; ends with a newline."""
    parts = []
    if variant in ("timestamp", "full"):
        t = int(rng.random() * 12 * 28 * 86400)  # a second of 2026, months cut to 28 days
        day, sec = divmod(t, 86400)
        parts.append(f"Current time: 2026-{day // 28 + 1:02d}-{day % 28 + 1:02d} "
                     f"{sec // 3600:02d}:{sec // 60 % 60:02d}:{sec % 60:02d} UTC")
    if variant in ("session", "full"):
        parts.append(f"Session: {rng.getrandbits(32):08x}-{rng.getrandbits(16):04x}")
    if variant in ("history", "full"):
        i = int(rng.random() * len(_HISTORY))
        j = (i + 1 + int(rng.random() * (len(_HISTORY) - 1))) % len(_HISTORY)  # j != i
        a, b = _HISTORY[i], _HISTORY[j]
        parts.append(f"Earlier today I asked you {a} and {b}.")
    if variant not in PREFIX_VARIANTS:
        raise KvauditError(f"unknown prefix variant {variant!r}; choose from {', '.join(PREFIX_VARIANTS)}")
    return "".join(p + "\n" for p in parts)

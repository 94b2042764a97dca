"""The reuse-dynamics knobs every dataset generator applies, as one validated record.

:class:`ReuseKnobs` holds ``--cases``, ``--min-docs`` ... ``--systems`` (see docs/generators.md):
their defaults, validation, the parameters recorded in ``dataset.json`` and the per-case draws
they govern (system prompt, prefix, number of documents).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvaudit.core.errors import KvauditError
from kvaudit.generators.names import pick
from kvaudit.generators.prefixes import PREFIX_VARIANTS, SYSTEM_PROMPTS, make_prefix


@dataclass
class ReuseKnobs:
    """The reuse-dynamics knobs every generator applies (see docs/generators.md)."""

    cases: int = 48
    min_docs: int = 2
    max_docs: int = 4
    positions: tuple[str, ...] = ("first", "middle", "last")
    zipf: float = 1.0
    reorder_share: float = 0.25
    prefixes: tuple[str, ...] = PREFIX_VARIANTS
    systems: int = len(SYSTEM_PROMPTS)

    def validate(self) -> None:
        if self.cases < 1:
            raise KvauditError("--cases must be at least 1")
        if not 1 <= self.min_docs <= self.max_docs:
            raise KvauditError("--min-docs must be at least 1 and at most --max-docs")
        bad = [p for p in self.positions if p not in ("first", "middle", "last")]
        if bad or not self.positions:
            raise KvauditError("--positions takes a comma list of first, middle, last")
        if self.positions == ("middle",) and self.max_docs < 3:
            raise KvauditError("--positions middle needs --max-docs of at least 3")
        if self.zipf < 0:
            raise KvauditError("--zipf must be >= 0 (0 = every document equally likely)")
        if not 0 <= self.reorder_share < 1:
            raise KvauditError("--reorder-share must be in [0, 1)")
        bad = [p for p in self.prefixes if p not in PREFIX_VARIANTS]
        if bad or not self.prefixes:
            raise KvauditError(f"--prefixes takes a comma list of {', '.join(PREFIX_VARIANTS)}")
        if not 1 <= self.systems <= len(SYSTEM_PROMPTS):
            raise KvauditError(f"--systems must be between 1 and {len(SYSTEM_PROMPTS)}")

    def params(self) -> dict[str, Any]:
        return {"cases": self.cases, "min_docs": self.min_docs, "max_docs": self.max_docs,
                "positions": list(self.positions), "zipf": self.zipf,
                "reorder_share": self.reorder_share, "prefixes": list(self.prefixes),
                "systems": list(SYSTEM_PROMPTS[: self.systems])}

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ReuseKnobs:
        k = cls(cases=args.cases, min_docs=args.min_docs, max_docs=args.max_docs,
                positions=split_csv(args.positions), zipf=args.zipf, reorder_share=args.reorder_share,
                prefixes=split_csv(args.prefixes), systems=args.systems)
        k.validate()
        return k

    def context(self, rng: random.Random) -> tuple[str, str, str, str]:
        """A random (system, system label, prefix, prefix label) for one case."""
        si = int(rng.random() * self.systems)
        variant = pick(rng, self.prefixes)
        return SYSTEM_PROMPTS[si], f"sys{si}", make_prefix(rng, variant), variant

    def n_docs(self, rng: random.Random, target: str | None, at_least: int = 1) -> int:
        """Documents for one case; a "middle" target needs three (if --max-docs allows)."""
        n = max(rng.randint(self.min_docs, self.max_docs), at_least)
        if target == "middle" and self.max_docs >= 3:
            n = max(n, 3)
        return n


def split_csv(s: str | Sequence[str]) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``; a sequence is kept as a tuple."""
    if isinstance(s, str):
        return tuple(x.strip() for x in s.split(",") if x.strip())
    return tuple(s)

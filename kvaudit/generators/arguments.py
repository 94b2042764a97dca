"""Command-line options the dataset generators share.

The output options (``--out``, ``--seed``, ``--tokenizer``, ``--no-progress``), the
reuse-dynamics group (``--cases`` ... ``--systems``) and the ``--families`` weight lists.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from kvaudit.core.arg_types import non_negative_int, positive_int
from kvaudit.core.errors import KvauditError
from kvaudit.core.progress import add_progress_argument
from kvaudit.generators.knobs import ReuseKnobs, split_csv
from kvaudit.generators.prefixes import PREFIX_VARIANTS, SYSTEM_PROMPTS


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="dataset directory to write")
    p.add_argument("--seed", type=non_negative_int, default=0, help="random seed (same seed, same bytes)")
    p.add_argument("--tokenizer", choices=("none", "smollm2"), default="none",
                   help="token counts for coverage and length checks: none = whitespace words")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a different dataset already in --out (an identical one is left as is)")
    add_progress_argument(p)


def add_reuse_arguments(p: argparse.ArgumentParser, *, cases: int = 48) -> None:
    d = ReuseKnobs()
    g = p.add_argument_group("reuse dynamics")
    g.add_argument("--cases", type=positive_int, default=cases, help=f"number of cases (default {cases})")
    g.add_argument("--min-docs", type=int, default=d.min_docs, help="fewest documents per case")
    g.add_argument("--max-docs", type=positive_int, default=d.max_docs, help="most documents per case")
    g.add_argument("--positions", default=",".join(d.positions),
                   help="evidence positions to cycle through (first,middle,last)")
    g.add_argument("--zipf", type=float, default=d.zipf,
                   help="skew of how often each document is the evidence (0 = uniform)")
    g.add_argument("--reorder-share", type=float, default=d.reorder_share,
                   help="share of cases that re-ask an earlier case over the same documents in a new order")
    g.add_argument("--prefixes", default=",".join(d.prefixes),
                   help=f"user-turn prefix variants to draw from ({','.join(PREFIX_VARIANTS)})")
    g.add_argument("--systems", type=positive_int, default=d.systems,
                   help=f"how many of the {len(SYSTEM_PROMPTS)} system prompts to vary over")


def parse_weights(spec: str, allowed: Sequence[str], flag: str) -> dict[str, float]:
    """Parse ``"a=3,b=1,c"`` (a bare name weighs 1) into ordered weights."""
    out: dict[str, float] = {}
    for part in split_csv(spec):
        name, _, w = part.partition("=")
        name = name.strip()
        if name not in allowed:
            raise KvauditError(f"{flag}: unknown family {name!r}; choose from {', '.join(allowed)}")
        try:
            out[name] = float(w) if w else 1.0
        except ValueError:
            raise KvauditError(f"{flag}: weight of {name!r} must be a number, got {w!r}") from None
        if out[name] < 0:
            raise KvauditError(f"{flag}: weight of {name!r} must be >= 0")
    if not out or sum(out.values()) <= 0:
        raise KvauditError(f"{flag}: give at least one family with a positive weight")
    return {k: out[k] for k in allowed if k in out}

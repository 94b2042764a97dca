"""Machinery shared by the dataset generators: names, prefixes, placement, CLI knobs and output.

Every generator draws from ``random.Random`` instances seeded with strings (``f"{seed}:..."``),
never iterates over a set when it decides something, and writes through
:func:`kvaudit.core.records.write_dataset`, so the same seed and parameters give byte-identical files.
"""

from __future__ import annotations

import argparse
import bisect
import gc
import random
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvaudit.core.coverage import compute_coverage, format_summary, refs_bucket
from kvaudit.core.errors import KvauditError
from kvaudit.core.progress import add_progress_argument, progress_bar
from kvaudit.core.records import DEFAULT_SYSTEM, Case, DatasetCard, Segment, write_dataset

TokenCounter = Callable[[str], int]

# --------------------------------------------------------------------------- names

_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
           "br", "dr", "gr", "kr", "tr", "st", "sk", "th", "vr", "j", "sl", "fr")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "au", "y")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "nd", "rk", "st", "lt", "x", "v")
_SURNAME_ENDS = ("", "", "sen", "ard", "ek", "ov", "ell", "ric", "wyn", "ton")
_TOWN_ENDS = ("holt", "vale", "mere", "by", "stad", "wick", "ford", "ton", "heim", "port",
              "dal", "haven", "moor", "field")


def pick(rng: random.Random, seq: Sequence[Any]) -> Any:
    """``rng.choice`` at half the cost (the generators' hot path draws millions of these)."""
    return seq[int(rng.random() * len(seq))]


_SYL = tuple(o + v for o in _ONSETS for v in _VOWELS)
_SYLC = tuple(o + v + c for o in _ONSETS for v in _VOWELS for c in _CODAS)


class NameGen:
    """Procedural proper names no model can know; each returned string is unique per instance.

    Names are built from random syllables, so they carry no facts: any answer about a
    generated person, town or studio must come from the documents.
    """

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def _unique(self, make: Callable[[], str]) -> str:
        for _ in range(1000):
            s = make()
            if s not in self.used:
                self.used.add(s)
                return s
        raise RuntimeError("name space exhausted")  # a bug: the space holds millions of names

    def _first(self) -> str:
        r = self.rng
        return (pick(r, _SYL) + pick(r, _SYLC)).capitalize()

    def _surname(self) -> str:
        r = self.rng
        return (pick(r, _SYLC) + pick(r, _SYLC) + pick(r, _SURNAME_ENDS)).capitalize()

    def surname(self) -> str:
        return self._unique(self._surname)

    def person(self, surname: str | None = None) -> str:
        """A unique "First Last" name (sharing ``surname`` when given)."""
        return self._unique(lambda: f"{self._first()} {surname or self._surname()}")

    def town(self) -> str:
        r = self.rng
        return self._unique(lambda: (pick(r, _SYLC) + pick(r, _TOWN_ENDS)).capitalize())

    def root(self) -> str:
        r = self.rng
        return self._unique(lambda: (pick(r, _SYLC) + pick(r, _SYLC)).capitalize())


# --------------------------------------------------------------------------- prefixes

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


# --------------------------------------------------------------------------- knobs


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
                positions=_csv(args.positions), zipf=args.zipf, reorder_share=args.reorder_share,
                prefixes=_csv(args.prefixes), systems=args.systems)
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


def _csv(s: str | Sequence[str]) -> tuple[str, ...]:
    if isinstance(s, str):
        return tuple(x.strip() for x in s.split(",") if x.strip())
    return tuple(s)


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="dataset directory to write")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same bytes)")
    p.add_argument("--tokenizer", choices=("none", "smollm2"), default="none",
                   help="token counts for coverage and length checks: none = whitespace words")
    add_progress_argument(p)


def add_reuse_arguments(p: argparse.ArgumentParser, *, cases: int = 48) -> None:
    d = ReuseKnobs()
    g = p.add_argument_group("reuse dynamics")
    g.add_argument("--cases", type=int, default=cases, help=f"number of cases (default {cases})")
    g.add_argument("--min-docs", type=int, default=d.min_docs, help="fewest documents per case")
    g.add_argument("--max-docs", type=int, default=d.max_docs, help="most documents per case")
    g.add_argument("--positions", default=",".join(d.positions),
                   help="evidence positions to cycle through (first,middle,last)")
    g.add_argument("--zipf", type=float, default=d.zipf,
                   help="skew of how often each document is the evidence (0 = uniform)")
    g.add_argument("--reorder-share", type=float, default=d.reorder_share,
                   help="share of cases that re-ask an earlier case over the same documents in a new order")
    g.add_argument("--prefixes", default=",".join(d.prefixes),
                   help=f"user-turn prefix variants to draw from ({','.join(PREFIX_VARIANTS)})")
    g.add_argument("--systems", type=int, default=d.systems,
                   help=f"how many of the {len(SYSTEM_PROMPTS)} system prompts to vary over")


# --------------------------------------------------------------------------- placement


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


def parse_weights(spec: str, allowed: Sequence[str], flag: str) -> dict[str, float]:
    """Parse ``"a=3,b=1,c"`` (a bare name weighs 1) into ordered weights."""
    out: dict[str, float] = {}
    for part in _csv(spec):
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


def len_bucket(words: float, lo: float, hi: float) -> str:
    """short / medium / long: which third of [lo, hi] a word count falls in."""
    third = (hi - lo) / 3
    if words < lo + third:
        return "short"
    return "medium" if words < lo + 2 * third else "long"


def count_words(text: str) -> int:
    return len(text.split())


# --------------------------------------------------------------------------- tokenizer


def make_token_counter(name: str) -> TokenCounter | None:
    """``none`` -> None (whitespace words); ``smollm2`` -> the model tokenizer's id count."""
    if name == "none":
        return None
    if name != "smollm2":
        raise KvauditError(f"--tokenizer must be none or smollm2, got {name!r}")
    try:
        from kvaudit.models import load_tokenizer
    except ImportError as e:
        raise KvauditError(f"--tokenizer smollm2 needs kvaudit.models ({e})") from None
    tok = load_tokenizer("smollm2")
    cache: dict[str, int] = {}

    def count(text: str) -> int:
        n = cache.get(text)
        if n is None:
            n = cache[text] = len(tok(text, add_special_tokens=False).input_ids)
        return n

    return count


# --------------------------------------------------------------------------- output


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: building 100k cases allocates millions of small
    acyclic objects, and its repeated full scans cost about a third of the run time."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def fill_refs_buckets(cases: list[Case]) -> None:
    """Set ``strata["refs_per_segment_bucket"]``: how many cases reference the case's
    least-referenced evidence segment (all its segments when it names no evidence)."""
    refs: Counter[str] = Counter()
    for c in cases:
        refs.update(dict.fromkeys(c.segment_ids, 1))
    for c in cases:
        ids = c.evidence or c.segment_ids
        c.strata["refs_per_segment_bucket"] = refs_bucket(min(refs[s] for s in ids))


def check_structure(segments: dict[str, Segment], cases: list[Case]) -> None:
    """Internal consistency every generator guarantees; failing it is a generator bug."""
    for s in segments.values():
        if not s.text:
            raise RuntimeError(f"segment {s.id} is empty")
    seen: set[str] = set()
    for c in cases:
        if c.id in seen:
            raise RuntimeError(f"duplicate case id {c.id}")
        seen.add(c.id)
        if not c.segment_ids or any(s not in segments for s in c.segment_ids):
            raise RuntimeError(f"case {c.id} names an unknown segment")
        if any(e not in c.segment_ids for e in c.evidence):
            raise RuntimeError(f"case {c.id}: evidence outside its segments")
        if c.prefix and not c.prefix.endswith("\n"):
            raise RuntimeError(f"case {c.id}: prefix must end with a newline")


def finish(out: str | Path, *, generator: str, seed: int | None, params: dict[str, Any],
           segments: dict[str, Segment], cases: list[Case], counts: dict[str, Any] | None = None,
           count_tokens: TokenCounter | None = None, quiet: bool = False,
           progress: bool = False) -> DatasetCard:
    """Fill the refs strata, compute coverage, write the dataset and print its summary
    (``progress``: a bar while the cases are written, shown when that takes over 2 s)."""
    used: dict[str, None] = {}
    for c in cases:
        used.update(dict.fromkeys(c.segment_ids))
    segs = {sid: segments[sid] for sid in segments if sid in used}
    fill_refs_buckets(cases)
    check_structure(segs, cases)
    coverage = compute_coverage(segs, cases, count_tokens)
    card = DatasetCard(generator=generator, seed=seed, params=params, coverage=coverage,
                       counts=dict(counts or {}))
    card.counts.update({"cases": len(cases), "segments": len(segs)})
    out_dir = Path(out)
    if out_dir.exists() and not out_dir.is_dir():
        raise KvauditError(f"{out_dir}: exists and is not a directory")
    write_dataset(out_dir, segs.values(),
                  progress_bar(cases, desc="writing cases", enabled=progress and not quiet), card)
    if not quiet:
        print(f"wrote {len(cases)} cases over {len(segs)} segments to {out_dir}")
        print(format_summary(coverage))
        for w in coverage.get("warnings", []):
            print(f"warning: {w}", file=sys.stderr)
    return card

"""Finishing a dataset: the refs strata, structural checks, coverage, writing and the summary.

Every generator draws from ``random.Random`` instances seeded with strings (``f"{seed}:..."``),
never iterates over a set when it decides something, and writes through :func:`finish`
(:func:`kvaudit.core.dataset_format.write_dataset`), so the same seed and parameters give
byte-identical files. :func:`run_build` is the ``run`` step a dataset generator's CLI shares.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvaudit.core.coverage import compute_coverage, format_summary, refs_bucket
from kvaudit.core.dataset_format import (
    CARD_FILE,
    CASES_FILE,
    SEGMENTS_FILE,
    Case,
    DatasetCard,
    Segment,
    write_dataset,
)
from kvaudit.core.errors import KvauditError
from kvaudit.core.jsonio import check_writable_dir, removed_on_failure
from kvaudit.core.progress import progress_bar
from kvaudit.generators.tokens import TokenCounter, make_token_counter


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
           progress: bool = False, overwrite: bool = False) -> DatasetCard:
    """Fill the refs strata, compute coverage, write the dataset and print its summary
    (``progress``: a bar while the cases are written, shown when that takes over 2 s).
    A directory that already holds a dataset is left alone when the new one is byte-identical,
    refused when it differs, unless ``overwrite``."""
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
    out_dir = check_writable_dir(out)
    rows = progress_bar(cases, desc="writing cases", enabled=progress and not quiet)
    existing = [n for n in DATASET_FILES if (out_dir / n).exists()]
    if existing and not overwrite:
        # Same seed and parameters give the same bytes: rerunning a generator is harmless, while a
        # different dataset over an existing one would silently change what runs of it measured.
        with tempfile.TemporaryDirectory(prefix=f".{out_dir.name}.", dir=out_dir.parent) as tmp:
            write_dataset(tmp, segs.values(), rows, card)
            same = all((out_dir / n).is_file() and (out_dir / n).read_bytes() == (Path(tmp) / n).read_bytes()
                       for n in DATASET_FILES)
        if not same:
            raise KvauditError(f"{out_dir}: already holds a different dataset ({existing[0]}); pass "
                               "--overwrite to replace it, or choose another --out")
        verb = "unchanged:"
    else:
        # a failed write leaves no folder it made, and none of the files it added, behind
        with removed_on_failure(out_dir, *(out_dir / n for n in DATASET_FILES)):
            write_dataset(out_dir, segs.values(), rows, card)
        verb = "wrote"
    if not quiet:
        print(f"{verb} {len(cases)} cases over {len(segs)} segments in {out_dir}")
        print(format_summary(coverage))
        for w in coverage.get("warnings", []):
            print(f"warning: {w}", file=sys.stderr)
    return card


DATASET_FILES = (SEGMENTS_FILE, CASES_FILE, CARD_FILE)

BuildStep = Callable[[argparse.Namespace, TokenCounter | None, bool], DatasetCard]


def run_build(build: BuildStep, args: argparse.Namespace) -> int:
    """The ``run`` of a dataset generator: its ``build`` step with the chosen token counter,
    the garbage collector paused."""
    check_writable_dir(args.out)  # before the generation, not after it
    count_tokens = make_token_counter(args.tokenizer)
    with paused_gc():
        build(args, count_tokens, False)
    return 0

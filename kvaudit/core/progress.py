"""Progress bars for long work: tqdm on stderr, shown only once the work takes a while.

Every long-running command (run, generate, simulate) uses these, so ``--no-progress`` means the
same everywhere and a bar never changes what the work produces.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from typing import Any

PROGRESS_DELAY_S = 2.0  # a bar appears only once its work has taken this long


def add_progress_argument(p: argparse.ArgumentParser) -> None:
    """``--no-progress``, as ``kvaudit run`` spells it."""
    p.add_argument("--no-progress", action="store_true",
                   help=f"no progress bar (bars go to stderr, and only for work that takes over "
                        f"{PROGRESS_DELAY_S:.0f} s)")


def progress_bar(iterable: Any = None, *, total: int | None = None, desc: str = "",
                 unit: str = "case", enabled: bool = True) -> Any:
    """A tqdm bar on stderr that shows only after :data:`PROGRESS_DELAY_S` (so sub-second work
    prints nothing) and disappears when done; a no-op bar when ``enabled`` is false. It only
    counts: wrapping a loop in it never changes what the loop produces."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=not enabled,
                delay=PROGRESS_DELAY_S, leave=False, dynamic_ncols=True, file=sys.stderr)


def progress_print(bar: Any, line: str) -> None:
    """Print ``line`` to stderr above ``bar`` (a plain print while the bar is not shown yet:
    tqdm's own write would draw a bar still inside its delay), control characters escaped."""
    from kvaudit.core.errors import printable

    line = printable(line)
    shown = getattr(bar, "last_print_t", 0.0) >= getattr(bar, "start_t", 0.0) + PROGRESS_DELAY_S
    if shown and not bar.disable:
        bar.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr)


def bar_iter(bar: Any, items: Iterable[Any]) -> Iterator[Any]:
    """``items``, advancing ``bar`` by one as each is done (one bar over several loops)."""
    for x in items:
        yield x
        bar.update()


def show_progress(args: argparse.Namespace, quiet: bool = False) -> bool:
    """Whether a generator's bars are on: not ``--no-progress`` and not a quiet build."""
    return not (quiet or getattr(args, "no_progress", False))

"""What every gate check kind shares: the policy's row (:class:`Check`), the gate's row
(:class:`ThresholdResult`), the section registry, and the field validators whose messages name the
policy file and field.

A policy section (``[[delta]]``, ``[flips]``, ...) is registered with :func:`section`: its TOML name,
its fields, whether it is an array of tables, and a parser from the section's table to the
:class:`Check` rows it asks for. Each row's kind is judged by the function registered for it with
:func:`evaluates`: ``(check, analysis, arm) -> ThresholdResult``. ``kvaudit.reports.policy`` reads
the top-level fields, runs the registered parsers (arrays of tables first, then tables, each in
registration order), applies the evaluators, and names only the kinds its rules across sections
need (the quality kinds, :data:`QUALITY_KINDS`, which every verdict needs; a simulated hit rate
signed under ``[provenance]``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvaudit.core.errors import KvauditError, cut
from kvaudit.core.registry import Registry
from kvaudit.core.vocabulary import CheckKind, GateStatus, MissingMode, words

if TYPE_CHECKING:
    from kvaudit.reports.analysis import Analysis

MISSING = words(MissingMode)
# The kinds of row that judge answer quality: a gate passes only when one of them was decided
# (a score delta, or how often answers change). Every other row (audit, hit rate, leaks, security,
# provenance, completeness, the noise floor) is a precondition or a further check beside quality,
# never instead of it.
QUALITY_KINDS: tuple[CheckKind, ...] = ("delta", "flips")


@dataclass
class Check:
    name: str
    kind: CheckKind
    params: dict[str, Any]
    missing: MissingMode = "error"


@dataclass
class ThresholdResult:
    name: str
    kind: CheckKind
    status: GateStatus  # error: cannot judge
    observed: str
    threshold: str
    detail: str = ""


@dataclass(frozen=True)
class Table:
    """One section table as its parser sees it: where it is (for messages), the arm under test,
    and the ``missing`` mode it inherits or sets."""

    source: str
    label: str  # "flips", or "delta[0]" for an array of tables
    arm: str
    missing: MissingMode

    def field(self, name: str) -> str:
        """The message prefix naming one field: ``file: field 'label.name'``."""
        return f"{self.source}: field '{self.label}.{name}'"

    @property
    def whole(self) -> str:
        """The message prefix naming the table itself: ``file: field 'label'``."""
        return f"{self.source}: field '{self.label}'"


Parser = Callable[[dict[str, Any], Table], list[Check]]
Evaluator = Callable[[Check, "Analysis", str], ThresholdResult]


@dataclass(frozen=True)
class Section:
    """A policy section: ``name`` its TOML key, ``fields`` what it may hold (``missing`` is added
    for every section that allows it), ``many`` whether it is an array of tables (``[[name]]``)."""

    name: str
    fields: frozenset[str]
    parse: Parser
    many: bool = False


SECTIONS: Registry[Section] = Registry("policy section")
EVALUATORS: dict[str, Evaluator] = {}


def section(name: str, fields: set[str], *, many: bool = False) -> Callable[[Parser], Parser]:
    """Register a policy section's parser (in the order sections are parsed and listed)."""
    def register(fn: Parser) -> Parser:
        SECTIONS.register(Section(name, frozenset(fields), fn, many))
        return fn
    return register


def evaluates(kind: CheckKind) -> Callable[[Evaluator], Evaluator]:
    """Register the function that judges rows of ``kind``."""
    def register(fn: Evaluator) -> Evaluator:
        if kind in EVALUATORS:
            raise ValueError(f"check kind {kind!r} registered twice")
        EVALUATORS[kind] = fn
        return fn
    return register


def number(where: str, v: Any, lo: float | None = None, hi: float | None = None) -> float:
    """A finite number (within [lo, hi] when given); NaN and infinities are refused: a NaN bound
    compares false both ways and an infinite one can never (or always) be met."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise KvauditError(f"{where} must be a number")
    try:
        x = float(v)
    except OverflowError:  # an integer too large for a float
        x = math.inf
    if not math.isfinite(x):
        shown = "an integer too large for a float" if isinstance(v, int) else str(v)
        raise KvauditError(f"{where} must be a finite number, not {shown}")
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        span = f"[{lo:g}, {hi:g}]" if lo is not None and hi is not None else (
            f"at least {lo:g}" if lo is not None else f"at most {hi:g}")
        raise KvauditError(f"{where} must be {'in ' if span[0] == '[' else ''}{span}, not {x:g}")
    return x


def switch(where: str, v: Any) -> bool:
    """A TOML boolean (``1`` or ``"yes"`` are refused, never read as true)."""
    if not isinstance(v, bool):
        raise KvauditError(f"{where} must be true or false")
    return v


def short(v: Any, n: int = 60) -> str:
    """``v`` as text for an error message: control characters escaped, cut to ``n`` characters."""
    return cut(str(v).encode("unicode_escape").decode("ascii"), n)


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def missing_result(check: Check, observed: str, threshold: str, detail: str) -> ThresholdResult:
    """The row of a check whose data the run lacks, as the check's ``missing`` mode says."""
    return ThresholdResult(check.name, check.kind, check.missing, observed, threshold, detail)

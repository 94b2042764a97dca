"""The gate's check kinds: one module per policy section, each registering its parser
(:func:`~kvaudit.reports.gate_checks.base.section`) and the evaluator of each row kind it makes
(:func:`~kvaudit.reports.gate_checks.base.evaluates`), in the manner of the audit's checks
(:mod:`kvaudit.audit.checks`).

Adding a gate check kind is one module here (named in :data:`MODULES`) or a function in the module
of its concern, its word in :data:`kvaudit.core.vocabulary.CheckKind`, and its tests
(docs/architecture.md, "Recipes").
"""

from __future__ import annotations

import importlib

from kvaudit.reports.gate_checks.base import (
    EVALUATORS,
    MISSING,
    QUALITY_KINDS,
    SECTIONS,
    Check,
    Evaluator,
    Section,
    Table,
    ThresholdResult,
)

# Section modules in the order their sections are parsed (and their rows listed).
MODULES = ("quality", "speed", "audit_passed", "hit_rate", "leak", "security", "provenance")
for _module in MODULES:
    importlib.import_module(f"{__name__}.{_module}")


def sections() -> list[Section]:
    """Every policy section: the arrays of tables first (``[[delta]]``, ``[[speed]]``), then the
    tables, each group in registration order."""
    return sorted(SECTIONS.values(), key=lambda s: not s.many)


def evaluator(kind: str) -> Evaluator:
    """The function that judges rows of ``kind``."""
    try:
        return EVALUATORS[kind]
    except KeyError:
        raise ValueError(f"unknown check kind {kind!r}") from None


__all__ = ["EVALUATORS", "MISSING", "MODULES", "QUALITY_KINDS", "SECTIONS", "Check", "Evaluator", "Section", "Table",
           "ThresholdResult", "evaluator", "sections"]

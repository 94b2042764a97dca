"""Plan a run: each delta threshold's false-pass rate, power and the cases it needs (`kvaudit plan`).

This module parses and checks the command line and calls :func:`kvaudit.reports.plan.plan` (the
simulation; its docstring says what a plan holds) and :func:`kvaudit.reports.plan.render`. The
design is ``--cases``, ``--cluster-size``, ``--multi-doc-share``, ``--score`` and
``--base-accuracy``, or ``--from RUN`` to take it from a pilot run; the plan is printed, and
written as JSON with ``--json FILE``.
"""

from __future__ import annotations

import argparse
import json

from kvaudit.core.arg_types import non_negative_int, positive_int
from kvaudit.core.errors import KvauditError, printable
from kvaudit.reports.plan import plan, render

DEFAULT_REPS = 300
_DESIGN_OPTIONS = ("cases", "cluster_size", "multi_doc_share", "score", "base_accuracy")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", metavar="FILE", help="gate policy TOML (default: the shipped policy)")
    parser.add_argument("--from", dest="from_run", metavar="RUN",
                        help="take the design of each threshold's group from a pilot run directory")
    parser.add_argument("--cases", type=int, metavar="N", help="cases in the planned run")
    parser.add_argument("--cluster-size", type=float, metavar="K",
                        help="mean cases per document (default 1: every case on its own document)")
    parser.add_argument("--multi-doc-share", type=float, metavar="S",
                        help="share of cases resting on two documents (default 0)")
    parser.add_argument("--score", choices=("binary", "f1"), help="0/1 scores or F1-like partial credit (default binary)")
    parser.add_argument("--base-accuracy", type=float, metavar="R", help="recompute's mean score (default 0.8)")
    parser.add_argument("--gain-rate", type=float, metavar="P",
                        help="how often the arm changes an answer, as the simulator's gain rate "
                             "(default 0.05; with --from: estimated from the pilot's changed cases)")
    parser.add_argument("--heterogeneity", type=float, metavar="H",
                        help="documents' fragility spread in [0, 1): loss rates are x(1-H) or x(1+H) "
                             "per document (default 0.8)")
    parser.add_argument("--reps", type=positive_int, default=DEFAULT_REPS, metavar="N",
                        help=f"simulated runs per estimate (default {DEFAULT_REPS}; MC SE of a 5%% rate "
                             "is about 1.3%% at 300)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="simulation seed (default 0)")
    parser.add_argument("--json", metavar="FILE", help="also write the plan as JSON")


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse options that contradict each other or are out of range (before anything runs)."""
    given = [o for o in _DESIGN_OPTIONS if getattr(args, o) is not None]
    if args.from_run is not None and given:
        raise KvauditError(f"--{given[0].replace('_', '-')} cannot be combined with --from: the pilot run gives the design")
    if args.from_run is None and args.cases is None:
        raise KvauditError("give a design with --cases N (and --cluster-size, --multi-doc-share, --score, "
                           "--base-accuracy) or a pilot run with --from RUN")
    if args.cases is not None and args.cases < 1:
        raise KvauditError(f"--cases must be at least 1, got {args.cases}")
    if args.cluster_size is not None and not args.cluster_size >= 1:
        raise KvauditError(f"--cluster-size must be at least 1 (cases per document), got {args.cluster_size:g}")
    if args.multi_doc_share is not None and not 0 <= args.multi_doc_share <= 1:
        raise KvauditError(f"--multi-doc-share must be in [0, 1], got {args.multi_doc_share:g}")
    if args.base_accuracy is not None and not 0 < args.base_accuracy < 1:
        raise KvauditError(f"--base-accuracy must be in (0, 1), got {args.base_accuracy:g}")
    if args.gain_rate is not None and not 0 <= args.gain_rate <= 1:
        raise KvauditError(f"--gain-rate must be in [0, 1], got {args.gain_rate:g}")
    if args.heterogeneity is not None and not 0 <= args.heterogeneity < 1:
        raise KvauditError(f"--heterogeneity must be in [0, 1), got {args.heterogeneity:g}")
    if args.reps < 20:
        raise KvauditError(f"--reps must be at least 20, got {args.reps}")


def run(args: argparse.Namespace) -> int:
    from kvaudit.core.jsonio import write_atomic

    check_arguments(args)
    p = plan(args)
    print("".join(printable(line) + "\n" for line in render(p).splitlines()), end="")  # names from files
    if args.json:
        write_atomic(args.json, json.dumps(p, indent=2) + "\n")
    return 0

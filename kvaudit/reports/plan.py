"""The plan of a run: each delta threshold's false-pass rate, power and the cases it needs.

For a gate policy and a design (the cases, their cluster size, multi-document share, score type
and base accuracy; or a pilot run to take them from), simulate the shipped gate with
:mod:`kvaudit.stats.calibration` and report, for each ``[[delta]]`` threshold: its group and
margin, the cases in the design, the false-pass rate when the true delta is exactly the margin,
the power (pass rate) when the true delta is 0, and the fewest cases (same cluster size and mix)
that give 80% power, and beside it the sequential design at that maximum (``kvaudit run
--until-decided``): the cases it is expected to use at a true delta of 0, at the margin and under
a clear loss, and how often it passes. Rates carry their Monte Carlo standard error. :func:`plan` computes it as a
JSON-able dict, :func:`render` writes it as text; ``kvaudit plan`` (:mod:`kvaudit.reports.plan_cli`)
parses and checks the options and calls them. Error messages name the command's options.

With a pilot run each threshold gets the design of its own group in the pilot: its scorable
non-agreement cases with both ``recompute`` and the policy's arm (``overall``: all of them;
``task:<glob>``: tasks matching the glob; ``<stratum>:<glob>``: cases whose stratum matches),
their documents, score type, recompute's mean score and the share of cases whose score changed
(see :func:`kvaudit.stats.calibration.pilot_design`).
"""

from __future__ import annotations

import argparse
import fnmatch
import time
from dataclasses import asdict, replace
from typing import Any

from kvaudit.core.errors import KvauditError

POWER_TARGET = 0.80
MAX_CASES = 20000


_OPTION_NAMES = {"gain_rate": "--gain-rate", "base_accuracy": "--base-accuracy", "heterogeneity": "--heterogeneity",
                 "multi_doc_share": "--multi-doc-share", "cluster size": "--cluster-size"}


def _options(msg: str) -> str:
    """A simulator message with its field names spelled as the command's options."""
    for field_, option in _OPTION_NAMES.items():
        msg = msg.replace(field_, option)
    return msg


def _pilot_groups(run_dir: str, arm: str, groups: list[str]) -> dict[str, tuple[list, list, list]]:
    """Per group: (recompute scores, arm scores, documents) of the pilot's quality cases."""
    from kvaudit.core.arms import REFERENCE_ARM
    from kvaudit.core.errors import DatasetError
    from kvaudit.reports.analysis import load_run
    from kvaudit.reports.scoring import documents, score_pairs

    try:
        run = load_run(run_dir)
    except DatasetError as e:
        raise KvauditError(f"--from: {e}") from None
    scores = score_pairs(run.pairs)
    scores = scores[scores["scorable"].astype(bool) & (scores["metric"] != "agreement")]
    wide = scores.pivot(index="case_id", columns="arm", values="score")
    if REFERENCE_ARM not in wide.columns or arm not in wide.columns:
        raise KvauditError(f"--from {run_dir}: the run has no scored answer-quality cases under both "
                           f"'{REFERENCE_ARM}' and the policy's arm '{arm}'")
    wide = wide[[REFERENCE_ARM, arm]].dropna()
    meta = scores.drop_duplicates("case_id").set_index("case_id").loc[wide.index]
    docs = {p.case_id: list(documents(p)) for p in run.pairs}
    out = {}
    for group in groups:
        if group == "overall":
            ids = list(wide.index)
        else:
            key, _, pattern = group.partition(":")
            column = "task" if key == "task" else f"stratum:{key}"
            if column not in meta.columns:
                ids = []
            else:
                ids = [c for c, v in meta[column].items()
                       if isinstance(v, str) and fnmatch.fnmatchcase(v, pattern)]
        out[group] = (wide.loc[ids, REFERENCE_ARM].tolist(), wide.loc[ids, arm].tolist(),
                      [docs[c] for c in ids])
    return out


def plan(args: argparse.Namespace) -> dict[str, Any]:
    """The plan as a JSON-able dict (what ``kvaudit plan`` prints and ``--json`` writes).

    ``args`` are the options of ``kvaudit plan``, already checked by
    :func:`kvaudit.reports.plan_cli.check_arguments`."""
    from kvaudit.reports.policy import load_policy
    from kvaudit.stats import calibration as cal
    from kvaudit.stats.noninferiority import check_confidence

    policy = load_policy(args.policy, args.from_run)  # a serving-change pilot: its shipped policy
    try:
        confidence = check_confidence(policy.confidence, where=f"{policy.source}: confidence")
    except ValueError as e:
        raise KvauditError(str(e)) from None
    deltas = [c for c in policy.checks if c.kind == "delta"]
    if not deltas:
        raise KvauditError(f"--policy {policy.source}: the policy has no [[delta]] thresholds to plan for")
    het = cal.Design.heterogeneity if args.heterogeneity is None else args.heterogeneity

    def gate(diffs: Any, members: Any, conf: float) -> Any:  # the policy's own bound
        return cal.new_gate(diffs, members, conf, min_icc=policy.min_icc)

    pilot = (_pilot_groups(args.from_run, policy.arm, [c.params["group"] for c in deltas])
             if args.from_run is not None else None)

    rows = []
    for check in deltas:
        group, margin = check.params["group"], check.params["min_lower_bound"] / 100
        row: dict[str, Any] = {"name": check.name, "group": group, "margin_points": 100 * margin}
        if pilot is not None:
            ref, arm, members = pilot[group]
            if not ref:
                rows.append({**row, "cases": 0, "design": None, "note": "no cases in the pilot run"})
                continue
            try:
                design = cal.pilot_design(ref, arm, members, heterogeneity=het)
            except ValueError as e:
                raise KvauditError(f"--from {args.from_run}: group '{group}': {e}") from None
            if args.gain_rate is not None:
                design = replace(design, gain_rate=args.gain_rate)
        else:
            try:
                design = cal.Design(
                    n=args.cases, cluster_size=1.0 if args.cluster_size is None else args.cluster_size,
                    multi_doc_share=0.0 if args.multi_doc_share is None else args.multi_doc_share,
                    score=args.score or "binary",
                    base_accuracy=0.8 if args.base_accuracy is None else args.base_accuracy,
                    gain_rate=0.05 if args.gain_rate is None else args.gain_rate, heterogeneity=het)
            except ValueError as e:
                raise KvauditError(f"design: {_options(str(e))}") from None
        try:
            design.loss_rate(margin)
        except ValueError as e:
            raise KvauditError(f"threshold '{check.name}' ({100 * margin:+g} pts): {_options(str(e))} "
                               "(see --gain-rate, --base-accuracy, --heterogeneity)") from None
        t = time.perf_counter()
        c = cal.characterise(design, margin, reps=args.reps, seed=args.seed, confidence=confidence,
                             statistic=gate)
        needed = cal.cases_for_power(design, margin, target=POWER_TARGET, reps=args.reps,
                                     seed=args.seed, confidence=confidence, max_n=MAX_CASES,
                                     statistic=gate)
        seq = _sequential(design, margin, needed, confidence, args.reps, args.seed, policy.min_icc)
        rows.append({
            **row, "cases": design.n, "design": {**asdict(design), "n_documents": design.n_documents},
            "sequential": seq,
            "false_pass": c.at_margin.passed, "false_pass_se": c.at_margin.passed_se,
            "coverage": c.at_margin.covered, "coverage_se": c.at_margin.covered_se,
            "undecidable": c.at_margin.undecidable,
            "power": c.at_zero.passed, "power_se": c.at_zero.passed_se,
            "cases_for_80_power": needed, "seconds": round(time.perf_counter() - t, 2),
        })
    return {"policy": policy.source, "arm": policy.arm, "confidence": confidence,
            "min_icc": policy.min_icc,
            "one_sided_level": (1 + confidence) / 2,
            "source": f"pilot run {args.from_run}" if args.from_run else "the command line",
            "reps": args.reps, "seed": args.seed, "power_target": POWER_TARGET, "thresholds": rows}


def _sequential(design: Any, margin: float, needed: int | None, confidence: float, reps: int, seed: int,
                min_icc: float) -> dict[str, Any] | None:
    """``kvaudit run --until-decided`` with ``--max-cases`` at the fixed design's size for 80% power
    (looks every tenth): its power and expected cases at delta 0, at the margin and under a clear loss."""
    from kvaudit.stats.sequential import default_look_every, operating_characteristic
    from kvaudit.stats.sequential import design as seq_design

    if needed is None:
        return None
    plan = seq_design(needed, default_look_every(needed), (1 - confidence) / 2)
    oc = operating_characteristic(replace(design, n=needed), margin, plan, reps=reps, seed=seed, min_icc=min_icc)
    out: dict[str, Any] = {"max_cases": needed, "look_every": plan.look_every}
    for label, key in (("zero", "zero"), ("margin", "margin"), ("clear_loss", "loss")):
        r = oc[key]
        out[label] = None if r is None else {"delta_points": 100 * r.delta, "passed": r.passed,
                                             "mean_cases": r.mean_cases}
    return out


def _se(x: float | None, se: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f} ± {se:.3f}"


def render(p: dict[str, Any]) -> str:
    lines = [f"Plan for policy {p['policy']} (arm '{p['arm']}', bound one-sided {p['one_sided_level']:.1%}), "
             f"design from {p['source']}; {p['reps']} simulated runs per estimate, rates ± MC SE.", ""]
    for r in p["thresholds"]:
        lines.append(f"{r['name']}  [group {r['group']}, margin {r['margin_points']:+.1f} pts]")
        d = r["design"]
        if d is None:
            lines += [f"  cases: 0 ({r['note']})", ""]
            continue
        multi = "" if not d["multi_doc_share"] else f", {d['multi_doc_share']:.0%} on two documents"
        lines.append(f"  cases: {d['n']} on {d['n_documents']} documents ({d['cluster_size']:.3g} per document"
                     f"{multi}), {d['score']} scores, base accuracy {d['base_accuracy']:.2f}, "
                     f"gain rate {d['gain_rate']:.3f}, heterogeneity {d['heterogeneity']:g}")
        lines.append(f"  false-pass rate at the margin: {_se(r['false_pass'], r['false_pass_se'])}"
                     f"   (coverage {_se(r['coverage'], r['coverage_se'])}, undecidable {r['undecidable']:.3f})")
        lines.append(f"  power at true delta 0:         {_se(r['power'], r['power_se'])}")
        needed = r["cases_for_80_power"]
        lines.append("  cases for 80% power:           "
                     + (f"{needed} (same cases per document and mix; bisection on simulated power, ±5%)"
                        if needed is not None else f"more than {MAX_CASES}"))
        seq = r.get("sequential")
        if seq:
            parts = [f"{k.replace('_', ' ')} ({v['delta_points']:+.0f} pts) {v['mean_cases']:.0f} cases, passes {v['passed']:.2f}"
                     for k, v in ((k, seq[k]) for k in ("zero", "margin", "clear_loss")) if v]
            lines.append(f"  sequential (--until-decided --max-cases {seq['max_cases']} --look-every {seq['look_every']}): "
                         "expected " + "; ".join(parts))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"

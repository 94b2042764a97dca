"""Runs side by side (`kvaudit compare RUN... --out DIR`): one row per (run, arm under test).

Each run is read with :func:`kvaudit.reports.analysis.load_run` and analysed on its own
(:class:`~kvaudit.reports.analysis.Analysis` at the policy's confidence): every number in a row
is the number that run's own report and gate give. Per row: model, backend, dtype, dataset,
arm; the overall delta with its interval, the flip rate beside the run's noise floor, the
chunk-aligned and token hit rates, the TTFT speed-up, the gate's verdict (the checks of
:func:`kvaudit.reports.policy.evaluate` plus the completeness row, exactly what
:func:`kvaudit.reports.gate.judge` returns, with the policy's arm set to the row's arm); per task
family: the delta with its interval, the flips and the routing recommendation
(:func:`kvaudit.reports.summary.routing`).

Runs are grouped by the dataset they ran (the manifest's ``identity.dataset_hash``, else its
``dataset.hash``); a run that records no dataset hash is a group of its own. Each
group is its own table: deltas measured on different cases are never put in one table.

:func:`build_comparison` returns the JSON summary; :func:`write_comparison` writes
``DIR/compare.json`` and the self-contained ``DIR/compare.html`` (no script, no fetch: its
Content-Security-Policy is ``default-src 'none'``; all run-derived text escaped).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvaudit.core.arms import NOISE_ARM, REFERENCE_ARM
from kvaudit.core.errors import KvauditError
from kvaudit.core.manifest import Manifest
from kvaudit.stats.paired import PairedDelta

if TYPE_CHECKING:
    from kvaudit.reports.analysis import FlipRate

JSON_FILE = "compare.json"
HTML_FILE = "compare.html"
FORMAT = 1
TEMPLATES = Path(__file__).with_name("templates")
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def run_identity(manifest: Manifest) -> dict[str, Any]:
    """Model, weights fingerprint, backend, dtype and dataset (name, hash, cases) of a run."""
    ident, model = manifest.identity, manifest.model
    dataset, backend = manifest.dataset, manifest.backend or {}
    return {
        "model": _text(ident and ident.model) or _text(model and model.name),
        "model_fingerprint": _text(ident and ident.model_fingerprint) or _text(model and model.fingerprint),
        "backend": _text(ident and ident.backend) or _text(backend.get("backend")),
        # a top-level dtype is what synthetic runs recorded before the manifest had a format
        "dtype": _text(ident and ident.dtype) or _text(manifest.extra.get("dtype")) or _text(model and model.dtype),
        "dataset": _text(dataset and dataset.name) or _text(dataset and dataset.generator)
        or _text(dataset and dataset.path),
        "dataset_path": _text(dataset and dataset.path),
        "dataset_hash": _text(ident and ident.dataset_hash) or _text(dataset and dataset.hash),
    }


def _pick(d: PairedDelta | FlipRate | dict[str, Any] | None, *keys: str) -> dict[str, Any] | None:
    """Some fields of a record (a statistic's, or a dict's keys), for the comparison's JSON."""
    if d is None:
        return None
    return {k: d.get(k) for k in keys} if isinstance(d, dict) else {k: getattr(d, k) for k in keys}


_DELTA_KEYS = ("n", "n_clusters", "delta", "ci", "lower_bound", "upper_bound", "decidable", "reason", "mdd")


def _rows_for_run(path: Path, policy: Any, arms: Sequence[str] | None) -> tuple[list[dict[str, Any]],
                                                                              list[dict[str, Any]], dict[str, Any]]:
    """Rows of one run (one per arm under test), the arms skipped with why, and its identity."""
    from kvaudit.reports.analysis import Analysis, load_run
    from kvaudit.reports.gate import completeness
    from kvaudit.reports.policy import evaluate, verdict
    from kvaudit.reports.summary import routing

    run = load_run(path)
    an = Analysis(run, confidence=policy.confidence, min_icc=policy.min_icc)
    ident = run_identity(run.manifest)
    rows, skipped = [], []
    noise = an.flips(NOISE_ARM) if NOISE_ARM in an.arms else None
    for arm in arms or [policy.arm]:
        if arm not in an.compared_arms:
            skipped.append({"run": str(run.path), "arm": arm,
                            "reason": f"arm '{arm}' is not in this run (arms: {', '.join(an.arms)})"})
            continue
        p = dataclasses.replace(policy, arm=arm)
        results = evaluate(p, an)
        row = completeness(run, allow_partial=False)
        results = ([row] if row else []) + results
        routes = {r["task"]: r for r in routing(an, p)}
        families = {}
        for task in an.tasks:
            d = an.delta(arm, f"task:{task}")
            f = an.flips_by_group(arm, [f"task:{task}"])
            r = routes.get(task, {})
            families[task] = {**(_pick(d, *_DELTA_KEYS) or {}),
                              "flips": f[0]["flips"] if f else None, "flip_n": f[0]["n"] if f else None,
                              "flip_rate": f[0]["rate"] if f else None,
                              "recommendation": r.get("recommendation"), "routing_reason": r.get("reason"),
                              "margin": r.get("margin")}
        flips = an.flips(arm)
        rows.append({
            "run": str(run.path), **ident, "arm": arm,
            "n_cases": len(run.pairs), "n_quality_cases": int(len(an.select("overall"))),
            "missing_cases": len(run.missing_cases),
            "audit": {"state": run.audit.state, "verdict": run.audit.verdict},
            "gate": {"verdict": verdict(results), "policy": policy.source,
                     "checks": [dataclasses.asdict(r) for r in results]},
            "overall": _pick(an.delta(arm, "overall"), *_DELTA_KEYS),
            "flips": _pick(flips, "n", "flips", "rate", "ci"),
            "noise_floor": _pick(noise, "n", "flips", "rate", "ci"),
            "flip_excess": _pick(an.flip_excess(arm), "n", "delta", "ci", "reason")
            if noise is not None else None,
            "hit_rate": {"segment": an.hit_rate(arm, "segment"), "token": an.hit_rate(arm)},
            "speedup": an.speedup(arm),
            # the same ratio for identical work (recompute_again over recompute): this run's timing noise
            "noise_speedup": an.speedup(NOISE_ARM) if NOISE_ARM in an.compared_arms else None,
            "started": run.manifest.sessions[0].started if run.manifest.sessions else None,
            "families": families,
        })
    return rows, skipped, ident


def _apart(started: list[str | None]) -> str | None:
    """Why the rows' timings met different conditions, or None: runs started more than an hour
    apart (:mod:`kvaudit.reports.sittings`), or some not saying when. Each speed-up is measured within
    its own run (paired), so this warns about reading one run's latencies against another's."""
    from kvaudit.reports.sittings import hours_apart

    if len(set(started)) < 2:
        return None
    stamps = [s for s in started if s]
    if len(stamps) < len(started):
        return "some of these runs do not record when they started"
    return hours_apart(stamps, "runs", "started", "start")


def build_comparison(run_dirs: Sequence[str | Path], *, policy_path: str | Path | None = None,
                     arms: Sequence[str] | None = None) -> dict[str, Any]:
    """The JSON summary: ``groups`` (one per dataset, each with ``rows`` and the union of task
    ``families``), ``skipped`` (arms a run lacks), the policy and its confidence.

    Raises :class:`~kvaudit.core.errors.KvauditError` for no runs or a run given twice, and
    :class:`~kvaudit.core.dataset_format.DatasetError` (from :func:`load_run`) for a directory that is not a
    readable run; a comparison never silently leaves a run out.
    """
    from kvaudit.reports.policy import default_policy, load_policy
    from kvaudit.reports.summary import jsonable

    if not run_dirs:
        raise KvauditError("kvaudit compare needs at least one run directory")
    seen: dict[Path, str] = {}
    for d in run_dirs:
        key = Path(d).resolve()
        if key in seen:
            raise KvauditError(f"{d}: the same run is given twice (as {seen[key]!r} too)")
        seen[key] = str(d)
    # runs that are all serving changes are judged by that policy's arm (candidate) unless one is given
    kinds = {default_policy(d) for d in run_dirs}
    policy = load_policy(policy_path, run_dirs[0] if len(kinds) == 1 else None)
    groups: dict[str, dict[str, Any]] = {}
    skipped: list[dict[str, Any]] = []
    for i, d in enumerate(run_dirs):
        rows, skip, ident = _rows_for_run(Path(d), policy, arms)
        skipped += skip
        h = ident["dataset_hash"]
        group_key = h if h else f"(no dataset hash recorded: {d})#{i}"
        g = groups.setdefault(group_key, {"dataset_hash": h, "datasets": [], "dataset_paths": [], "runs": [],
                                    "families": [], "rows": []})
        for k, v in (("datasets", ident["dataset"]), ("dataset_paths", ident["dataset_path"]), ("runs", str(d))):
            if v and v not in g[k]:
                g[k].append(v)
        g["rows"] += rows
        for r in rows:
            g["families"] += [t for t in r["families"] if t not in g["families"]]
    for g in groups.values():
        g["families"].sort()
        g["apart"] = _apart([r.get("started") for r in g["rows"]])
    return jsonable({
        "format": FORMAT, "policy": policy.source, "confidence": policy.confidence,
        "arms": list(arms) if arms else [policy.arm],
        "margins": [{"name": c.name, "group": c.params["group"], "min_lower_bound": c.params["min_lower_bound"]}
                    for c in policy.checks if c.kind == "delta"],
        "groups": list(groups.values()), "skipped": skipped,
    })


def render(comparison: dict[str, Any]) -> str:
    """The comparison page (autoescaped jinja2; the figures are matplotlib SVG)."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined
    from markupsafe import Markup

    from kvaudit.reports.plots import forest_svg

    margins = [(m["name"], m["min_lower_bound"]) for m in comparison["margins"] if m["group"] == "overall"]
    figures = []
    for g in comparison["groups"]:
        rows = [{"group": row_label(r), "delta": r["overall"]["delta"], "ci": r["overall"]["ci"],
                 "n": r["overall"]["n"]} for r in g["rows"] if r["overall"]["n"]]
        figures.append(Markup(forest_svg(rows, margins=margins, title="overall delta per run and arm",
                                         confidence=comparison["confidence"], label_width=70)) if rows else "")
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(pts=_pts, pct=_pct, ratio=_ratio)
    return env.get_template("compare.html.j2").render(c=comparison, figures=figures, csp=CSP,
                                                      ref_arm=REFERENCE_ARM, noise_arm=NOISE_ARM)


def row_label(r: dict[str, Any]) -> str:
    """``run · model · backend · dtype · arm`` (how a row is named in the figure; the run as its
    last two path parts)."""
    run = "/".join(Path(r["run"]).parts[-2:])
    return " · ".join(str(x) for x in (run, r["model"], r["backend"], r["dtype"], r["arm"]) if x)


def write_comparison(run_dirs: Sequence[str | Path], out_dir: str | Path, *,
                     policy_path: str | Path | None = None,
                     arms: Sequence[str] | None = None) -> tuple[Path, Path]:
    """Write ``compare.json`` and ``compare.html`` into ``out_dir`` (atomically); return both paths."""
    from kvaudit.core.jsonio import write_atomic, write_json

    comparison = build_comparison(run_dirs, policy_path=policy_path, arms=arms)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise KvauditError(f"{out}: --out must be a directory")
    page = render(comparison)
    write_json(out / JSON_FILE, comparison)
    write_atomic(out / HTML_FILE, page)
    return out / JSON_FILE, out / HTML_FILE


def _pts(x: Any) -> str:
    return "–" if x is None else f"{x:+.1f}"


def _pct(x: Any) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _ratio(x: Any) -> str:
    return "–" if x is None else f"{x:.1f}×"

"""``RUN/report.html``: one self-contained page rendered from the summary with jinja2.

Autoescape is on for everything: answers, questions and stratum values come from a corpus that
may contain HTML or ``<script>``. The only unescaped pieces are our own: the forest plot SVG
(matplotlib escapes its text) and the filter script, whose SHA-256 is the only script the
page's Content-Security-Policy allows, so an injected inline script could not run even if some
escaping were missed. The CSP also blocks every network fetch (``default-src 'none'``).

Figures (forest plot, flip rate per group beside the noise floor, TTFT per arm, the repairs'
quality-for-speed frontier, reuse-dynamics coverage) are inline SVG from :mod:`kvaudit.reports.plots`.

The drill-down filter can be preset from the URL: ``report.html#task=multi_hop_bridge&flips=1``.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvaudit.core.arms import NOISE_ARM, REFERENCE_ARM, UNDER_TEST_ARM
from kvaudit.core.run_format import flipped
from kvaudit.reports.analysis import Analysis
from kvaudit.reports.plots import (
    flip_strata_svg,
    forest_svg,
    frontier_svg,
    per_segment_svg,
    refs_histogram_svg,
    shares_svg,
    ttft_svg,
)
from kvaudit.reports.policy import Policy

TEMPLATES = Path(__file__).with_name("templates")
DEFAULT_MAX_CASES = 2000

FILTER_JS = """(function () {
  var task = document.getElementById("task-filter");
  var flips = document.getElementById("flips-only");
  var count = document.getElementById("case-count");
  function apply() {
    var shown = 0;
    document.querySelectorAll("tr.case").forEach(function (row) {
      var ok = (!task.value || row.dataset.task === task.value) &&
               (!flips.checked || row.dataset.flip === "1");
      row.hidden = !ok;
      if (ok) { shown += 1; }
    });
    count.textContent = String(shown);
  }
  var preset = new URLSearchParams(location.hash.slice(1));
  if (preset.has("task")) { task.value = preset.get("task"); }
  if (preset.get("flips") === "1") { flips.checked = true; }
  task.addEventListener("change", apply);
  flips.addEventListener("change", apply);
  apply();
  document.body.setAttribute("data-js", "ready");
})();"""


def diff_spans(a: str, b: str) -> tuple[list[tuple[str, bool]], list[tuple[str, bool]]]:
    """Word-level diff: each side as (text, changed) runs, for highlighting in the template."""
    ta, tb = re.split(r"(\s+)", a), re.split(r"(\s+)", b)
    left: list[tuple[str, bool]] = []
    right: list[tuple[str, bool]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ta, tb, autojunk=False).get_opcodes():
        if i2 > i1:
            left.append(("".join(ta[i1:i2]), op != "equal"))
        if j2 > j1:
            right.append(("".join(tb[j1:j2]), op != "equal"))
    return left, right


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(d, dict):
        out: list[tuple[str, Any]] = []
        for k, v in d.items():
            out += _flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return [(prefix, d)]


# coverage keys of kvaudit.core.coverage.compute_coverage, as the report names them
_PER_SEGMENT = {"refs_per_segment": "references", "distinct_slots_per_segment": "slots",
                "distinct_offsets_per_segment": "token offsets", "distinct_orders_per_segment": "orders",
                "distinct_contexts_per_segment": "preceding contexts"}
_SHARES = {"never_cached_position_share": "at a never-cached position",
           "foreign_context_share": "after foreign context"}
_SHORT = {"at a never-cached position": "never-cached position", "after foreign context": "after foreign context",
          "segments referenced more than once": "segments reused (> 1 case)",
          "document sets seen in several orders": "doc sets in > 1 order"}
_COUNTS = [("n_cases", "cases"), ("n_segments", "segments referenced"), ("unused_segments", "segments never referenced"),
           ("n_occurrences", "segment occurrences"), ("distinct_orders", "distinct segment orders"),
           ("distinct_system_prompts", "distinct system prompts"), ("distinct_prefixes", "distinct user prefixes"),
           ("leak_probes", "leak probes")]
_RANGES = {"doc_region_tokens": "document region", "prompt_tokens_estimate": "prompt, without template"}


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _coverage_view(cov: dict[str, Any] | None) -> dict[str, Any] | None:
    """Figures and a compact table from a dataset's coverage; keys this report does not know
    (another generator's, an older layout) are listed as they are, never dropped."""
    from markupsafe import Markup

    if not cov:
        return None
    known: set[str] = {"warnings", "token_unit", "tasks", "strata", "refs_histogram", "distinct_doc_sets",
                       "doc_sets_with_several_orders"}
    figures: dict[str, Markup] = {}
    hist = cov.get("refs_histogram")
    if isinstance(hist, list) and hist and all(isinstance(h, dict) and _is_num(h.get("segments")) for h in hist):
        figures["coverage-refs-plot"] = Markup(refs_histogram_svg(hist))
    per_segment = {label: cov[k] for k, label in _PER_SEGMENT.items()
                   if isinstance(cov.get(k), dict) and _is_num(cov[k].get("max"))}
    known |= {k for k in _PER_SEGMENT if isinstance(cov.get(k), dict)}
    if per_segment:
        # references have their own histogram; the others share one scale
        drawn = {k: v for k, v in per_segment.items() if k != "references"} or per_segment
        figures["coverage-per-segment-plot"] = Markup(per_segment_svg(drawn))
    shares = [(f"occurrences {label}", float(cov[k])) for k, label in _SHARES.items() if _is_num(cov.get(k))]
    if isinstance(cov.get("refs_per_segment"), dict) and _is_num(cov["refs_per_segment"].get("share_gt1")):
        shares.append(("segments referenced more than once", float(cov["refs_per_segment"]["share_gt1"])))
    sets, several = cov.get("distinct_doc_sets"), cov.get("doc_sets_with_several_orders")
    if _is_num(sets) and _is_num(several) and sets:
        shares.append(("document sets seen in several orders", several / sets))
    known |= set(_SHARES)
    if shares:
        figures["coverage-shares-plot"] = Markup(shares_svg(
            [(_SHORT.get(label.removeprefix("occurrences "), label), v) for label, v in shares]))
    counts = [(label, cov[k]) for k, label in _COUNTS if _is_num(cov.get(k))]
    if _is_num(sets):
        counts.append(("document sets (orders ignored)", f"{sets}" + (f", {several} in several orders"
                                                                     if _is_num(several) else "")))
    known |= {k for k, _ in _COUNTS}
    unit = cov.get("token_unit") or "tokens"
    for k, label in _RANGES.items():
        r = cov.get(k)
        if isinstance(r, dict) and all(_is_num(r.get(x)) for x in ("min", "median", "max")):
            counts.append((f"{label} ({unit})", f"{r['min']:g} / {r['median']:g} / {r['max']:g} (min / median / max)"))
            known.add(k)
    mix = []
    for k in ("tasks", "strata"):
        v = cov.get(k)
        if isinstance(v, dict) and k == "tasks":
            mix.append(("tasks", ", ".join(f"{t} {n}" for t, n in v.items())))
        elif isinstance(v, dict):
            mix += [(f"stratum {sk}", ", ".join(f"{a}: {n}" for a, n in sv.items()))
                    for sk, sv in v.items() if isinstance(sv, dict)]
    return {
        "figures": figures,
        "per_segment": [(label, m) for label, m in per_segment.items()],
        "shares": shares, "counts": counts, "mix": mix,
        "warnings": [str(w) for w in cov.get("warnings") or [] if w],
        "other": [(k, v) for k, v in _flatten({k: v for k, v in cov.items() if k not in known})],
    }


def _cases(an: Analysis, arm: str, max_cases: int) -> tuple[list[dict[str, Any]], int]:
    rows = []
    for p in an.run.pairs:
        ref, other = p.arms.get(REFERENCE_ARM), p.arms.get(arm)
        if ref is None:
            continue
        left, right = diff_spans(ref.answer, other.answer) if other else ([(ref.answer, False)], [])
        flip = other is not None and flipped(other, ref)

        def score(a: str, case_id: str = p.case_id) -> float | None:
            v = an.rows.get((case_id, a), {}).get("score")
            return None if v is None or v != v else float(v)  # NaN: not scorable

        rows.append({
            "id": p.case_id, "task": p.task, "flip": flip,
            "question": an.run.questions.get(p.case_id, ""),
            "gold": (["(scored against the recompute answer)"] if p.metric == "agreement" else p.answers),
            "metric": p.metric, "left": left, "right": right, "has_arm": other is not None,
            "score_ref": score(REFERENCE_ARM), "score_arm": score(arm) if other else None,
            "logit_diff": other.logit_diff_vs_recompute if other else None,
            "margin": ref.margin, "near_tie": ref.margin < an.near_tie,
            "strata": ", ".join(f"{k}={v}" for k, v in (p.strata or {}).items()),
            "others": [(name, a.answer) for name, a in p.arms.items() if name not in (REFERENCE_ARM, arm)],
        })
    rows.sort(key=lambda r: (not r["flip"], r["task"], r["id"]))
    return rows[:max_cases], len(rows)


def render(summary: Mapping[str, Any], an: Analysis, policy: Policy, *,
           max_cases: int = DEFAULT_MAX_CASES) -> str:
    """The report page as a string."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined
    from markupsafe import Markup

    arm = policy.arm
    rows = summary["comparisons"].get(arm, [])
    margins = [(c.name, c.params["min_lower_bound"]) for c in policy.checks if c.kind == "delta"]
    svg = forest_svg(rows, margins=margins, title=f"{arm} vs {REFERENCE_ARM}", confidence=an.confidence) if rows else ""
    flip_rows = an.flips_by_group(arm)
    flip_svg = flip_strata_svg(flip_rows, an.flips_by_group(NOISE_ARM) if NOISE_ARM in an.arms else (),
                               arm=arm, confidence=an.confidence) if flip_rows else ""
    samples = {a: an.ttft_samples(a) for a in an.arms}
    ttft_plot = ttft_svg(samples, highlight=arm) if any(samples.values()) else ""
    cases, n_cases = _cases(an, arm, max_cases)
    frontier = summary.get("frontier") or {}
    frontier_plot = (frontier_svg(frontier["groups"], confidence=an.confidence)
                     if frontier.get("groups") else "")
    digest = base64.b64encode(hashlib.sha256(FILTER_JS.encode()).digest()).decode()

    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(pts=_pts, pct=_pct, pval=_pval, secs=_secs, num=_num)
    return env.get_template("report.html.j2").render(
        s=summary, arm=arm, rows=rows, forest=Markup(svg), cases=cases, n_cases=n_cases,
        flip_plot=Markup(flip_svg), ttft_plot=Markup(ttft_plot), cov=_coverage_view(summary["coverage"]),
        frontier=frontier, frontier_plot=Markup(frontier_plot),
        tasks=sorted({c["task"] for c in cases}), script=Markup(FILTER_JS),
        csp=f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-{digest}'",
        controls={a: [r for r in summary["comparisons"][a] if r["group"] == "overall" or r["group"].startswith("task:")]
                  for a in summary["comparisons"] if a != arm},
        near_tie=an.near_tie, ref_arm=REFERENCE_ARM, noise_arm=NOISE_ARM, neutral_arm=UNDER_TEST_ARM,
    )


def _pts(x: Any) -> str:
    return "–" if x is None else f"{x:+.1f}"


def _pct(x: Any) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _pval(x: Any) -> str:
    if x is None:
        return "–"
    return "<0.001" if x < 0.001 else f"{x:.3f}"


def _secs(x: Any) -> str:
    return "–" if x is None else f"{x:.3f} s"


def _num(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)

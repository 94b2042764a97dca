"""``RUN/report.html``: one self-contained page rendered from the summary with jinja2.

Autoescape is on for everything: answers, questions and stratum values come from a corpus that
may contain HTML or ``<script>``. The only unescaped pieces are our own: the forest plot SVG
(matplotlib escapes its text) and the filter script, whose SHA-256 is the only script the
page's Content-Security-Policy allows, so an injected inline script could not run even if some
escaping were missed. The CSP also blocks every network fetch (``default-src 'none'``).

The drill-down filter can be preset from the URL: ``report.html#task=multi_hop_bridge&flips=1``.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import re
from pathlib import Path
from typing import Any

from kvaudit.reports.analysis import REFERENCE_ARM, Analysis
from kvaudit.reports.plots import forest_svg
from kvaudit.reports.policy import Policy
from kvaudit.schema import flipped

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


def render(summary: dict[str, Any], an: Analysis, policy: Policy, *,
           max_cases: int = DEFAULT_MAX_CASES) -> str:
    """The report page as a string."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined
    from markupsafe import Markup

    arm = policy.arm
    rows = summary["comparisons"].get(arm, [])
    margins = [(c.name, c.params["min_lower_bound"]) for c in policy.checks if c.kind == "delta"]
    svg = forest_svg(rows, margins=margins, title=f"{arm} vs recompute", confidence=an.confidence) if rows else ""
    cases, n_cases = _cases(an, arm, max_cases)
    digest = base64.b64encode(hashlib.sha256(FILTER_JS.encode()).digest()).decode()

    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(pts=_pts, pct=_pct, pval=_pval, secs=_secs, num=_num)
    return env.get_template("report.html.j2").render(
        s=summary, arm=arm, rows=rows, forest=Markup(svg), cases=cases, n_cases=n_cases,
        tasks=sorted({c["task"] for c in cases}), script=Markup(FILTER_JS),
        csp=f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-{digest}'",
        controls={a: [r for r in summary["comparisons"][a] if r["group"] == "overall" or r["group"].startswith("task:")]
                  for a in summary["comparisons"] if a != arm},
        coverage=_flatten(summary["coverage"]) if summary["coverage"] else [],
        near_tie=an.near_tie,
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

"""Forest plot of paired deltas by group, as an SVG string to embed inline in the report.

matplotlib's SVG writer escapes text, so group labels taken from the data (stratum values)
cannot inject markup; text stays text (``svg.fonttype = none``) so it is searchable.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any


def forest_svg(rows: Sequence[dict[str, Any]], *, margins: Sequence[tuple[str, float]] = (),
               title: str = "", confidence: float = 0.95) -> str:
    """Point delta and CI per row (``group``, ``delta``, ``ci``, ``n``), zero and margin lines."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    rows = [r for r in rows if r.get("delta") is not None]
    height = 1.2 + 0.28 * max(len(rows), 1)
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "kvaudit", "font.size": 9}):
        fig = Figure(figsize=(10, height))
        ax = fig.add_subplot()
        ys = list(range(len(rows)))[::-1]
        for y, r in zip(ys, rows, strict=True):
            ci = r.get("ci")
            colour = "#b2182b" if ci and ci[1] < 0 else "#2166ac" if ci and ci[0] > 0 else "#444444"
            if ci:
                ax.plot(ci, [y, y], color=colour, linewidth=1.6, solid_capstyle="butt")
            marker = "D" if r["group"] == "overall" else "o"
            ax.plot([r["delta"]], [y], marker=marker, color=colour, markersize=5)
        ax.axvline(0, color="#888888", linewidth=0.8)
        styles = ["--", ":", "-.", (0, (5, 1, 1, 1))]
        for i, (label, m) in enumerate(margins):
            ax.axvline(m, color="#d6604d", linewidth=0.9, linestyle=styles[i % len(styles)],
                       label=f"{label} margin ({m:+g})")
        if margins:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        ax.set_yticks(ys)
        ax.set_yticklabels([f"{_short(r['group'])} (n={r['n']})" for r in rows])
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.set_xlabel(f"delta vs recompute (points, {confidence:.0%} score interval with document "
                      "design effect; its lower end is what the gate judges)")
        if title:
            ax.set_title(title, fontsize=10, loc="left")
        ax.grid(axis="x", color="#eeeeee")
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


def _short(label: str, width: int = 40) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"

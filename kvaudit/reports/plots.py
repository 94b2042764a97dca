"""The report's figures, as SVG strings to embed inline (no external resource, no script).

Every figure is drawn with matplotlib's Agg canvas and written by its SVG backend with
``svg.fonttype = none`` (text stays text: searchable, and escaped by matplotlib, so labels taken
from the data, such as stratum values, cannot inject markup) and a fixed ``svg.hashsalt`` (the
same data gives the same bytes). Figures:

- :func:`forest_svg`: paired delta and interval per group, zero and margin lines;
- :func:`flip_strata_svg`: flip rate per group beside the noise floor's, Wilson intervals;
- :func:`ttft_svg`: time to first token per arm, box plot over a strip of cases, log scale;
- :func:`frontier_svg`: per task family, each frontier arm's quality delta (with its interval)
  against its speed-up over the reference, the margin line, and the routed arm ringed;
- :func:`refs_histogram_svg`, :func:`per_segment_svg`, :func:`shares_svg`: reuse-dynamics
  coverage of the dataset (``manifest["dataset"]["coverage"]``).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

from kvaudit.core.arms import NOISE_ARM, REFERENCE_ARM, UNDER_TEST_ARM

ARM_COLOUR = "#2166ac"
NOISE_COLOUR = "#8c8c8c"
LOSS_COLOUR = "#b2182b"
MAX_STRIP_POINTS = 400  # cases drawn per arm in the TTFT strip (the box uses every case)


def _figure(width: float, height: float):
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def _rc():
    import matplotlib

    # text.parse_math off: labels come from user data (stratum values), and a "$" there must not
    # be read as mathtext (an unbalanced one made matplotlib raise).
    return matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "kvaudit", "font.size": 9,
                                  "text.parse_math": False})


def _svg(fig: Any) -> str:
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


def forest_svg(rows: Sequence[dict[str, Any]], *, margins: Sequence[tuple[str, float]] = (),
               title: str = "", confidence: float = 0.95, label_width: int = 40) -> str:
    """Point delta and CI per row (``group``, ``delta``, ``ci``, ``n``), zero and margin lines;
    labels longer than ``label_width`` characters are shortened with an ellipsis."""
    rows = [r for r in rows if r.get("delta") is not None]
    height = 1.2 + 0.28 * max(len(rows), 1)
    with _rc():
        fig = _figure(10, height)
        ax = fig.add_subplot()
        ys = list(range(len(rows)))[::-1]
        for y, r in zip(ys, rows, strict=True):
            ci = r.get("ci")
            colour = LOSS_COLOUR if ci and ci[1] < 0 else ARM_COLOUR if ci and ci[0] > 0 else "#444444"
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
        ax.set_yticklabels([f"{_short(r['group'], label_width)} (n={r['n']})" for r in rows])
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.set_xlabel(f"delta vs recompute (points, {confidence:.0%} score interval with document "
                      "design effect; its lower end is what the gate judges)")
        if title:
            ax.set_title(title, fontsize=10, loc="left")
        ax.grid(axis="x", color="#eeeeee")
        return _svg(fig)


def flip_strata_svg(arm_rows: Sequence[dict[str, Any]], noise_rows: Sequence[dict[str, Any]] = (), *,
                    arm: str = UNDER_TEST_ARM, noise_arm: str = NOISE_ARM,
                    confidence: float = 0.95) -> str:
    """Flip rate (percent) per group for ``arm`` and, just below it, the noise floor's on the
    same group, each with its Wilson interval (rows: ``group``, ``n``, ``rate``, ``ci``, from
    :meth:`kvaudit.reports.analysis.Analysis.flips_by_group`)."""
    noise = {r["group"]: r for r in noise_rows}
    rows = list(arm_rows)
    height = 1.3 + 0.34 * max(len(rows), 1)
    with _rc():
        fig = _figure(10, height)
        ax = fig.add_subplot()
        ys = list(range(len(rows)))[::-1]
        labelled: set[str] = set()

        def point(y: float, r: dict[str, Any], colour: str, label: str, marker: str) -> None:
            if r.get("ci"):
                ax.plot([100 * r["ci"][0], 100 * r["ci"][1]], [y, y], color=colour, linewidth=1.6,
                        solid_capstyle="butt")
            ax.plot([100 * r["rate"]], [y], marker=marker, color=colour, markersize=5, linestyle="none",
                    label=None if label in labelled else label)
            labelled.add(label)

        for y, r in zip(ys, rows, strict=True):
            point(y + 0.15, r, ARM_COLOUR, f"{arm} vs recompute", "D" if r["group"] == "overall" else "o")
            if r["group"] in noise:
                point(y - 0.15, noise[r["group"]], NOISE_COLOUR, f"{noise_arm} (noise floor)", "s")
        ax.set_yticks(ys)
        ax.set_yticklabels([f"{_short(r['group'])} (n={r['n']})" for r in rows])
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.set_xlim(-2, 102)
        ax.set_xlabel(f"answers changed vs recompute (%, {confidence:.0%} Wilson interval)")
        ax.set_title(f"Flip rate by group: {arm} beside the noise floor", fontsize=10, loc="left")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        ax.grid(axis="x", color="#eeeeee")
        return _svg(fig)


def ttft_svg(samples: Mapping[str, Sequence[float]], *, highlight: str = UNDER_TEST_ARM, unit: str = "cases",
             what: str = "arm", median_method: Any = "linear") -> str:
    """Time to first token per arm: a box (quartiles, whiskers at 1.5 IQR) over a jittered strip
    of the cases (at most :data:`MAX_STRIP_POINTS` per arm, an even subsample), log-scaled x.
    ``unit`` names the dots, ``what`` the rows; ``median_method`` is numpy's quantile method of the
    median in each row's label (a replay's tables give percentiles as order statistics:
    ``inverted_cdf``), so the label and the table beside it agree."""
    import numpy as np

    arms = [a for a, v in samples.items() if len(v)]
    height = 1.2 + 0.45 * max(len(arms), 1)
    rng = np.random.default_rng(0)
    with _rc():
        fig = _figure(10, height)
        ax = fig.add_subplot()
        ys = list(range(len(arms)))[::-1]
        data = [np.asarray(samples[a], dtype=float) for a in arms]
        data = [np.clip(d, 1e-6, None) for d in data]  # log scale: a 0 s timing drawn at 1 µs
        if arms:
            ax.boxplot(data, positions=ys, orientation="horizontal", widths=0.55, showfliers=False,
                       patch_artist=True, medianprops={"color": "#111111", "linewidth": 1.4},
                       boxprops={"facecolor": "#f1f1f1", "edgecolor": "#555555"},
                       whiskerprops={"color": "#555555"}, capprops={"color": "#555555"})
        for y, a, d in zip(ys, arms, data, strict=True):
            shown = d if len(d) <= MAX_STRIP_POINTS else d[np.linspace(0, len(d) - 1, MAX_STRIP_POINTS).astype(int)]
            colour = ARM_COLOUR if a == highlight else LOSS_COLOUR if a == REFERENCE_ARM else NOISE_COLOUR
            ax.scatter(shown, y + rng.uniform(-0.2, 0.2, len(shown)), s=7, color=colour, alpha=0.45,
                       linewidths=0, zorder=3)
        ax.set_xscale("log")
        log_seconds(ax.xaxis)
        ax.set_yticks(ys)
        ax.set_yticklabels([f"{_short(a, 28)} (n={len(d)}, median "
                            f"{_secs(float(np.quantile(d, 0.5, method=median_method)))})"
                            for a, d in zip(arms, data, strict=True)])
        ax.set_ylim(-0.7, len(arms) - 0.3)
        ax.set_xlabel(f"time to first token (seconds, log scale); box: quartiles, whiskers 1.5 IQR, dots: {unit}")
        ax.set_title(f"Time to first token per {what}", fontsize=10, loc="left")
        ax.grid(axis="x", which="both", color="#eeeeee")
        return _svg(fig)


def frontier_svg(groups: Sequence[Mapping[str, Any]], *, confidence: float = 0.95) -> str:
    """One panel per group (``group``, ``margin``, ``points``: ``arm``, ``delta``, ``ci``,
    ``speedup``; ``route``: ``arm``): delta (points) against speed-up over the reference, an
    interval bar per point, zero and margin lines; the routed arm is ringed."""
    drawn = [g for g in groups if any(p.get("speedup") and p.get("delta") is not None for p in g["points"])]
    n = max(len(drawn), 1)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    with _rc():
        fig = _figure(3.6 * cols + 0.4, 2.9 * rows + 0.5)
        for i, g in enumerate(drawn):
            ax = fig.add_subplot(rows, cols, i + 1)
            pts = [p for p in g["points"] if p.get("speedup") and p.get("delta") is not None]
            routed = (g.get("route") or {}).get("arm")
            for p in pts:
                x, y, ci = float(p["speedup"]), float(p["delta"]), p.get("ci")
                colour = LOSS_COLOUR if ci and ci[1] < 0 else ARM_COLOUR
                if ci:
                    ax.plot([x, x], ci, color=colour, linewidth=1.3, alpha=0.8)
                ax.plot([x], [y], "o", color=colour, markersize=4.5)
                if p["arm"] == routed:
                    ax.plot([x], [y], "o", markersize=11, markerfacecolor="none", markeredgecolor="#1a7f37",
                            markeredgewidth=1.6)
                ax.annotate(_short(p["arm"], 14), (x, y), xytext=(4, 3), textcoords="offset points", fontsize=7)
            ax.axhline(0, color="#888888", linewidth=0.8)
            if g.get("margin") is not None:
                ax.axhline(float(g["margin"]), color="#d6604d", linewidth=0.9, linestyle="--")
            ax.axvline(1, color="#cccccc", linewidth=0.8, linestyle=":")
            ax.set_title(_short(str(g["group"]), 34), fontsize=9, loc="left")
            ax.set_xlabel("speed-up over the reference (median TTFT ratio)", fontsize=7.5)
            ax.set_ylabel("delta (points)", fontsize=7.5)
            ax.grid(color="#eeeeee")
            ax.spines[["top", "right"]].set_visible(False)
        fig.suptitle(f"Quality against speed per arm ({confidence:.0%} intervals; dashed: the policy's margin; "
                     "ringed: the routed arm)", fontsize=9, x=0.01, ha="left")
        return _svg(fig)


def refs_histogram_svg(histogram: Sequence[Mapping[str, Any]]) -> str:
    """Segments per bucket of references (``refs_histogram`` of the coverage: ``refs``, ``segments``)."""
    labels = [str(h["refs"]) for h in histogram]
    counts = [int(h["segments"]) for h in histogram]
    with _rc():
        fig = _figure(4.6, 3.0)
        ax = fig.add_subplot()
        xs = list(range(len(labels)))
        colours = [NOISE_COLOUR if lab == "1" else ARM_COLOUR for lab in labels]
        ax.bar(xs, counts, color=colours, width=0.7)
        for x, c in zip(xs, counts, strict=True):
            ax.annotate(str(c), (x, c), ha="center", va="bottom", fontsize=8, xytext=(0, 2),
                        textcoords="offset points")
        ax.set_xticks(xs)
        ax.set_xticklabels(labels)
        ax.set_ylim(0, max(counts, default=1) * 1.18 + 0.5)
        ax.set_xlabel("references per segment (cases holding it)")
        ax.set_ylabel("segments")
        ax.set_title("How often segments recur (grey: never reused)", fontsize=10, loc="left")
        ax.spines[["top", "right"]].set_visible(False)
        return _svg(fig)


def per_segment_svg(measures: Mapping[str, Mapping[str, Any]]) -> str:
    """Per segment, distinct slots / offsets / orders / contexts (label -> ``mean``, ``median``,
    ``max``, ``share_gt1``): a bar to the max, the median (dot) and mean (diamond) on it, and the
    share of segments with more than one written beside it."""
    labels = list(measures)
    with _rc():
        fig = _figure(4.6, 0.9 + 0.55 * max(len(labels), 1))
        ax = fig.add_subplot()
        ys = list(range(len(labels)))[::-1]
        top = max((float(m.get("max") or 0) for m in measures.values()), default=1.0) or 1.0
        for y, lab in zip(ys, labels, strict=True):
            m = measures[lab]
            ax.plot([1, float(m.get("max") or 1)], [y, y], color="#c6dbef", linewidth=7, solid_capstyle="butt",
                    label="1 to max" if y == ys[0] else None)
            ax.plot([float(m.get("median") or 0)], [y], "o", color=ARM_COLOUR, markersize=6,
                    label="median" if y == ys[0] else None)
            ax.plot([float(m.get("mean") or 0)], [y], "D", color="#111111", markersize=4,
                    label="mean" if y == ys[0] else None)
            share = m.get("share_gt1")
            if share is not None:
                ax.annotate(f"{100 * float(share):.0f}% > 1", (top * 1.04, y), va="center", fontsize=8,
                            color="#444444")
        ax.set_yticks(ys)
        ax.set_yticklabels(labels)
        ax.set_xlim(0, top * 1.32)
        ax.set_ylim(-0.7, len(labels) - 0.3 + 0.6)
        ax.set_xlabel("distinct values per segment")
        ax.set_title("Positions and orders each segment is seen in", fontsize=10, loc="left")
        ax.legend(loc="upper right", fontsize=7, frameon=False, ncol=3)
        ax.spines[["top", "right"]].set_visible(False)
        return _svg(fig)


def shares_svg(shares: Sequence[tuple[str, float]]) -> str:
    """Horizontal 0-100% bars, one per ``(label, share)`` (never-cached position share, ...)."""
    with _rc():
        fig = _figure(4.6, 0.9 + 0.5 * max(len(shares), 1))
        ax = fig.add_subplot()
        ys = list(range(len(shares)))[::-1]
        for y, (_, v) in zip(ys, shares, strict=True):
            ax.barh([y], [100], color="#eeeeee", height=0.55)
            ax.barh([y], [100 * v], color=ARM_COLOUR, height=0.55)
            ax.annotate(f"{100 * v:.0f}%", (100 * v, y), xytext=(3, 0), textcoords="offset points",
                        va="center", fontsize=8, color="#111111")
        ax.set_yticks(ys)
        ax.set_yticklabels([_short(lab, 34) for lab, _ in shares])
        ax.set_xlim(0, 112)
        ax.set_xlabel("share (%)")
        ax.set_title("What reuse must repair", fontsize=10, loc="left")
        ax.spines[["top", "right"]].set_visible(False)
        return _svg(fig)


def log_seconds(axis: Any) -> None:
    """Ticks of a log-scale axis in seconds at 1, 2 and 5 per decade, labelled "50 ms", "2 s": the
    default labels are mathtext, which ``svg.fonttype = none`` leaves as raw markup in the page."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    def label(x: float, _: int) -> str:
        lo, hi = sorted(axis.get_view_interval())
        if lo > 0 and hi / lo > 1e3 and not math.isclose(10 ** round(math.log10(x)), x, rel_tol=1e-6):
            return ""  # over more than three decades "50 ms" and "100 ms" collide: label the decades only
        return _secs(x)

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(label))
    axis.set_minor_formatter(FuncFormatter(lambda x, _: ""))


def _secs(x: float) -> str:
    if x < 1e-3:
        return f"{x * 1e6:.3g} µs"
    return f"{x * 1000:.3g} ms" if x < 1 else f"{x:.3g} s"


def _short(label: str, width: int = 40) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"

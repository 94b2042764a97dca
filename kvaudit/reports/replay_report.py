"""Replays side by side (``kvaudit compare REPLAY... --out DIR``, ``kvaudit report REPLAY``):
``replays.json`` and ``replays.html`` with one row per replay (policy, budget, TTFT p50/p95/p99
with intervals, throughput, hit rate measured beside the simulator's), TTFT per policy, TTFT
against prompt length, and the token hit rate over time, measured and simulated.

Every number comes from each replay's own ``replay.json`` (:mod:`kvaudit.replay.summary`) and its
request records; nothing is recomputed differently here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvaudit.core.errors import KvauditError
from kvaudit.core.jsonio import write_atomic, write_json
from kvaudit.core.replay_format import ReplayDir
from kvaudit.core.run_format import REPLAYS_HTML, REPLAYS_JSON
from kvaudit.reports.plots import _figure, _rc, _svg, ttft_svg

TEMPLATE = "replays.html.j2"


def is_replay(path: str | Path) -> bool:
    return ReplayDir(path).is_replay()


def _label(s: dict[str, Any]) -> str:
    c = s["config"]
    return f"{c['policy']} @ {c['budget_bytes'] / 1e6:,.0f} MB"


def build(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The comparison: rows in the order given, and per replay its TTFT samples and windows."""
    rows, ttft, by_length, over_time = [], {}, {}, {}
    for p in paths:
        d = ReplayDir(p)
        if not d.summary_file.is_file():
            raise KvauditError(f"{d.path}: no replay.json; finish the replay first (rerun its kvaudit replay command)")
        s = d.read_summary()
        label = _label(s)
        if label in ttft:
            label = f"{label} ({d.path.name})"
        recs = d.read_requests()
        ttft[label] = [r.ttft_s for r in recs]
        by_length[label] = s["ttft_by_length"]
        over_time[label] = (s["hit_rate"]["over_time"], s["hit_rate"]["simulated_over_time"])
        rows.append({"label": label, "path": str(d.path), "summary": s})
    workloads = {r["summary"]["config"]["workload_hash"] for r in rows}
    return {"rows": rows, "ttft": ttft, "by_length": by_length, "over_time": over_time,
            "same_workload": len(workloads) == 1}


def _length_svg(by_length: dict[str, list[dict[str, Any]]]) -> str:
    with _rc():
        fig = _figure(10, 3.2)
        ax = fig.add_subplot()
        for label, bins in by_length.items():
            xs = [(b["tokens_low"] + b["tokens_high"]) / 2 for b in bins]
            ax.plot(xs, [1e3 * b["ttft_p50_s"] for b in bins], marker="o", label=label)
        ax.set_xlabel("prompt tokens (bin middle)")
        ax.set_ylabel("median TTFT (ms)")
        ax.set_title("Time to first token against request length", fontsize=10, loc="left")
        ax.grid(color="#eeeeee")
        ax.legend(fontsize=8)
        return _svg(fig)


def _over_time_svg(over_time: dict[str, tuple[list, list]]) -> str:
    with _rc():
        fig = _figure(10, 3.2)
        ax = fig.add_subplot()
        for label, (measured, simulated) in over_time.items():
            line, = ax.plot([w["end"] for w in measured], [100 * (w["token_hit_rate"] or 0) for w in measured],
                            marker="o", label=f"{label} measured")
            ax.plot([w["end"] for w in simulated], [100 * (w["token_hit_rate"] or 0) for w in simulated],
                    linestyle="--", color=line.get_color(), label=f"{label} simulated")
        ax.set_xlabel("requests served")
        ax.set_ylabel("token hit rate in window (%)")
        ax.set_title("Token hit rate over time: measured (solid) and simulated (dashed)", fontsize=10, loc="left")
        ax.grid(color="#eeeeee")
        ax.legend(fontsize=8)
        return _svg(fig)


def render(comparison: dict[str, Any]) -> str:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined
    from markupsafe import Markup

    from kvaudit.reports.html import TEMPLATES

    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    return env.get_template(TEMPLATE).render(
        c=comparison, csp="default-src 'none'; style-src 'unsafe-inline'; img-src data:",
        ttft_plot=Markup(ttft_svg(comparison["ttft"], highlight="")),
        length_plot=Markup(_length_svg(comparison["by_length"])),
        time_plot=Markup(_over_time_svg(comparison["over_time"])),
    )


def write(paths: Sequence[str | Path], out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``replays.json`` and ``replays.html`` into ``out_dir``."""
    comparison = build(paths)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out / REPLAYS_JSON, out / REPLAYS_HTML
    write_json(json_path, {k: comparison[k] for k in ("rows", "same_workload")})
    write_atomic(html_path, render(comparison))
    return json_path, html_path

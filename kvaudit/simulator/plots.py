"""SVG plots of a simulation: hit rate against capacity, and hit rate over time.

matplotlib is imported inside the functions (Agg backend) so importing this module stays cheap.
SVGs are written without a date and with a fixed hash salt, so the same simulation gives the same
bytes.
"""

from __future__ import annotations

import io
from pathlib import Path

from kvaudit.core.jsonio import write_atomic


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "kvaudit"
    plt.rcParams["text.parse_math"] = False  # labels are plain text, never mathtext
    return plt


def _save(fig, path: Path) -> None:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    write_atomic(path, buf.getvalue())


def plot_vs_capacity(sim: dict, path: str | Path) -> None:
    """Token hit rate (all requests, and warm phase dashed) against capacity, one line per policy."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for policy in dict.fromkeys(r["policy"] for r in sim["results"]):
        rows = sorted((r for r in sim["results"] if r["policy"] == policy), key=lambda r: r["capacity_bytes"])
        xs = [r["capacity_bytes"] / 1e9 for r in rows]
        line, = ax.plot(xs, [100 * (r["token_hit_rate"] or 0) for r in rows], marker="o", label=policy)
        ax.plot(xs, [100 * (r["warm"]["token_hit_rate"] or 0) for r in rows], ls="--",
                color=line.get_color(), alpha=0.6, label=f"{policy} (warm phase)")
        for x, r in zip(xs, rows, strict=True):
            ax.annotate(f"{100 * (r['token_hit_rate'] or 0):.1f}", (x, 100 * (r["token_hit_rate"] or 0)),
                        textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    if len({r["capacity_bytes"] for r in sim["results"]}) > 1:
        ax.set_xscale("log")
    ax.set_xlabel(f"cache capacity (GB, {sim['model']['name']} KV: "
                  f"{sim['model']['bytes_per_token']:,} bytes/token)")
    ax.set_ylabel("token hit rate (%)")
    ax.set_ylim(0, 105)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{sim['workload']['requests']:,} requests")
    _save(fig, Path(path))
    plt.close(fig)


def plot_over_time(sim: dict, path: str | Path) -> None:
    """Token hit rate per window of requests, one line per policy and capacity."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    caps = list(dict.fromkeys(r["capacity"] for r in sim["results"]))
    styles = ["-", "--", ":", "-."]
    policies = list(dict.fromkeys(r["policy"] for r in sim["results"]))
    for r in sim["results"]:
        mids = [(w["start"] + w["end"]) / 2 for w in r["windows"]]
        ax.plot(mids, [100 * (w["token_hit_rate"] or 0) for w in r["windows"]],
                label=f"{r['policy']} @ {r['capacity']}", color=f"C{caps.index(r['capacity']) % 10}",
                ls=styles[policies.index(r["policy"]) % len(styles)])
    ax.set_xlabel("request index (window midpoint)")
    ax.set_ylabel("token hit rate (%)")
    ax.set_ylim(0, 105)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, Path(path))
    plt.close(fig)

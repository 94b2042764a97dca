"""Replays side by side (``kvaudit compare REPLAY... --out DIR``, ``kvaudit report REPLAY``):
``replays.json`` and ``replays.html`` with one row per replay (policy, budget, TTFT p50/p95/p99
with intervals, throughput, hit rate measured beside the simulator's), TTFT per policy, TTFT
against prompt length, and the token hit rate over time, measured and simulated. A load sweep
(``kvaudit replay --rate R1,R2,...``: ``sweep.json`` and one replay per load, or
``--replications K`` of each) counts as its replays, and adds TTFT against offered load per sweep
(a replicated load's percentiles the median over its replications, with their interval) and, with an SLO on p95 TTFT, the highest
offered load that met it with the server keeping up (every lighter load too; a load past
saturation never counts: :mod:`kvaudit.stats.saturation`).

Every number comes from each replay's own ``replay.json`` (:mod:`kvaudit.replay.summary`) and its
request records; nothing is recomputed differently here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvaudit.core.errors import KvauditError, excerpt
from kvaudit.core.jsonio import read_json, write_atomic, write_json
from kvaudit.core.replay_format import ReplayDir, arrival_rate
from kvaudit.core.run_format import REPLAYS_HTML, REPLAYS_JSON, SWEEP_FILE
from kvaudit.replay.summary import UNCLAIMED_INTERVALS, load_across_replications
from kvaudit.reports.plots import _figure, _rc, _svg, log_seconds, ttft_svg
from kvaudit.stats.saturation import GROWTH_LIMIT, highest_sustained

TEMPLATE = "replays.html.j2"


def is_replay(path: str | Path) -> bool:
    """A replay directory, or a load sweep's (``sweep.json``)."""
    return ReplayDir(path).is_replay() or (Path(path) / SWEEP_FILE).is_file()


def _policy_label(c: dict[str, Any]) -> str:
    """A replay's policy and budget (and the KV space it ran at, where the user gave one; the
    engines file's table it ran on, for a serving change under load)."""
    label = f"{c['policy']} @ {c['budget_bytes'] / 1e6:,.0f} MB"
    if c.get("kv_space_bytes"):
        label += f", KV space {c['kv_space_bytes'] / 1e6:,.0f} MB"
    if c.get("engine_role"):
        label += f" · {c['engine_role']}" + (f" ({c['engine_change']})" if c.get("engine_change") else "")
    return label


def _label(s: dict[str, Any]) -> str:
    c = s["config"]
    label = _policy_label(c)
    rate = arrival_rate(c.get("arrivals", "closed"))
    if rate is not None:
        label += f" @ {rate:g}/s"
    return label


def _sweep_loads(path: Path) -> list[list[Path]]:
    """Per load of a sweep, in the file's order, its replays (its replications', or its one);
    the error names the file and field."""
    obj = read_json(path / SWEEP_FILE)
    loads = obj.get("loads") if isinstance(obj, dict) else None
    if not isinstance(loads, list) or not loads:
        raise KvauditError(f"{path / SWEEP_FILE}: field 'loads' must be a non-empty list")
    out = []
    for i, row in enumerate(loads):
        if not isinstance(row, dict):
            raise KvauditError(f"{path / SWEEP_FILE}: field 'loads[{i}]' must be an object")
        reps = row.get("replications")
        if reps is None:  # a sweep of one replay per load (kvaudit before --replications)
            named = [(f"loads[{i}].dir", row.get("dir"))]
        elif isinstance(reps, list) and reps:
            named = [(f"loads[{i}].replications[{k}].dir", r.get("dir") if isinstance(r, dict) else None)
                     for k, r in enumerate(reps)]
        else:
            raise KvauditError(f"{path / SWEEP_FILE}: field 'loads[{i}].replications' must be a non-empty list")
        out.append([_replay_beside(path, field, name) for field, name in named])
    seen: dict[Path, int] = {}
    for i, dirs in enumerate(out):
        for d in dirs:  # a replay counted twice would pass for two replications
            if d in seen:
                raise KvauditError(f"{path / SWEEP_FILE}: field 'loads[{i}]' names {excerpt(repr(d.name), 60)} again "
                                   f"(loads[{seen[d]}] names it too): each replay belongs to one load, once")
            seen[d] = i
    return out


def _replay_beside(path: Path, field: str, name: Any) -> Path:
    """The finished replay a sweep's ``field`` names, in a folder beside ``sweep.json``."""
    if (not isinstance(name, str) or "/" in name or "\x00" in name or name in ("", ".", "..")
            or len(name.encode("utf-8", "surrogatepass")) > 255):  # longer: no file system names it
        raise KvauditError(f"{path / SWEEP_FILE}: field '{field}' must name a folder beside it")
    if not ReplayDir(path / name).summary_file.is_file():
        raise KvauditError(f"{path / SWEEP_FILE}: field '{field}' names {excerpt(repr(name), 60)}, which "
                           "holds no finished replay (no replay.json); rerun the sweep's kvaudit replay command")
    return path / name


def build(paths: Sequence[str | Path], slo_ttft_s: float | None = None) -> dict[str, Any]:
    """The comparison: rows in the order given (a sweep's loads in its order), per replay its TTFT
    samples and windows, and per sweep its p50/p95/p99 against offered load."""
    rows: list[dict[str, Any]] = []
    ttft, by_length, over_time = {}, {}, {}
    sweeps: list[dict[str, Any]] = []
    expanded: list[tuple[Path, tuple[int, int] | None]] = []  # a replay, and its (sweep, load) if in one
    grouped: dict[tuple[int, int], list[tuple[Path, dict[str, Any]]]] = {}
    for p in paths:
        p = Path(p)
        if (p / SWEEP_FILE).is_file():
            expanded += [(d, (len(sweeps), i)) for i, dirs in enumerate(_sweep_loads(p)) for d in dirs]
            sweeps.append({"path": str(p), "loads": []})
        else:
            expanded.append((p, None))
    for p, sweep in expanded:
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
        if sweep is not None:
            grouped.setdefault(sweep, []).append((d.summary_file, s))
    for (k, _), replays in grouped.items():
        sw, s = sweeps[k], replays[0][1]
        sw["label"] = _policy_label(s["config"])
        sw["policy"] = s["config"]["policy"]
        sw["engine_role"] = s["config"].get("engine_role")
        sw["schedule"] = s["config"].get("schedule", "waves")
        sw["loads"].append(_load(replays))
    for sw in sweeps:
        sw["intervals_claimed"] = all(x["intervals_claimed"] for x in sw["loads"])
        sw["replications"] = max(x["replications"] for x in sw["loads"])
        sw["loads"].sort(key=lambda x: x["rate"])
        if slo_ttft_s is not None:
            sw["highest_within_slo"] = highest_sustained(
                [{**x, "p95_s": x["p95"]["value"]} for x in sw["loads"]], slo_ttft_s)
            # the load measured next above it, where the SLO was missed (None: met at every load):
            # what the sweep sustains lies between the two
            sw["slo_missed_at"] = next((x["rate"] for x in sw["loads"] if sw["highest_within_slo"] is None
                                        or x["rate"] > sw["highest_within_slo"]), None)
            # the sustained load's p95 interval reaching past the SLO, or too few requests for it to
            # have an upper end: more requests or replications could move the reading (a caution
            # shown beside it; the reading itself uses the point)
            held = next((x for x in sw["loads"] if x["rate"] == sw["highest_within_slo"]), None)
            high = held["p95"]["high"] if held else None
            sw["slo_edge"] = ({"high_s": high, "claimed": held["intervals_claimed"]}
                              if held and (high is None or high > slo_ttft_s) else None)
            # a load that met the SLO only because its replay ended before the queue grew
            sw["met_past_saturation"] = [x["rate"] for x in sw["loads"]
                                         if x["past_saturation"] and x["p95"]["value"] <= slo_ttft_s]
    workloads = {r["summary"]["config"]["workload_hash"] for r in rows}
    serving_change = _serving_change(rows)
    return {"rows": rows, "ttft": ttft, "by_length": by_length, "over_time": over_time,
            "same_workload": len(workloads) == 1, "sweeps": sweeps, "slo_ttft_s": slo_ttft_s,
            "any_past_saturation": any(x["past_saturation"] for sw in sweeps for x in sw["loads"]),
            "unclaimed_intervals": any(not r["summary"].get("ttft_intervals_claimed", True) for r in rows),
            "against": _against(sweeps), "apart": _apart(rows), "serving_change": serving_change,
            "differences": _differences(rows, serving_change is not None)}


def _serving_change(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Replays that each ran on an engines file's table (``kvaudit replay --engines``): the roles
    and the candidate's change in words, or None where any ran on the command line's engine."""
    configs = [r["summary"].get("config") or {} for r in rows]
    if not configs or not all(c.get("engine_role") for c in configs):
        return None
    changes = sorted({c["engine_change"] for c in configs if c.get("engine_change")})
    return {"roles": sorted({c["engine_role"] for c in configs}), "change": "; ".join(changes) or None}


BASELINES = ("prefix", "recompute")  # what another policy's sweep is read against, first found


def _against(sweeps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Each sweep at the offered loads it shares with the baseline sweep (a serving change's
    baseline engine where one was swept, else prefix caching, else recompute, else the first): p95 TTFT side by side, their ratio, and where both
    loads' intervals hold (replications), whether they lie apart; with an SLO, each one's highest
    sustained load beside the baseline's. None for fewer than two sweeps."""
    if len(sweeps) < 2:
        return None
    base = next((sw for sw in sweeps if sw.get("engine_role") == "baseline"), None) or next(
        (sw for p in BASELINES for sw in sweeps if sw["policy"] == p), sweeps[0])
    rows = []
    for sw in sweeps:
        if sw is base:
            continue
        mine = {x["rate"]: x for x in sw["loads"]}
        for b in base["loads"]:
            x = mine.get(b["rate"])
            if x is None:
                continue
            rows.append({"rate": b["rate"], "label": sw["label"], "base": b["p95"]["value"], "other": x["p95"]["value"],
                         "ratio": x["p95"]["value"] / b["p95"]["value"] if b["p95"]["value"] > 0 else None,
                         "apart": _apart_intervals(b, x),
                         "past_saturation": b["past_saturation"] or x["past_saturation"]})
    sustained = [{"label": sw["label"], "rate": sw.get("highest_within_slo"),
                  **_load_gain(base, sw)} for sw in sweeps if sw is not base]
    return {"base": base["label"], "base_sustained": base.get("highest_within_slo"), "rows": rows,
            "sustained": sustained}


def _load_gain(base: dict[str, Any], other: dict[str, Any]) -> dict[str, float | None]:
    """How much more load ``other`` sustains under the SLO than ``base``: at the loads measured
    (``gain``), and the range the loads measured either side allow (``gain_low``, ``gain_high``):
    each sweep's true limit lies between the highest load that met the SLO and the next one
    measured, which missed it; an end is None where a sweep met it at every load measured. All
    None without an SLO or where either sweep met it at no load."""
    b, o = base.get("highest_within_slo"), other.get("highest_within_slo")
    if not b or not o:
        return {"gain": None, "gain_low": None, "gain_high": None}
    b_next, o_next = base.get("slo_missed_at"), other.get("slo_missed_at")
    return {"gain": o / b - 1, "gain_low": o / b_next - 1 if b_next else None,
            "gain_high": o_next / b - 1 if o_next else None}


def _apart_intervals(base: dict[str, Any], other: dict[str, Any]) -> str | None:
    """``lower`` or ``higher`` where the other load's p95 interval lies wholly below or above the
    baseline's, ``overlapping`` where they meet; None where either claims no level."""
    if not (base["intervals_claimed"] and other["intervals_claimed"]):
        return None
    b, x = base["p95"], other["p95"]
    if x["high"] is not None and b["low"] is not None and x["high"] < b["low"]:
        return "lower"
    if x["low"] is not None and b["high"] is not None and x["low"] > b["high"]:
        return "higher"
    return "overlapping"


def _load(replays: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
    """One load of a sweep from its replications' summaries: its rate (the same in each, or the
    error names the file) and :func:`~kvaudit.replay.summary.load_across_replications`."""
    rates: list[float] = []
    for file, s in replays:
        rate = arrival_rate(s["config"].get("arrivals", "closed"))
        if rate is None or (rates and rate != rates[0]):
            raise KvauditError(f"{file}: field 'config.arrivals' must be poisson:RATE:SEED at the rate of the load's "
                               f"other replications, got {excerpt(repr(s['config'].get('arrivals', 'closed')), 60)}")
        rates.append(rate)
    x = load_across_replications([s for _, s in replays])
    g = x["ttft_growth"]
    return {"rate": rates[0], "served": x["requests_per_s"], "requests": x["requests"],
            "replications": x["replications"], "intervals_claimed": x["intervals_claimed"],
            "growth": g["slope"] if g else None, "past_saturation": bool(g and g["past_saturation"]),
            **x["ttft_s"]}


# What replays set side by side must share: everything but the cache policy, its budget and the
# arrivals. (config or engine, key, what the page calls it[, what an unset value means])
_SHARED: tuple[tuple[str, ...], ...] = (
    ("config", "model", "model"), ("config", "backend", "backend"), ("config", "max_new_tokens", "answer tokens"),
    ("config", "concurrency", "concurrency"), ("config", "schedule", "schedule"),
    ("config", "kv_space_bytes", "the engine's KV space for requests in flight, bytes (--kv-space)",
     "enough that none waits for space"),
    ("config", "engine_role", "the engine (an --engines table: a serving change)", "the command line's"),
    ("engine", "device", "device"), ("engine", "dtype", "dtype"), ("engine", "block_size", "KV block size"),
    ("engine", "max_prompt_tokens", "the engine's prompt limit (its max_model_len less the answer; vLLM "
                                    "chunks prefills by it)"))


def _differences(rows: list[dict[str, Any]], serving_change: bool = False) -> list[str]:
    """Each setting the rows differ in beyond the policy, budget and arrivals, with its values and
    the rows that had each (a TTFT difference between them is then not the policy's alone); the
    engine is not among them where every row ran on an engines file's table (``serving_change``)."""
    out = []
    for part, key, name, *unset in _SHARED:
        if key == "engine_role" and serving_change:  # the change itself: the page says so apart (_serving_change)
            continue
        by_value: dict[str, list[str]] = {}
        for r in rows:
            v = (r["summary"].get(part) or {}).get(key)
            by_value.setdefault((unset or ["not recorded"])[0] if v is None else f"{v:,}" if isinstance(v, int)
                                else str(v), []).append(r["label"])
        if len(by_value) > 1:
            out.append(f"{name}: " + "; ".join(
                f"{v} in {', '.join(labels[:3])}" + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")
                for v, labels in by_value.items()))
    return out


def _apart(rows: list[dict[str, Any]]) -> str | None:
    """Why the rows' latencies met different conditions, or None: served on different machines,
    more than an hour apart (:mod:`kvaudit.reports.sittings`), or not saying where and when
    (replays made before kvaudit recorded it)."""
    from kvaudit.reports.sittings import hours_apart

    served = [r["summary"].get("served") for r in rows]
    if len(rows) < 2:
        return None
    if any(not isinstance(s, dict) or not isinstance(s.get("host"), str) or not isinstance(s.get("finished_utc"), str)
           for s in served):
        return "some of these replays do not record where and when they were served"
    # a machine is its host name and, where recorded, its boot (leased machines share one name)
    machines = sorted({(s["host"], str(s.get("boot", ""))) for s in served})
    if len(machines) > 1:
        by_name = len({h for h, _ in machines}) == len(machines)  # the host names alone tell them apart
        named = [h if by_name else f"{h} boot {b or '?'}" for h, b in machines]
        return f"these replays were served on {len(machines)} machines ({', '.join(named)})"
    return hours_apart([s["finished_utc"] for s in served], "replays", "finished", "finishing")


def _tall_enough(height: float, legend_entries: int) -> float:
    """A figure's height that holds its legend beside it (one line of 8-point text each)."""
    return max(height, 0.8 + 0.16 * legend_entries)


def _load_svg(sweeps: list[dict[str, Any]], slo_ttft_s: float | None) -> str:
    """p95 TTFT (solid, its 95% interval as bars) and p50 (dashed) against offered load, per sweep."""
    with _rc():
        fig = _figure(10, _tall_enough(3.6, 2 * len(sweeps) + 1))
        ax = fig.add_subplot()
        for sw in sweeps:
            xs = [x["rate"] for x in sw["loads"]]
            p95 = [x["p95"]["value"] for x in sw["loads"]]
            lo = [x["p95"]["value"] - (x["p95"]["low"] if x["p95"]["low"] is not None else x["p95"]["value"])
                  for x in sw["loads"]]
            hi = [(x["p95"]["high"] if x["p95"]["high"] is not None else x["p95"]["value"]) - x["p95"]["value"]
                  for x in sw["loads"]]
            # bars only where the intervals hold: requests that queue make them too narrow
            bars = ax.errorbar(xs, p95, yerr=[lo, hi] if sw.get("intervals_claimed", True) else None, marker="o",
                               capsize=3, label=f"{sw['label']} p95")
            ax.plot(xs, [x["p50"]["value"] for x in sw["loads"]], linestyle="--", marker=".",
                    color=bars.lines[0].get_color(), label=f"{sw['label']} p50")
        if slo_ttft_s is not None:
            ax.axhline(slo_ttft_s, color="#cf222e", linewidth=1, label=f"SLO: p95 within {slo_ttft_s:g} s")
        ax.set_xlabel("offered load (requests per second)")
        ax.set_ylabel("TTFT (log scale)")
        ax.set_yscale("log")
        log_seconds(ax.yaxis)
        ax.set_title("Time to first token against offered load\n(bars: 95% interval of p95, where it holds: over "
                     "replications, or requests that do not queue)", fontsize=10, loc="left")
        ax.grid(color="#eeeeee")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        return _svg(fig)


def _length_svg(by_length: dict[str, list[dict[str, Any]]]) -> str:
    with _rc():
        fig = _figure(10, _tall_enough(3.2, len(by_length)))
        ax = fig.add_subplot()
        for label, bins in by_length.items():
            xs = [(b["tokens_low"] + b["tokens_high"]) / 2 for b in bins]
            ax.plot(xs, [b["ttft_p50_s"] for b in bins], marker="o", label=label)
        ax.set_xlabel("prompt tokens (bin middle)")
        ax.set_ylabel("median TTFT (log scale)")
        ax.set_yscale("log")
        log_seconds(ax.yaxis)
        ax.set_title("Time to first token against request length", fontsize=10, loc="left")
        ax.grid(color="#eeeeee")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        return _svg(fig)


def _over_time_svg(over_time: dict[str, tuple[list, list]]) -> str:
    with _rc():
        fig = _figure(10, _tall_enough(3.2, 2 * len(over_time)))
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
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the plot, never over its points
        return _svg(fig)


def render(comparison: dict[str, Any]) -> str:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined
    from markupsafe import Markup

    from kvaudit.reports.html import TEMPLATES

    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    return env.get_template(TEMPLATE).render(
        c=comparison, growth_limit=GROWTH_LIMIT, unclaimed_intervals=UNCLAIMED_INTERVALS, csp="default-src 'none'; style-src 'unsafe-inline'; img-src data:",
        ttft_plot=Markup(ttft_svg(comparison["ttft"], highlight="", unit="requests", what="replay",
                                  median_method="inverted_cdf")),
        length_plot=Markup(_length_svg(comparison["by_length"])),
        time_plot=Markup(_over_time_svg(comparison["over_time"])),
        load_plot=Markup(_load_svg(comparison["sweeps"], comparison["slo_ttft_s"])) if comparison["sweeps"] else "",
    )


def write(paths: Sequence[str | Path], out_dir: str | Path, slo_ttft_s: float | None = None) -> tuple[Path, Path]:
    """Write ``replays.json`` and ``replays.html`` into ``out_dir``."""
    comparison = build(paths, slo_ttft_s)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out / REPLAYS_JSON, out / REPLAYS_HTML
    write_json(json_path, {k: comparison[k] for k in ("rows", "same_workload", "differences", "sweeps", "slo_ttft_s",
                                                        "against")})
    write_atomic(html_path, render(comparison))
    return json_path, html_path

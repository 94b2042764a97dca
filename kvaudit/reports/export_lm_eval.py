"""The lm-evaluation-harness exporter (``kvaudit export RUN --format lm-eval --out PATH``).

It writes lm-evaluation-harness's output layout under the folder ``PATH``:
``PATH/<model>/results_<time>.json`` (``results``, ``groups``, ``group_subtasks``, ``configs``,
``versions``, ``n-shot``, ``higher_is_better``, ``n-samples``, ``config``, ``task_hashes``, ...,
the keys lm-eval's ``EvaluationTracker.save_results_aggregated`` writes) next to one
``samples_<task>_<time>.jsonl`` per task family. Each arm is an lm-eval *filter*: metric keys
read ``score,reuse``, and a sample line is written per case and arm. The rows come from
:func:`kvaudit.reports.export.sample_rows`, the same as ``RUN/samples.jsonl``. ``<time>`` is the
run's last recorded session time, so exporting the same run twice writes the same file names.
It needs nothing of lm-eval.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kvaudit.core.errors import KvauditError
from kvaudit.core.manifest import DatasetRef
from kvaudit.reports.export import (
    SCORE_KEYS,
    arm_means,
    identity_values,
    model_and_backend,
    number,
    run_dtype,
    run_times,
    sample_rows,
)


def _lm_hash(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8")).hexdigest()  # lm_eval.utils.hash_string


MAX_NAME = 100  # bytes of a task or model name in a file name (a file name holds 255)


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _fit(name: str, original: str) -> str:
    """``name``, cut to :data:`MAX_NAME` bytes with a hash of ``original`` when it is longer."""
    if len(name.encode()) <= MAX_NAME:
        return name
    return name.encode()[: MAX_NAME - 9].decode("utf-8", "ignore") + "_" + _short_hash(original)


def sanitize_model_name(name: str) -> str:
    """lm-eval's ``sanitize_model_name`` (the folder its results go in), also replacing control
    characters and cut to a length a folder name can have; never ``.`` or ``..``."""
    clean = re.sub(r"[\"<>:/|\\?*\[\]\x00-\x1f\x7f]+", "__", name)
    return _fit(clean, name) if clean.strip(".") else f"model_{_short_hash(name)}"


def task_names(tasks: list[str]) -> dict[str, str]:
    """Each task's lm-eval name, ``kvaudit_`` and the task as lm-eval's ``sanitize_task_name``
    writes it, all distinct (also where a file system ignores case): a name sanitising makes
    alike for several tasks keeps the plain form only for the task already in that form, the
    others get a hash of their own name; a name too long for a file name is cut, with the hash."""
    base = {t: _fit("kvaudit_" + re.sub(r"\W", "_", t), t) for t in tasks}
    alike: dict[str, list[str]] = {}
    for t in sorted(tasks):
        alike.setdefault(base[t].casefold(), []).append(t)
    names = {}
    for group in alike.values():
        plain = [t for t in group if base[t] == "kvaudit_" + t]
        keep = group[0] if len(group) == 1 else plain[0] if plain else None
        names.update({t: base[t] if t == keep else _fit(f"{base[t]}_{_short_hash(t)}", t) for t in group})
    if len({n.casefold() for n in names.values()}) < len(names):  # a hash that meets another name
        raise KvauditError("--format lm-eval: two task names of the run map to one lm-eval task "
                           "name; nothing was written")
    return names


HIGHER_IS_BETTER = {"score": True, "delta_pts": True, "delta_lower_bound_pts": True}


def _samples(an: Any, rows: list[dict[str, Any]], lm_name: dict[str, str],
             decoding: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """One lm-eval sample line per answer-quality case and arm (the arm as lm-eval's filter), per task."""
    quality = set(an.select("overall")) | set(an.select("agreement"))
    questions = an.run.questions
    samples: dict[str, list[dict[str, Any]]] = {}
    doc_ids: dict[str, int] = {}
    for row in rows:
        if row["doc_id"] not in quality:
            continue  # leak probes: not answer-quality cases
        t = lm_name[row["task"]]
        doc_id = doc_ids[t] = doc_ids.get(t, -1) + 1
        target = row["target"][0] if len(row["target"]) == 1 else str(row["target"])
        question = questions.get(row["doc_id"], "")
        for arm in [a for a in an.arms if a in row["resps"]]:
            m = row["metrics"].get(arm, {})
            line: dict[str, Any] = {
                "doc_id": doc_id,
                "doc": {"case_id": row["doc_id"], "question": question, "task": row["task"],
                        "metric": row["metric"], "answers": row["target"], "strata": row["strata"]},
                "target": target,
                "arguments": {"gen_args_0": {"arg_0": question, "arg_1": decoding}},
                "resps": [[row["resps"][arm]]], "filtered_resps": [row["filtered_resps"][arm]],
                "filter": arm, "metrics": [k for k in SCORE_KEYS if number(m.get(k)) is not None],
                "doc_hash": row["doc_hash"], "prompt_hash": row["prompt_hash"],
                "target_hash": row["target_hash"],
            }
            line.update({k: number(m.get(k)) for k in line["metrics"]})
            if row["flips"].get(arm) is not None:
                line["flip"] = float(row["flips"][arm])
            samples.setdefault(t, []).append(line)
    return samples


def _metrics_of(an: Any, group: str, label: str, n: int) -> dict[str, Any]:
    """A results entry: per arm its mean score and standard error, and (past the reference) its
    delta and the delta's lower bound, in points."""
    means = arm_means(an, group)
    r: dict[str, Any] = {"alias": label, "name": label, "sample_len": n}
    for arm in an.arms:
        if not means[arm]["n"]:
            continue
        r[f"score,{arm}"] = means[arm]["mean"]
        r[f"score_stderr,{arm}"] = means[arm]["stderr"] if means[arm]["stderr"] is not None else "N/A"
        if arm != an.arms[0]:
            d = an.delta(arm, group)
            if d.delta is not None:
                r[f"delta_pts,{arm}"] = d.delta
            if d.lower_bound is not None:
                r[f"delta_lower_bound_pts,{arm}"] = d.lower_bound
    return r


def _task_config(an: Any, task: str, t: str, dataset: DatasetRef, decoding: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's task config for one task family, each arm a filter."""
    return {
        "task": t, "tag": ["kvaudit"], "dataset_path": str(dataset.path or ""),
        "output_type": "generate_until", "num_fewshot": 0, "repeats": 1,
        "generation_kwargs": decoding,
        "metric_list": [{"metric": k, "aggregation": "mean", "higher_is_better": v}
                        for k, v in HIGHER_IS_BETTER.items()],
        "filter_list": [{"name": arm, "filter": [{"function": "kvaudit_arm", "arm": arm}]}
                        for arm in an.arms],
        "description": f"kvaudit task family {task!r}: each filter is an arm of the run",
        "metadata": {"version": 1.0, "kvaudit_dataset_hash": dataset.hash},
    }


def _run_config(an: Any, manifest: Any, name: str, backend: str, decoding: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's ``config`` block: the model and how it was run."""
    return {
        "model": f"kvaudit-{backend}", "model_args": f"pretrained={name},dtype={run_dtype(manifest)}",
        "model_dtype": run_dtype(manifest), "model_sha": manifest.model.fingerprint if manifest.model else None,
        "batch_size": 1, "batch_sizes": [], "device": (manifest.backend or {}).get("device"),
        "use_cache": None, "limit": None, "bootstrap_iters": 0, "gen_kwargs": decoding,
        "random_seed": None, "numpy_seed": None, "torch_seed": None, "fewshot_seed": None,
        "kvaudit_arms": an.arms,
    }


def lm_eval_export(an: Any) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]], str]:
    """``(results, samples per lm-eval task, date id)`` in lm-eval's layout (see module docstring)."""
    from kvaudit import __version__

    manifest = an.run.manifest
    name, backend = model_and_backend(manifest)
    _, last = run_times(manifest)
    when = (last or datetime.now(timezone.utc)).replace(tzinfo=None)
    date_id = when.isoformat().replace(":", "-")  # as EvaluationTracker names its files
    decoding = manifest.decoding or {}
    dataset = manifest.dataset or DatasetRef()
    rows = sample_rows(an)
    lm_name = task_names(list(dict.fromkeys([*an.tasks, *(r["task"] for r in rows)])))
    samples = _samples(an, rows, lm_name, decoding)
    results: dict[str, dict[str, Any]] = {}
    higher: dict[str, dict[str, bool]] = {}
    n_samples: dict[str, dict[str, int]] = {}
    configs: dict[str, dict[str, Any]] = {}
    for task in an.tasks:
        t = lm_name[task]
        n = len(set(an.select(f"task:{task}")))
        results[t] = _metrics_of(an, f"task:{task}", t, n)
        higher[t] = dict(HIGHER_IS_BETTER)
        n_samples[t] = {"original": n, "effective": n}
        configs[t] = _task_config(an, task, t, dataset, decoding)
    gold_tasks = [lm_name[t] for t in an.tasks if len(set(an.select(f"task:{t}")) - set(an.select("agreement")))]
    groups = {}
    if gold_tasks:
        groups["kvaudit"] = _metrics_of(an, "overall", "kvaudit", len(set(an.select("overall"))))
        higher["kvaudit"] = dict(HIGHER_IS_BETTER)
    ident = identity_values(manifest)
    timing = number((manifest.timing_s or {}).get("total"))
    out: dict[str, Any] = {
        "results": {**groups, **results},
        **({"groups": groups} if groups else {}),
        "group_subtasks": {**({"kvaudit": gold_tasks} if gold_tasks else {}),
                           **{t: [] for t in results}},
        "configs": dict(sorted(configs.items())),
        "versions": {**({"kvaudit": 1.0} if gold_tasks else {}), **{t: 1.0 for t in sorted(results)}},
        "n-shot": {**({"kvaudit": 0} if gold_tasks else {}), **{t: 0 for t in sorted(results)}},
        "higher_is_better": dict(sorted(higher.items())),
        "n-samples": n_samples,
        "config": _run_config(an, manifest, name, backend, decoding),
        "git_hash": (manifest.git_revision or "")[:7] or None,
        "date": when.replace(tzinfo=timezone.utc).timestamp(),
        "transformers_version": ident.get("transformers"),
        "kvaudit_version": str(manifest.kvaudit_version or __version__),
        "model_source": f"kvaudit-{backend}", "model_name": name,
        "model_name_sanitized": sanitize_model_name(name),
        "system_instruction": None, "system_instruction_sha": None, "fewshot_as_multiturn": False,
        "chat_template": None, "chat_template_sha": None,
        "task_hashes": {t: _lm_hash("".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"]
                                            for s in lines)) for t, lines in samples.items()},
        "total_evaluation_time_seconds": str(timing) if timing is not None else None,
    }
    return out, samples, date_id


def write_lm_eval(an: Any, out: str | Path) -> list[Path]:
    """Write ``OUT/<model>/results_<time>.json`` and one ``samples_<task>_<time>.jsonl`` per task,
    all of them or, when a write fails, none (and no folder made for them)."""
    from kvaudit.core.jsonio import write_all

    results, samples, date_id = lm_eval_export(an)
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise KvauditError(f"{folder}: --format lm-eval writes a folder; this is a file")
    folder = folder / results["model_name_sanitized"]
    files = {folder / f"results_{date_id}.json": json.dumps(results, indent=2, ensure_ascii=False, default=str)}
    for task, rows in samples.items():
        files[folder / f"samples_{task}_{date_id}.jsonl"] = "".join(
            json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows)
    write_all(files)
    return list(files)

"""Export a run as logs other tools read (``kvaudit export RUN --format inspect|lm-eval --out PATH``).

``--format inspect`` writes one inspect-ai eval log, built with inspect-ai's own typed classes
(:mod:`inspect_ai.log`) and written by its ``write_eval_log``, so ``read_eval_log`` and
``inspect view`` open it:

- the eval spec is the run's configuration: model ``<backend>/<model>``, the model fingerprint,
  dtype and backend as ``model_args``, the arms, decoding and dataset hash as ``task_args``, the
  git revision, library versions, and the whole ``manifest.json`` under ``metadata``;
- one sample per case: the question (when the run's dataset is still on disk), the recompute
  answer as the output, and one score per arm (``value`` the case's score under its metric,
  ``answer`` that arm's answer, flip/logit-difference/TTFT/reused tokens in its ``metadata``);
  every arm's answer is also under the sample's ``metadata["arms"]``; leak probes carry answers
  but no scores (they are not answer-quality cases);
- the results hold one score per arm with the report's metrics over the ``overall`` group
  (mean score, delta against recompute with its bound, flip rate, hit rate, TTFT, speed-up).

``PATH`` ending in ``.eval`` or ``.json`` is the log file (that format); any other ``PATH`` is a
folder that gets ``<created>_<task>_<id>.eval``, the name inspect gives its logs.

``--format lm-eval`` writes lm-evaluation-harness's output layout under the folder ``PATH``:
``PATH/<model>/results_<time>.json`` (``results``, ``groups``, ``group_subtasks``, ``configs``,
``versions``, ``n-shot``, ``higher_is_better``, ``n-samples``, ``config``, ``task_hashes``, ...,
the keys lm-eval's ``EvaluationTracker.save_results_aggregated`` writes) next to one
``samples_<task>_<time>.jsonl`` per task family. Each arm is an lm-eval *filter*: metric keys
read ``score,reuse``, and a sample line is written per case and arm. The rows come from
:func:`kvaudit.reports.export.sample_rows`, the same as ``RUN/samples.jsonl``. ``<time>`` is the
run's last recorded session time, so exporting the same run twice writes the same file names.
Neither format needs anything of lm-eval; ``inspect`` needs the ``inspect`` extra.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kvaudit.core.arms import REFERENCE_ARM
from kvaudit.core.errors import KvauditError
from kvaudit.core.manifest import DatasetRef, Manifest

FORMATS = ("inspect", "lm-eval")
INSPECT_HINT = "pip install 'kvaudit[inspect]' (or: pip install inspect-ai)"
SCORE_KEYS = ("score", "em", "f1", "rouge_l", "contains")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="run directory (manifest.json, pairs.jsonl)")
    parser.add_argument("--format", required=True, choices=FORMATS,
                        help="inspect: an inspect-ai eval log; lm-eval: lm-evaluation-harness "
                             "results_<time>.json and samples_<task>_<time>.jsonl")
    parser.add_argument("--out", required=True, metavar="PATH",
                        help="inspect: a .eval/.json file or a folder; lm-eval: a folder")
    parser.add_argument("--policy", metavar="FILE",
                        help="gate policy TOML for the arm and confidence (default: the shipped policy)")
    parser.add_argument("--near-tie", type=float, default=1.0, metavar="LOGITS",
                        help="recompute first-token margins below this count as near ties (default 1.0)")


# --------------------------------------------------------------------------- shared


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _times(manifest: Manifest) -> tuple[datetime | None, datetime | None]:
    """The first session's start and the last recorded session time, in UTC."""
    stamps: list[datetime] = []
    for s in manifest.sessions:
        for v in (s.started, s.finished):
            try:
                stamps.append(datetime.strptime(str(v), "%Y-%m-%dT%H:%M:%S%z").astimezone(timezone.utc))
            except ValueError:
                continue
    return (stamps[0], stamps[-1]) if stamps else (None, None)


def _model(manifest: Manifest) -> tuple[str, str]:
    """``(model name, backend)`` as the manifest records them."""
    ident = manifest.identity
    name = (manifest.model.name if manifest.model else None) or (ident.model if ident else None) or "unknown"
    backend = (manifest.backend or {}).get("backend") or (ident.backend if ident else None) or "unknown"
    return str(name), str(backend)


def _dtype(manifest: Manifest) -> str | None:
    """The run's dtype (a top-level ``dtype`` is what synthetic runs recorded before the manifest
    had a format)."""
    dtype = manifest.extra.get("dtype") or (manifest.model.dtype if manifest.model else None)
    return None if dtype is None else str(dtype)


def _versions(manifest: Manifest) -> dict[str, Any]:
    """The identity's recorded values (``{}`` when the manifest has no identity)."""
    return {k: v for k, v in manifest.identity.values().items() if v is not None} if manifest.identity else {}


def _arm_means(an: Any, group: str = "overall") -> dict[str, dict[str, Any]]:
    """Per arm: mean score, its standard error and n over ``group``'s cases the arm ran."""
    ids = set(an.select(group))
    out = {}
    for arm in an.arms:
        vals = [v for v in (_num(an.rows[(c, arm)]["score"]) for c in ids if (c, arm) in an.rows)
                if v is not None]
        n = len(vals)
        mean = sum(vals) / n if n else None
        se = (math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1) / n) if n > 1 else None)
        out[arm] = {"n": n, "mean": mean, "stderr": se}
    return out


def arm_metrics(an: Any) -> dict[str, dict[str, float]]:
    """The report's per-arm numbers over ``overall``: mean score (0-1) and its SE, then for each
    compared arm the paired delta against recompute and its bounds (points), flip rate, token
    hit rate, median TTFT (s) and TTFT speed-up (ratio of medians). ``None`` values are left out."""
    means = _arm_means(an)
    out: dict[str, dict[str, float]] = {}
    for arm in an.arms:
        m: dict[str, Any] = {"mean": means[arm]["mean"], "stderr": means[arm]["stderr"],
                             "n": means[arm]["n"]}
        if arm != an.arms[0]:
            d = an.delta(arm)
            m.update(delta_pts=d.get("delta"), delta_lower_bound_pts=d.get("lower_bound"),
                     delta_upper_bound_pts=d.get("upper_bound"))
            flips = an.flips(arm)
            m["flip_rate"] = flips["rate"] if flips else None
            sp = an.speedup(arm)
            m["ttft_speedup"] = sp["ratio_of_medians"] if sp else None
        m["hit_rate"] = an.hit_rate(arm)
        t = an.ttft(arm)
        m["ttft_p50_s"] = t["p50"] if t else None
        out[arm] = {k: float(v) for k, v in m.items() if _num(v) is not None}
    return out


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


# --------------------------------------------------------------------------- inspect-ai


def _need_inspect() -> Any:
    try:
        import inspect_ai.log as log
        import inspect_ai.model as model
        import inspect_ai.scorer as scorer
    except ImportError as e:
        raise KvauditError(f"--format inspect needs inspect-ai, which is not installed ({e}); "
                           f"{INSPECT_HINT}") from None
    return log, model, scorer


def build_inspect_log(an: Any) -> Any:
    """The run as an :class:`inspect_ai.log.EvalLog` (see the module docstring)."""
    log, model_mod, scorer = _need_inspect()
    from kvaudit import __version__
    from kvaudit.reports.export import sample_rows

    run, manifest = an.run, an.run.manifest
    name, backend = _model(manifest)
    model = f"{backend}/{name}"
    started, last = _times(manifest)
    created = (started or datetime.now(timezone.utc)).isoformat()
    dataset = manifest.dataset or DatasetRef()
    # no "_" in the task: inspect reads the task back from the file name <created>_<task>_<id>
    task = "kvaudit-" + re.sub(r"[\W_]+", "-", str(dataset.generator or dataset.name or "run"))
    decoding = manifest.decoding or {}
    ident = _digest(manifest.identity.to_dict() if manifest.identity else None, [p.case_id for p in run.pairs])
    gen = {"max_tokens": decoding.get("max_new_tokens")}
    if decoding.get("strategy") == "greedy" or decoding.get("greedy"):
        gen["temperature"] = 0.0
    versions = {k: str(v) for k, v in _versions(manifest).items() if k in ("torch", "transformers", "vllm")}
    spec = log.EvalSpec(
        eval_id=ident[:22], run_id=ident[22:44], task_id=ident[44:64], created=created, task=task,
        task_version=1, task_display_name=f"kvaudit {dataset.generator or 'run'}",
        task_description="paired full recompute vs non-prefix KV reuse on the same token ids",
        task_args={"arms": an.arms, "decoding": decoding, "dataset_hash": dataset.hash,
                   "dataset_path": dataset.path},
        solver="kvaudit", dataset=log.EvalDataset(
            name=str(dataset.generator or dataset.name or "dataset"),
            location=str(dataset.path or ""), samples=len(run.pairs),
            sample_ids=[p.case_id for p in run.pairs]),
        model=model, model_generate_config=model_mod.GenerateConfig(
            **{k: v for k, v in gen.items() if v is not None}),
        model_args={"fingerprint": manifest.model.fingerprint if manifest.model else None,
                    "dtype": _dtype(manifest), "backend": manifest.backend},
        config=log.EvalConfig(epochs=1, log_samples=True),
        revision=(log.EvalRevision(type="git", origin="", commit=manifest.git_revision)
                  if manifest.git_revision else None),
        packages={"kvaudit": str(manifest.kvaudit_version or __version__), **versions},
        metadata={"kvaudit_manifest": manifest.to_dict(), "audit": {"state": run.audit.state,
                                                          "verdict": run.audit.verdict,
                                                          "reason": run.audit.reason}},
    )
    samples = []
    for row, p in zip(sample_rows(an), run.pairs, strict=True):
        arms: dict[str, dict[str, Any]] = {}
        scores = {}
        for arm_name in [a for a in an.arms if a in p.arms]:
            a = p.arms[arm_name]
            extra = {"flip": row["flips"].get(arm_name), "logit_diff": row["logit_diff"].get(arm_name),
                     "ttft_s": a.ttft_s, "tokens_reused": a.tokens_reused,
                     "tokens_computed": a.tokens_computed, "margin": a.margin}
            arms[arm_name] = {"answer": a.answer, **extra,
                              "metrics": row["metrics"].get(arm_name, {})}
            value = _num(row["metrics"].get(arm_name, {}).get("score"))
            if value is not None:
                scores[arm_name] = scorer.Score(
                    value=value, answer=a.answer, metadata=extra,
                    explanation=f"{p.metric} against {'the recompute answer' if p.metric == 'agreement' else 'the gold answer'}")
        question = run.questions.get(p.case_id) or f"(case {p.case_id}: question not in the run's records)"
        ref = p.arms[REFERENCE_ARM].answer
        target = row["target"]
        samples.append(log.EvalSample(
            id=p.case_id, epoch=1, input=question, target=target if len(target) != 1 else target[0],
            messages=[model_mod.ChatMessageUser(content=question),
                      model_mod.ChatMessageAssistant(content=ref, model=model)],
            output=model_mod.ModelOutput.from_content(model, ref), scores=scores or None,
            metadata={"task": p.task, "metric": p.metric, "strata": p.strata,
                      "segment_ids": p.segment_ids, "prompt_hash": p.ids_hash,
                      "n_prompt_tokens": p.n_prompt_tokens, "arms": arms},
        ))
    per_arm = arm_metrics(an)
    means = {t: _arm_means(an, f"task:{t}") for t in an.tasks}
    results = log.EvalResults(
        total_samples=max(run.n_expected or 0, len(run.pairs)), completed_samples=len(run.pairs),
        scores=[log.EvalScore(
            name=arm, scorer=arm, scored_samples=int(m.get("n", 0)),
            metrics={k: log.EvalMetric(name=k, value=v) for k, v in m.items() if k != "n"},
            metadata={"group": "overall", "per_task_mean": {t: means[t][arm]["mean"] for t in an.tasks}},
        ) for arm, m in per_arm.items()],
    )
    status = {"complete": "success", "partial": "cancelled"}.get(str(manifest.status), "started")
    stats = log.EvalStats(started_at=(started.isoformat() if started else created),
                          completed_at=(last or started).isoformat() if started else created)
    plan = log.EvalPlan(name="kvaudit", steps=[
        log.EvalPlanStep(solver=arm, params={"why": str((manifest.arm_reasons or {}).get(arm) or "")})
        for arm in an.arms])
    return log.EvalLog(status=status, eval=spec, plan=plan, results=results, stats=stats,
                       samples=samples)


def inspect_log_name(ev: Any) -> str:
    """``<created>_<task>_<id>.eval``, the file name inspect gives a log."""
    clean = re.sub(r"[^\w.+-]", "-", ev.eval.created)
    return f"{clean}_{ev.eval.task}_{ev.eval.task_id}.eval"


def write_inspect(an: Any, out: str | Path) -> Path:
    """Write the inspect-ai log to ``out`` (a ``.eval``/``.json`` file, or a folder)."""
    log, _, _ = _need_inspect()
    ev = build_inspect_log(an)
    path = Path(out)
    if path.suffix not in (".eval", ".json"):
        if path.exists() and not path.is_dir():
            raise KvauditError(f"{path}: exists and is not a folder (or name a .eval/.json file)")
        path.mkdir(parents=True, exist_ok=True)
        path = path / inspect_log_name(ev)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    log.write_eval_log(ev, str(path), format="json" if path.suffix == ".json" else "eval")
    return path


# --------------------------------------------------------------------------- lm-evaluation-harness


def _lm_hash(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8")).hexdigest()  # lm_eval.utils.hash_string


def sanitize_model_name(name: str) -> str:
    """lm-eval's ``sanitize_model_name`` (the folder its results go in)."""
    return re.sub(r"[\"<>:/|\\?*\[\]]+", "__", name)


def _task_name(task: str) -> str:
    return "kvaudit_" + re.sub(r"\W", "_", task)  # lm-eval's sanitize_task_name


def lm_eval_export(an: Any) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]], str]:
    """``(results, samples per lm-eval task, date id)`` in lm-eval's layout (see module docstring)."""
    from kvaudit import __version__
    from kvaudit.reports.export import sample_rows

    manifest = an.run.manifest
    name, backend = _model(manifest)
    _, last = _times(manifest)
    when = (last or datetime.now(timezone.utc)).replace(tzinfo=None)
    date_id = when.isoformat().replace(":", "-")  # as EvaluationTracker names its files
    decoding = manifest.decoding or {}
    dataset = manifest.dataset or DatasetRef()
    quality = set(an.select("overall")) | set(an.select("agreement"))
    questions = an.run.questions
    samples: dict[str, list[dict[str, Any]]] = {}
    doc_ids: dict[str, int] = {}
    for row in sample_rows(an):
        if row["doc_id"] not in quality:
            continue  # leak probes: not answer-quality cases
        t = _task_name(row["task"])
        doc_id = doc_ids[t] = doc_ids.get(t, -1) + 1
        target = row["target"][0] if len(row["target"]) == 1 else str(row["target"])
        question = questions.get(row["doc_id"], "")
        for arm in [a for a in an.arms if a in row["resps"]]:
            answer = row["resps"][arm]
            m = row["metrics"].get(arm, {})
            line: dict[str, Any] = {
                "doc_id": doc_id,
                "doc": {"case_id": row["doc_id"], "question": question, "task": row["task"],
                        "metric": row["metric"], "answers": row["target"], "strata": row["strata"]},
                "target": target,
                "arguments": {"gen_args_0": {"arg_0": question, "arg_1": decoding}},
                "resps": [[answer]], "filtered_resps": [row["filtered_resps"][arm]],
                "filter": arm, "metrics": [k for k in SCORE_KEYS if _num(m.get(k)) is not None],
                "doc_hash": row["doc_hash"], "prompt_hash": row["prompt_hash"],
                "target_hash": row["target_hash"],
            }
            line.update({k: _num(m.get(k)) for k in line["metrics"]})
            if row["flips"].get(arm) is not None:
                line["flip"] = float(row["flips"][arm])
            samples.setdefault(t, []).append(line)

    results: dict[str, dict[str, Any]] = {}
    higher: dict[str, dict[str, bool]] = {}
    n_samples: dict[str, dict[str, int]] = {}
    configs: dict[str, dict[str, Any]] = {}

    def metrics_of(group: str, label: str, n: int) -> dict[str, Any]:
        means = _arm_means(an, group)
        r: dict[str, Any] = {"alias": label, "name": label, "sample_len": n}
        for arm in an.arms:
            if not means[arm]["n"]:
                continue
            r[f"score,{arm}"] = means[arm]["mean"]
            r[f"score_stderr,{arm}"] = means[arm]["stderr"] if means[arm]["stderr"] is not None else "N/A"
            if arm != an.arms[0]:
                d = an.delta(arm, group)
                if d.get("delta") is not None:
                    r[f"delta_pts,{arm}"] = d["delta"]
                if d.get("lower_bound") is not None:
                    r[f"delta_lower_bound_pts,{arm}"] = d["lower_bound"]
        return r

    hib = {"score": True, "delta_pts": True, "delta_lower_bound_pts": True}
    for task in an.tasks:
        t = _task_name(task)
        n = len(set(an.select(f"task:{task}")))
        results[t] = metrics_of(f"task:{task}", t, n)
        higher[t] = dict(hib)
        n_samples[t] = {"original": n, "effective": n}
        configs[t] = {
            "task": t, "tag": ["kvaudit"], "dataset_path": str(dataset.path or ""),
            "output_type": "generate_until", "num_fewshot": 0, "repeats": 1,
            "generation_kwargs": decoding,
            "metric_list": [{"metric": k, "aggregation": "mean", "higher_is_better": v}
                            for k, v in hib.items()],
            "filter_list": [{"name": arm, "filter": [{"function": "kvaudit_arm", "arm": arm}]}
                            for arm in an.arms],
            "description": f"kvaudit task family {task!r}: each filter is an arm of the run",
            "metadata": {"version": 1.0, "kvaudit_dataset_hash": dataset.hash},
        }
    gold_tasks = [_task_name(t) for t in an.tasks if len(set(an.select(f"task:{t}")) - set(an.select("agreement")))]
    groups = {}
    if gold_tasks:
        groups["kvaudit"] = metrics_of("overall", "kvaudit", len(set(an.select("overall"))))
        higher["kvaudit"] = dict(hib)
    ident = _versions(manifest)
    timing = _num((manifest.timing_s or {}).get("total"))
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
        "config": {
            "model": f"kvaudit-{backend}", "model_args": f"pretrained={name},dtype={_dtype(manifest)}",
            "model_dtype": _dtype(manifest), "model_sha": manifest.model.fingerprint if manifest.model else None,
            "batch_size": 1, "batch_sizes": [], "device": (manifest.backend or {}).get("device"),
            "use_cache": None, "limit": None, "bootstrap_iters": 0, "gen_kwargs": decoding,
            "random_seed": None, "numpy_seed": None, "torch_seed": None, "fewshot_seed": None,
            "kvaudit_arms": an.arms,
        },
        "git_hash": (manifest.git_revision or "")[:7] or None,
        "date": when.replace(tzinfo=timezone.utc).timestamp(),
        "transformers_version": ident.get("transformers"),
        "kvaudit_version": str(manifest.kvaudit_version or __version__),
        "model_source": f"kvaudit-{backend}", "model_name": name,
        "model_name_sanitized": sanitize_model_name(name),
        "system_instruction": None, "system_instruction_sha": None, "fewshot_as_multiturn": False,
        "chat_template": None, "chat_template_sha": None,
        "task_hashes": {t: _lm_hash("".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"]
                                            for s in rows)) for t, rows in samples.items()},
        "total_evaluation_time_seconds": str(timing) if timing is not None else None,
    }
    return out, samples, date_id


def write_lm_eval(an: Any, out: str | Path) -> list[Path]:
    """Write ``OUT/<model>/results_<time>.json`` and one ``samples_<task>_<time>.jsonl`` per task."""
    from kvaudit.core.jsonio import write_atomic

    results, samples, date_id = lm_eval_export(an)
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise KvauditError(f"{folder}: --format lm-eval writes a folder; this is a file")
    folder = folder / results["model_name_sanitized"]
    paths = [folder / f"results_{date_id}.json"]
    write_atomic(paths[0], json.dumps(results, indent=2, ensure_ascii=False, default=str))
    for task, rows in samples.items():
        path = folder / f"samples_{task}_{date_id}.jsonl"
        write_atomic(path, "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows))
        paths.append(path)
    return paths


# --------------------------------------------------------------------------- CLI


def run(args: argparse.Namespace) -> int:
    from kvaudit.reports.analysis import Analysis, load_run
    from kvaudit.reports.policy import load_policy

    if args.format == "inspect":
        _need_inspect()  # before reading the run: a missing extra is the first thing to say
    policy = load_policy(args.policy)
    an = Analysis(load_run(args.run_dir), near_tie=args.near_tie, confidence=policy.confidence,
                  min_icc=policy.min_icc)
    if args.format == "inspect":
        path = write_inspect(an, args.out)
        print(f"wrote {path} ({len(an.run.pairs)} samples, {len(an.arms)} arms); "
              f"open it with: inspect view --log-dir {path.parent}")
    else:
        paths = write_lm_eval(an, args.out)
        print(f"wrote {paths[0]} and {len(paths) - 1} samples file(s) beside it")
    return 0

"""The inspect-ai exporter (``kvaudit export RUN --format inspect --out PATH``).

It writes one inspect-ai eval log, built with inspect-ai's own typed classes
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
folder that gets ``<created>_<task>_<id>.eval``, the name inspect gives its logs. It needs the
``inspect`` extra (:data:`INSPECT_HINT`).
"""

from __future__ import annotations

import gc
import hashlib
import os
import re
import secrets
import sys
import tempfile
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kvaudit.core.arms import REFERENCE_ARM
from kvaudit.core.errors import KvauditError
from kvaudit.core.manifest import DatasetRef
from kvaudit.reports.export import (
    arm_means,
    arm_metrics,
    digest,
    identity_values,
    model_and_backend,
    number,
    run_dtype,
    run_times,
    sample_rows,
)

INSPECT_HINT = "pip install 'kvaudit[inspect]' (or: pip install inspect-ai)"


def need_inspect() -> Any:
    """inspect-ai's ``log``, ``model`` and ``scorer`` modules; a :class:`KvauditError` naming the
    extra to install when inspect-ai is missing."""
    try:
        import inspect_ai.log as log
        import inspect_ai.model as model
        import inspect_ai.scorer as scorer
    except ImportError as e:
        raise KvauditError(f"--format inspect needs inspect-ai, which is not installed ({e}); "
                           f"{INSPECT_HINT}") from None
    return log, model, scorer


def _sample(an: Any, row: dict[str, Any], p: Any, model: str, log: Any, model_mod: Any, scorer: Any) -> Any:
    """One case as an inspect sample: the reference's answer as its output, every arm's answer,
    metrics and timing in its metadata, each arm's score a score."""
    arms: dict[str, dict[str, Any]] = {}
    scores = {}
    for arm_name in [a for a in an.arms if a in p.arms]:
        a = p.arms[arm_name]
        extra = {"flip": row["flips"].get(arm_name), "logit_diff": row["logit_diff"].get(arm_name),
                 "ttft_s": a.ttft_s, "tokens_reused": a.tokens_reused,
                 "tokens_computed": a.tokens_computed, "margin": a.margin}
        arms[arm_name] = {"answer": a.answer, **extra,
                          "metrics": row["metrics"].get(arm_name, {})}
        value = number(row["metrics"].get(arm_name, {}).get("score"))
        if value is not None:
            scores[arm_name] = scorer.Score(
                value=value, answer=a.answer, metadata=extra,
                explanation=f"{p.metric} against {'the recompute answer' if p.metric == 'agreement' else 'the gold answer'}")
    question = an.run.questions.get(p.case_id) or f"(case {p.case_id}: question not in the run's records)"
    ref = p.arms[REFERENCE_ARM].answer
    target = row["target"]
    return log.EvalSample(
        id=p.case_id, epoch=1, input=question, target=target if len(target) != 1 else target[0],
        messages=[model_mod.ChatMessageUser(content=question),
                  model_mod.ChatMessageAssistant(content=ref, model=model)],
        output=model_mod.ModelOutput.from_content(model, ref), scores=scores or None,
        metadata={"task": p.task, "metric": p.metric, "strata": p.strata,
                  "segment_ids": p.segment_ids, "prompt_hash": p.ids_hash,
                  "n_prompt_tokens": p.n_prompt_tokens, "arms": arms},
    )


def build_inspect_log(an: Any) -> Any:
    """The run as an :class:`inspect_ai.log.EvalLog` (see the module docstring)."""
    log, model_mod, scorer = need_inspect()
    from kvaudit import __version__

    run, manifest = an.run, an.run.manifest
    name, backend = model_and_backend(manifest)
    model = f"{backend}/{name}"
    started, last = run_times(manifest)
    created = (started or datetime.now(timezone.utc)).isoformat()
    dataset = manifest.dataset or DatasetRef()
    # no "_" in the task: inspect reads the task back from the file name <created>_<task>_<id>
    task = _task_name(str(dataset.generator or dataset.name or "run"))
    decoding = manifest.decoding or {}
    ident = digest(manifest.identity.to_dict() if manifest.identity else None, [p.case_id for p in run.pairs])
    gen = {"max_tokens": decoding.get("max_new_tokens")}
    if decoding.get("strategy") == "greedy" or decoding.get("greedy"):
        gen["temperature"] = 0.0
    versions = {k: str(v) for k, v in identity_values(manifest).items() if k in ("torch", "transformers", "vllm")}
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
                    "dtype": run_dtype(manifest), "backend": manifest.backend},
        config=log.EvalConfig(epochs=1, log_samples=True),
        revision=(log.EvalRevision(type="git", origin="", commit=manifest.git_revision)
                  if manifest.git_revision else None),
        packages={"kvaudit": str(manifest.kvaudit_version or __version__), **versions},
        metadata={"kvaudit_manifest": manifest.to_dict(), "audit": {"state": run.audit.state,
                                                          "verdict": run.audit.verdict,
                                                          "reason": run.audit.reason}},
    )
    samples = [_sample(an, row, p, model, log, model_mod, scorer) for row, p in zip(sample_rows(an), run.pairs, strict=True)]
    per_arm = arm_metrics(an)
    means = {t: arm_means(an, f"task:{t}") for t in an.tasks}
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


MAX_TASK = 100  # bytes of the task, which the log's file name holds (a file name holds 255 bytes)


def _task_name(name: str) -> str:
    """``kvaudit-<name>`` with every run of non-word characters and ``_`` as ``-``; one longer than
    :data:`MAX_TASK` bytes is cut, with a hash of ``name`` so that two long names stay apart."""
    task = "kvaudit-" + re.sub(r"[\W_]+", "-", name)
    if len(task.encode()) <= MAX_TASK:
        return task
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return task.encode()[: MAX_TASK - 9].decode("utf-8", "ignore") + "-" + digest


def inspect_log_name(ev: Any) -> str:
    """``<created>_<task>_<id>.eval``, the file name inspect gives a log."""
    clean = re.sub(r"[^\w.+-]", "-", ev.eval.created)
    return f"{clean}_{ev.eval.task}_{ev.eval.task_id}.eval"


def write_inspect(an: Any, out: str | Path) -> Path:
    """Write the inspect-ai log to ``out`` (a ``.eval``/``.json`` file, or a folder): whole or, when
    writing fails, not at all, with no folder made for it left behind (an OSError names ``out``)."""
    from kvaudit.core.jsonio import naming, removed_on_failure

    log, _, _ = need_inspect()
    ev = build_inspect_log(an)
    path = Path(out)
    if path.suffix not in (".eval", ".json"):
        if path.exists() and not path.is_dir():
            raise KvauditError(f"{path}: exists and is not a folder (or name a .eval/.json file)")
        path = path / inspect_log_name(ev)
    try:
        data = _log_bytes(log, ev, "json" if path.suffix == ".json" else "eval")
    except OSError as e:  # inspect-ai writes the log through a temp file of its own first
        reason = e.strerror or str(e)
        _close_quietly(e)
        raise KvauditError(f"{path}: not written: inspect-ai's temporary file in {tempfile.gettempdir()} "
                           f"failed ({reason})") from None
    tmp = path.with_name(f".{path.name[:32]}.{secrets.token_hex(4)}.tmp")
    with removed_on_failure(path.parent, tmp):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(path)
        except OSError as e:
            raise naming(e, path) from e
    return path


def _log_bytes(log: Any, ev: Any, fmt: str) -> bytes:
    """The log file's bytes, made by inspect-ai's own writer in fsspec's in-memory file system, so
    that the log file itself is written by us, whole or not at all (inspect-ai still stages an
    ``.eval`` zip in a temp file of its own)."""
    import fsspec

    fs = fsspec.filesystem("memory")
    folder = f"/kvaudit-export-{secrets.token_hex(8)}"
    try:
        log.write_eval_log(ev, f"memory://{folder}/log.{fmt}", format=fmt)
        return fs.cat_file(f"{folder}/log.{fmt}")
    finally:
        if fs.exists(folder):
            fs.rm(folder, recursive=True)


def _close_quietly(e: BaseException) -> None:
    """Let go of what ``e``'s traceback keeps alive (inspect-ai's half-written zip), now and without
    the error its destructor raises being printed as a traceback at exit."""
    hook = sys.unraisablehook
    sys.unraisablehook = lambda _: None
    try:
        traceback.clear_frames(e.__traceback__)
        gc.collect()
    finally:
        sys.unraisablehook = hook

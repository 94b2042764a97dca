"""Configuration: one model fingerprint, dtype, backend and decoding for the whole run."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from kvaudit.audit.checks.base import check, from_problems, result, short
from kvaudit.audit.checks.loading import LoadedRun
from kvaudit.core.manifest import Manifest
from kvaudit.core.run_format import MANIFEST_IDENTITY


def _agreeing(m: Manifest) -> list[tuple[str, str, Any]]:
    """(identity field, other manifest location, its value): both must agree when the other is recorded."""
    model, backend, warmup = m.model, m.backend or {}, m.warmup_prefix
    return [
        ("model_fingerprint", "model.fingerprint", model.fingerprint if model else None),
        ("dtype", "model.dtype", model.dtype if model else None),
        ("dtype", "backend.dtype", backend.get("dtype")),
        ("backend", "backend.backend", backend.get("backend")),
        ("decoding", "decoding", m.decoding),
        ("arms", "arms", m.arms),
        ("dataset_hash", "dataset.hash", m.dataset.hash if m.dataset else None),
        ("warmup_prefix_hash", "warmup_prefix.ids_hash", warmup.ids_hash if warmup else None),
        ("warmup_prefix_hash", "backend.neutral_head_hash", backend.get("neutral_head_hash")),
    ]


def _kv(d: Any) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items()) if isinstance(d, dict) else str(d)


@check("one_configuration", required=True)
def check_configuration(run: LoadedRun):
    """One model fingerprint and configuration for the whole run (manifest and every pair)."""
    m = run.manifest
    where = run.files.manifest_file
    if m.identity is None:
        return result(False, f"{where}: no '{MANIFEST_IDENTITY}' object")
    ident = m.identity.values()
    issues = []
    for key in ("model_fingerprint", "dtype", "decoding", "dataset_hash"):
        if not ident.get(key):
            issues.append(f"{MANIFEST_IDENTITY}.{key} is missing")
    for key, loc, other in _agreeing(m):
        if ident.get(key) is not None and other is not None and other != ident[key]:
            issues.append(f"{MANIFEST_IDENTITY}.{key} ({short(ident[key])}) differs from {loc} "
                          f"({short(other)})")
    threads, backend_threads = m.threads, (m.backend or {}).get("threads")
    if threads is not None and backend_threads is not None and threads != backend_threads:
        issues.append(f"threads ({threads}) differs from backend.threads ({backend_threads})")
    problems: dict[str, list[str]] = defaultdict(list)
    decoding = ident.get("decoding")
    for p in run.pairs:
        if decoding and p.decoding != decoding:
            problems[p.case_id].append(f"decoding ({_kv(p.decoding)}) differs from the run's")
    fp = str(ident.get("model_fingerprint") or "")[:16]
    ok = (f"model {ident.get('model') or '?'} (fingerprint {fp}...), {ident.get('dtype')}, "
          f"backend {ident.get('backend')}, decoding {_kv(decoding)}: one configuration for "
          f"manifest and all {len(run.pairs)} pairs")
    if issues:
        detail = f"{where} (whole run): " + "; ".join(issues)
        extra = f"; {from_problems(problems, '').detail}" if problems else ""
        return result(False, detail + extra, list(problems))
    return from_problems(problems, ok)

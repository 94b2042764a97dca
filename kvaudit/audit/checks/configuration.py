"""Configuration: one model fingerprint, dtype, backend and decoding for the whole run."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from kvaudit.audit.checks.base import check, from_problems, result, short
from kvaudit.audit.checks.loading import LoadedRun
from kvaudit.core.records import MANIFEST_FILE, MANIFEST_IDENTITY, manifest_get

# (identity field, other manifest location): both must agree when the other is recorded
_AGREEING_FIELDS = [
    ("model_fingerprint", ("model", "fingerprint")),
    ("dtype", ("model", "dtype")),
    ("dtype", ("backend", "dtype")),
    ("backend", ("backend", "backend")),
    ("decoding", ("decoding",)),
    ("arms", ("arms",)),
    ("dataset_hash", ("dataset", "hash")),
    ("warmup_prefix_hash", ("warmup_prefix", "ids_hash")),
    ("warmup_prefix_hash", ("backend", "neutral_head_hash")),
]


def _kv(d: Any) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items()) if isinstance(d, dict) else str(d)


@check("one_configuration", required=True)
def check_configuration(run: LoadedRun):
    """One model fingerprint and configuration for the whole run (manifest and every pair)."""
    m = run.manifest
    ident = m.get(MANIFEST_IDENTITY)
    where = run.path / MANIFEST_FILE
    if not isinstance(ident, dict):
        return result(False, f"{where}: no '{MANIFEST_IDENTITY}' object")
    issues = []
    for key in ("model_fingerprint", "dtype", "decoding", "dataset_hash"):
        if not ident.get(key):
            issues.append(f"{MANIFEST_IDENTITY}.{key} is missing")
    for key, loc in _AGREEING_FIELDS:
        other = manifest_get(m, *loc)
        if key in ident and other is not None and other != ident[key]:
            issues.append(f"{MANIFEST_IDENTITY}.{key} ({short(ident[key])}) differs from {'.'.join(loc)} "
                          f"({short(other)})")
    threads, backend_threads = m.get("threads"), manifest_get(m, "backend", "threads")
    if threads is not None and backend_threads is not None and threads != backend_threads:
        issues.append(f"threads ({threads}) differs from backend.threads ({backend_threads})")
    problems: dict[str, list[str]] = defaultdict(list)
    decoding = ident.get("decoding")
    for p in run.pairs:
        if decoding and p.decoding != decoding:
            problems[p.case_id].append(f"decoding ({_kv(p.decoding)}) differs from the run's")
    fp = str(ident.get("model_fingerprint", ""))[:16]
    ok = (f"model {ident.get('model', '?')} (fingerprint {fp}...), {ident.get('dtype')}, "
          f"backend {ident.get('backend')}, decoding {_kv(decoding)}: one configuration for "
          f"manifest and all {len(run.pairs)} pairs")
    if issues:
        detail = f"{where} (whole run): " + "; ".join(issues)
        extra = f"; {from_problems(problems, '').detail}" if problems else ""
        return result(False, detail + extra, list(problems))
    return from_problems(problems, ok)

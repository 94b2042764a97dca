"""Cross-backend agreement: the same dataset run on two backends (transformers and vLLM, say).

Each backend is audited on its own; this table says whether they agree with each other on the
same token ids: how often each arm's answer and first token are the same on both, whether reuse
flips the same cases on both, and each backend's own noise floor and identity error side by side.
A serving team that validated reuse on one backend reads here how far that carries to the other.
"""

from __future__ import annotations

from typing import Any

from kvaudit.core.arms import IDENTITY_ARM, NOISE_ARM, REFERENCE_ARM
from kvaudit.core.errors import DatasetError
from kvaudit.core.run_dir import RunDir
from kvaudit.core.run_format import flipped
from kvaudit.reports.analysis import Run


def _dataset_hash(run: Run) -> Any:
    m = run.manifest
    return (m.identity.dataset_hash if m.identity else None) or (m.dataset.hash if m.dataset else None)


def _run_info(run: Run) -> dict[str, Any]:
    m = run.manifest
    backend = m.backend or {}
    return {
        "path": str(run.path),
        "backend": backend.get("backend") or "unknown backend",
        "version": backend.get("vllm") or backend.get("transformers"),
        "dtype": backend.get("dtype") or (m.model.dtype if m.model else None),
        "fingerprint": m.model.fingerprint if m.model else None,
        "logits": backend.get("first_logits", "full first-token logits"),
    }


def _max_diff(run: Run, arm: str) -> float | None:
    found = [p.arms[arm].logit_diff_vs_recompute for p in run.pairs if arm in p.arms]
    vals = [float(v) for v in found if v is not None]
    return max(vals) if vals else None


def _flip_rate(run: Run, arm: str) -> tuple[int, int]:
    both = [p for p in run.pairs if arm in p.arms and REFERENCE_ARM in p.arms]
    return sum(flipped(p.arms[arm], p.arms[REFERENCE_ARM]) for p in both), len(both)


def compare_runs(a: Run, b: Run) -> dict[str, Any]:
    """Agreement of run ``b`` with run ``a`` (both of one dataset) on the cases and arms they share."""
    ha, hb = _dataset_hash(a), _dataset_hash(b)
    if ha is None or ha != hb:
        raise DatasetError(f"{RunDir(b.path).manifest_file}: field 'identity.dataset_hash' is {hb!r}, but "
                           f"{a.path} ran dataset {ha!r}: cross-backend agreement needs the same dataset")
    pa = {p.case_id: p for p in a.pairs}
    common = [(pa[p.case_id], p) for p in b.pairs if p.case_id in pa]
    if not common:
        raise DatasetError(f"{RunDir(b.path).pairs_file}: no case in common with {a.path}")
    same_ids = [(x, y) for x, y in common if x.ids_hash == y.ids_hash]
    arms_a = {n for p in a.pairs for n in p.arms}
    arms_b = {n for p in b.pairs for n in p.arms}
    rows = []
    for arm in [n for n in dict.fromkeys(n for p in a.pairs for n in p.arm_order) if n in arms_b]:
        pairs = [(x, y) for x, y in same_ids if arm in x.arms and arm in y.arms]
        if not pairs:
            continue
        row: dict[str, Any] = {
            "arm": arm, "n": len(pairs),
            "answers_equal": sum(x.arms[arm].answer == y.arms[arm].answer for x, y in pairs),
            "top1_equal": sum(bool(x.arms[arm].top_k) and bool(y.arms[arm].top_k)
                              and x.arms[arm].top_k[0][0] == y.arms[arm].top_k[0][0] for x, y in pairs),
        }
        if arm != REFERENCE_ARM:
            fa = [flipped(x.arms[arm], x.arms[REFERENCE_ARM]) for x, _ in pairs]
            fb = [flipped(y.arms[arm], y.arms[REFERENCE_ARM]) for _, y in pairs]
            row.update(flips_a=sum(fa), flips_b=sum(fb), flip_cases_agree=sum(u == v for u, v in zip(fa, fb)))
        rows.append(row)
    controls = []
    for arm in (NOISE_ARM, IDENTITY_ARM):
        if arm in arms_a or arm in arms_b:
            controls.append({"arm": arm, "max_diff_a": _max_diff(a, arm), "max_diff_b": _max_diff(b, arm),
                             "flips_a": _flip_rate(a, arm), "flips_b": _flip_rate(b, arm)})
    ia, ib = _run_info(a), _run_info(b)
    return {
        "a": ia, "b": ib, "n_common": len(common), "ids_equal": len(same_ids),
        "same_weights": bool(ia["fingerprint"]) and ia["fingerprint"] == ib["fingerprint"],
        "arms": rows, "controls": controls,
    }

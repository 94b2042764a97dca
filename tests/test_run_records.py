"""The typed run records: ``manifest.json`` (kvaudit.core.manifest) and ``audit.json``
(kvaudit.core.audit_format) round-trip, old unversioned manifests load, a newer format is refused,
and bad input is a RunFileError naming the file and the field, never another exception
(hypothesis fuzzes the manifest reader). Synthetic runs only (no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvaudit import cli
from kvaudit.audit import checks
from kvaudit.audit.trust import build_audit, verify
from kvaudit.core.audit_format import AUDIT_FORMAT, AuditRecord, read_audit, write_audit
from kvaudit.core.errors import USER_ERRORS, DatasetError, KvauditError
from kvaudit.core.jsonio import read_json, write_json
from kvaudit.core.manifest import (
    MANIFEST_FORMAT,
    DatasetRef,
    Manifest,
    ModelInfo,
    RunFileError,
    RunIdentity,
    Session,
    WarmupPrefix,
    read_manifest,
    write_manifest,
)
from kvaudit.reports.analysis import load_run as report_load_run
from kvaudit.testing.synthetic import make_run

# What a run written before the manifest had a format looks like (runs/demo, trimmed): no
# format_version, every field the runner has always written.
OLD_MANIFEST = {
    "arm_reasons": {"recompute": "the reference: one full prefill of the same ids",
                    "reuse": "segment KV from neutral warm-up, keys re-rotated (the policy under test)"},
    "arms": ["recompute", "reuse"],
    "backend": {"attn_implementation": "sdpa", "backend": "transformers", "device": "cpu", "dtype": "float32",
                "head_dim": 64, "max_prompt_tokens": 8168, "neutral_head_hash": "a6754622959b602fa25930dddc491ff0",
                "threads": 2, "torch": "2.13.0+cpu", "transformers": "5.24.0"},
    "cache_budget_bytes": 2147483648,
    "dataset": {"coverage": {"refs_per_segment": {"max": 16, "mean": 3.9189}}, "generator": "boxoffice",
                "hash": "5" * 32, "n_cases": 50, "path": "runs/demo/data"},
    "decoding": {"max_new_tokens": 24, "strategy": "greedy", "top_k_logits": 5},
    "git_revision": "abc123+dirty",
    "identity": {"arms": ["recompute", "reuse"], "backend": "transformers", "dataset_hash": "5" * 32,
                 "decoding": {"max_new_tokens": 24, "strategy": "greedy", "top_k_logits": 5}, "dtype": "float32",
                 "model": "smollm2", "model_fingerprint": "a6" * 32, "threads": 2, "torch": "2.13.0+cpu",
                 "transformers": "5.24.0", "warmup_prefix_hash": "a6754622959b602fa25930dddc491ff0"},
    "kvaudit_version": "0.1.0",
    "model": {"dtype": "float32", "fingerprint": "a6" * 32, "name": "smollm2"},
    "sessions": [{"cases_before": 0, "cases_run": 50, "finished": "2026-12-01T09:40:00+0000",
                  "segment_cache": {"builds": 37}, "started": "2026-12-01T09:21:18+0000",
                  "timing_s": {"recompute": 100.5, "reuse": 20.25}, "unique_segments_seen": 37,
                  "wall_s": 1100.0}],
    "status": "complete",
    "threads": 2,
    "timing_s": {"recompute": 100.5, "reuse": 20.25, "wall": 1100.0},
    "warmup_prefix": {"ids_hash": "a6754622959b602fa25930dddc491ff0", "system": "neutral"},
}


def _write_raw(run: Path, obj: object) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "manifest.json").write_text(json.dumps(obj))
    return run


# --------------------------------------------------------------------------- the manifest


def test_manifest_round_trips_through_its_writer_and_reader(tmp_path):
    m = Manifest(
        kvaudit_version="0.1.0",
        identity=RunIdentity(dataset_hash="d" * 32, model_fingerprint="f" * 16, model="m", backend="vllm",
                             dtype="bfloat16", arms=["recompute", "reuse"], decoding={"max_new_tokens": 8},
                             threads=4, torch="2.9", extra={"server": "http://x"}),
        backend={"backend": "vllm", "dtype": "bfloat16", "engine": {"tensor_parallel_size": 1}},
        model=ModelInfo(name="m", fingerprint="f" * 16, dtype="bfloat16"), threads=4,
        decoding={"max_new_tokens": 8}, arms=["recompute", "reuse"], arm_reasons={"reuse": "why"},
        dataset=DatasetRef(path="data", hash="d" * 32, generator="corpus", n_cases=3, coverage={"a": 1}),
        warmup_prefix=WarmupPrefix(system="neutral", ids_hash="h"), cache_budget_bytes=1 << 30,
        git_revision="rev", sessions=[Session(started="t0", cases_before=0, wall_s=1.5, timing_s={"reuse": 0.5}),
                                      Session(started="t1", extra={"note": "resumed"})],
        status="partial", timing_s={"wall": 1.5}, extra={"custom": [1, 2]},
    )
    write_manifest(tmp_path, m)
    raw = read_json(tmp_path / "manifest.json")
    assert raw["format_version"] == MANIFEST_FORMAT and raw["custom"] == [1, 2]
    assert raw["identity"]["server"] == "http://x" and "transformers" not in raw["identity"]
    assert read_manifest(tmp_path) == m
    assert not [p.name for p in tmp_path.iterdir() if p.name != "manifest.json"]  # atomic: no temp left


def test_an_unversioned_manifest_loads_as_format_1_and_keeps_every_field(tmp_path):
    m = read_manifest(_write_raw(tmp_path, OLD_MANIFEST))
    assert m.format_version == 1
    assert m.identity.model == "smollm2" and m.model.name == "smollm2" and m.dataset.n_cases == 50
    assert m.sessions[0].segment_cache == {"builds": 37} and m.warmup_prefix.system == "neutral"
    assert m.backend["attn_implementation"] == "sdpa" and m.extra == {}
    # written back, it is the same object plus its format version
    assert m.to_dict() == {**OLD_MANIFEST, "format_version": MANIFEST_FORMAT}


def test_an_old_manifest_missing_fields_gets_their_defaults(tmp_path):
    m = read_manifest(_write_raw(tmp_path, {"arms": ["recompute"], "dtype": "float32"}))
    assert (m.format_version, m.identity, m.model, m.dataset, m.sessions, m.status) == (1, None, None, None, [], None)
    assert m.arms == ["recompute"] and m.extra == {"dtype": "float32"}  # an unknown key is kept, not dropped


@pytest.mark.parametrize("version, message", [
    (MANIFEST_FORMAT + 1, f"field 'format_version' is {MANIFEST_FORMAT + 1}, newer than this kvaudit reads"),
    (0, "field 'format_version' is 0: manifest formats start at 1"),
    ("1", "field 'format_version' must be int, got str"),
])
def test_an_unknown_format_version_is_refused_naming_file_and_field(tmp_path, capsys, version, message):
    run = make_run(tmp_path / "run", n_per_task=2, leak_probes=0, audit_passed=None)
    raw = read_json(run / "manifest.json")
    write_json(run / "manifest.json", {**raw, "format_version": version})
    for reader in (read_manifest, checks.load_for_audit, report_load_run):
        with pytest.raises(KvauditError) as e:
            reader(run)
        assert str(e.value).startswith(f"{run / 'manifest.json'}: ") and message in str(e.value)
    for argv in (["audit", str(run)], ["report", str(run)], ["gate", str(run)]):
        assert cli.main(argv) == 2
        out = capsys.readouterr()
        assert message in out.out + out.err and "Traceback" not in out.out + out.err


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["model"].pop("name"), "missing field 'model.name'"),
    (lambda m: m["dataset"].update(n_cases="3"), "field 'dataset.n_cases' must be int or null, got str"),
    (lambda m: m["identity"].update(dtype=32), "field 'identity.dtype' must be str or null, got int"),
    (lambda m: m.update(arms=["recompute", 1]), "field 'arms[1]' must be str, got int"),
    (lambda m: m.update(backend="transformers"), "field 'backend' must be an object, got str"),
    (lambda m: m.update(sessions=[{"started": "t"}, {"started": "t", "wall_s": "1s"}]),
     "field 'sessions[1].wall_s' must be a number or null, got str"),
    (lambda m: m.update(sessions=[{"finished": "t"}]), "missing field 'sessions[0].started'"),
    (lambda m: m.update(timing_s={"wall": True}), "field 'timing_s.wall' must be a number, got bool"),
])
def test_a_missing_or_mistyped_field_names_file_and_field(tmp_path, capsys, edit, message):
    run = make_run(tmp_path / "run", n_per_task=2, leak_probes=0)
    raw = read_json(run / "manifest.json")
    raw.setdefault("sessions", [{"started": "t"}])
    edit(raw)
    write_json(run / "manifest.json", raw)
    for reader in (read_manifest, checks.load_for_audit, report_load_run):
        with pytest.raises(RunFileError, match=f"manifest.json: {message}".replace("[", r"\[").replace("]", r"\]")):
            reader(run)
    assert cli.main(["audit", str(run)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(run / "manifest.json") in err and "Traceback" not in err


def test_a_manifest_error_is_both_a_user_error_and_a_dataset_error(tmp_path):
    with pytest.raises(USER_ERRORS) as e:
        read_manifest(tmp_path)  # no file
    assert isinstance(e.value, KvauditError) and isinstance(e.value, DatasetError)
    assert "manifest.json: file not found" in str(e.value)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(RunFileError, match="manifest.json: not valid JSON"):
        read_manifest(tmp_path)


# Any JSON value, and objects shaped like a manifest (known keys with any value; sub-records with
# their own known keys), so the fuzz reaches every field's check, not only the top level.
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=8)
SUB = {"identity": ["dataset_hash", "model", "arms", "decoding", "threads"], "model": ["name", "fingerprint", "dtype"],
       "dataset": ["path", "hash", "n_cases", "coverage"], "warmup_prefix": ["system", "ids_hash"]}


def _shaped(keys: list[str]) -> st.SearchStrategy:
    return st.fixed_dictionaries({}, optional={k: JSON for k in keys})


MANIFEST_LIKE = st.fixed_dictionaries({}, optional={
    **{k: JSON for k in ("format_version", "kvaudit_version", "backend", "threads", "decoding", "arms", "arm_reasons",
                         "cache_budget_bytes", "git_revision", "status", "timing_s", "other")},
    **{k: _shaped(v) | JSON for k, v in SUB.items()},
    "sessions": st.lists(_shaped(["started", "finished", "wall_s", "timing_s", "cases_run"]) | JSON, max_size=3) | JSON,
})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(obj=MANIFEST_LIKE | st.dictionaries(st.text(max_size=10), JSON, max_size=5) | JSON)
def test_any_json_is_a_manifest_or_a_run_file_error(tmp_path, obj):
    (tmp_path / "manifest.json").write_text(json.dumps(obj))
    try:
        m = read_manifest(tmp_path)
    except RunFileError as e:
        assert str(e).startswith(f"{tmp_path / 'manifest.json'}: ")
        return
    assert isinstance(m, Manifest)
    again = Manifest.from_dict(json.loads(json.dumps(m.to_dict())), "again")  # what it writes, it reads

    def same(a: object, b: object) -> bool:  # NaN != NaN: compare the JSON texts
        return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)

    assert same(again.to_dict(), m.to_dict())


# --------------------------------------------------------------------------- the audit record


def test_audit_record_round_trips_and_verifies(tmp_path):
    run = make_run(tmp_path / "run", n_per_task=3, leak_probes=2, audit_passed=None)
    rec = build_audit(run)
    assert isinstance(rec, AuditRecord) and rec.format == AUDIT_FORMAT and rec.verdict == "passed"
    write_audit(run, rec)
    assert read_audit(run) == rec
    assert read_json(run / "audit.json")["inputs"].keys() == {"pairs.jsonl", "manifest.json", "dataset",
                                                              "simulation.json"}
    v = verify(run)
    assert v.state == "verified" and v.checks == rec.checks


@pytest.mark.parametrize("edit, message", [
    (lambda a: a.update(format=1), "not an audit of format 2 (field 'format' is 1)"),
    (lambda a: a["parameters"].update(identity_tol="tight"), "field 'parameters.identity_tol' must be a number"),
    (lambda a: a["parameters"].update(dataset_dir=5), "field 'parameters.dataset_dir' must be str or null, got int"),
    (lambda a: a["inputs"].pop("pairs.jsonl"), "missing field 'inputs.pairs.jsonl'"),
    (lambda a: a.update(verdict="fine"), "field 'verdict' must be one of 'passed', 'failed', 'cannot_judge', got 'fine'"),
    (lambda a: a["checks"][0].update(passed="yes"), "field 'checks[0].passed' must be bool, got str"),
])
def test_a_malformed_audit_is_refused_naming_file_and_field(tmp_path, edit, message):
    run = make_run(tmp_path / "run", n_per_task=3, leak_probes=0)
    raw = read_json(run / "audit.json")
    edit(raw)
    write_json(run / "audit.json", raw)
    with pytest.raises(RunFileError) as e:
        read_audit(run)
    assert str(e.value).startswith(f"{run / 'audit.json'}: ") and message in str(e.value)
    v = verify(run)
    assert v.state == "refused" and message in v.reason and v.verdict is None
    assert report_load_run(run).audit.state == "refused"


def test_pair_reader_types_come_from_the_dataclasses():
    """The reader's checks follow the dataclass annotations: a new field typed there is checked
    with no second declaration, and an element is named by its path."""
    from dataclasses import dataclass, field

    from kvaudit.core.errors import DatasetError
    from kvaudit.core.typed_json import check_fields

    @dataclass
    class Rec:
        name: str
        spans: list[tuple[int, int]]
        scores: dict[str, float] = field(default_factory=dict)
        note: str | None = None
        count: int = 0

    check_fields({"name": "a", "spans": [[0, 1]], "scores": {"x": 1, "y": 0.5}, "note": None}, Rec, "f")
    bad = [
        ({"spans": []}, "missing field 'name'"),
        ({"name": "a", "spans": [[0, 1], [2, True]]}, "field 'spans[1]' must be [int, int], got list"),
        ({"name": "a", "spans": [], "scores": {"x": "1"}}, "field 'scores.x' must be a number, got str"),
        ({"name": "a", "spans": [], "count": None}, "field 'count' must be int, got null"),
        ({"name": "a", "spans": [], "count": True}, "field 'count' must be int, got bool"),
        ({"name": "a", "spans": [], "note": 3}, "field 'note' must be str or null, got int"),
    ]
    for obj, message in bad:
        with pytest.raises(DatasetError) as e:
            check_fields(obj, Rec, "f, line 1")
        assert str(e.value) == f"f, line 1: {message}"

"""The audit's check registry (kvaudit.audit.checks): report order, required flags, one reader.

Synthetic runs only (no model): the registry and the shared pairs reader are read-only logic.
"""

from __future__ import annotations

import json

import pytest

from kvaudit.audit import checks
from kvaudit.audit.checks.base import REGISTRY, check, result
from kvaudit.core.errors import DatasetError
from kvaudit.core.run_format import read_pairs
from kvaudit.reports.analysis import load_run as report_load_run
from kvaudit.testing.synthetic import make_run

REPORT_ORDER = ["records", "same_inputs", "one_configuration",
                "engines_differ_only_in_change", "candidate_control", "candidate_noise_floor",
                "server_consumed_ids", "server_model", "server_cache_evidence", "tenant_isolation",
                "identity_control", "reuse_happened",
                "repair_equals_reuse", "repair_equals_recompute",
                "history_independence", "noise_floor", "prefix_cache_control", "coverage", "leak_probes"]
NOT_REQUIRED = {"tenant_isolation", "noise_floor", "prefix_cache_control", "coverage", "candidate_noise_floor"}


def test_registry_runs_every_check_in_report_order_with_its_required_flag(tmp_path):
    assert [s.name for s in checks.registered()] == REPORT_ORDER
    run = checks.load_for_audit(make_run(tmp_path / "run", n_per_task=4, leak_probes=3, audit_passed=None))
    results = checks.run_checks(run)
    assert [r.name for r in results] == REPORT_ORDER
    assert {r.name for r in results if not r.required} == NOT_REQUIRED
    assert all(r.passed for r in results if r.required), [r for r in results if not r.passed]
    # an in-process reuse run is neither a serving change nor a server run: those checks say so, and only those
    assert {r.name: r.detail for r in results if r.not_applicable} == {
        **{n: "does not apply: not a serving-change run (no --engines)"
           for n in ("engines_differ_only_in_change", "candidate_control", "candidate_noise_floor")},
        **{n: "does not apply: not a server run (no arm recorded what a serving engine reported)"
           for n in ("server_consumed_ids", "server_model", "server_cache_evidence")},
        # checks whose arms this synthetic run lacks: "not run", never "pass"
        "prefix_cache_control": "not run: no prefix_cache arms",
        "tenant_isolation": "not run: no tenant probe (reuse_other_tenant or prefix_cache_other_tenant arms)"}
    # a check called directly is named by the registry too
    direct = checks.check_identity(run, identity_tol=0.5)
    assert (direct.name, direct.required) == ("identity_control", True) and "tolerance 0.5 = max(0.5," in direct.detail


def test_a_check_cannot_be_registered_twice():
    with pytest.raises(ValueError, match="registered twice"):
        check("records", required=True)(lambda run: result(True, "x"))
    assert REGISTRY["records"].required is True


@pytest.mark.parametrize("field, value, message", [
    ("task", 3, "field 'task' must be str"),
    ("strata", [], "field 'strata' must be an object, got list"),
    ("arms.recompute.margin", "big", "arm 'recompute': field 'margin' must be a number, got str"),
    ("arms.reuse.tokens_reused", True, "arm 'reuse': field 'tokens_reused' must be int"),
])
def test_audit_and_report_read_pairs_through_one_validated_reader(tmp_path, field, value, message):
    run = make_run(tmp_path / "run", n_per_task=2, leak_probes=0, audit_passed=None)
    rows = [json.loads(line) for line in (run / "pairs.jsonl").read_text().splitlines()]
    target = rows[1]
    *path, last = field.split(".")
    for k in path:
        target = target[k]
    target[last] = value
    (run / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for reader in (read_pairs, checks.load_for_audit, report_load_run):
        with pytest.raises(DatasetError, match="pairs.jsonl, line 2") as e:
            reader(run)
        assert message in str(e.value), (reader, str(e.value))

"""The fixed words (kvaudit.core.vocabulary) are the words the code uses: every arm's role and source,
the roles table, the gate's check kinds and statuses, the replay's policies and schedules; and a
record holding a word outside its vocabulary is refused naming the field."""

from __future__ import annotations

import json

import pytest

from kvaudit.core.arms import ARMS, ROLES, get_arm
from kvaudit.core.errors import DatasetError
from kvaudit.core.replay_format import ReplayConfig, ReplayDir
from kvaudit.core.vocabulary import (
    ArmRole,
    ArmSource,
    CheckKind,
    GateStatus,
    ReplayPolicy,
    Schedule,
    words,
)
from kvaudit.replay.replay_cli import POLICIES
from kvaudit.reports.policy import parse_policy
from kvaudit.testing.synthetic import make_run


def test_every_arm_speaks_the_vocabulary():
    assert set(ROLES) == set(words(ArmRole))
    for spec in [*ARMS.values(), get_arm("blend@0.15"), get_arm("epic@16")]:
        assert spec.role in words(ArmRole), spec.name
        assert spec.source is None or spec.source in words(ArmSource), spec.name


def test_every_gate_row_speaks_the_vocabulary(tmp_path):
    from kvaudit.reports.analysis import Analysis, load_run
    from kvaudit.reports.policy import evaluate

    raw = {"arm": "reuse", "delta": [{"group": "overall", "min_lower_bound": -2.0}],
           "speed": [{"metric": "ttft", "max_ratio": 1.5}], "flips": {"max_rate": 0.2},
           "audit": {"require_passed": True}, "hit_rate": {"min": 0.5, "source": "segment"},
           "leak": {"max_neutral_text_leak_rate": 0.05, "forbid_neutral_exposure": True},
           "security": {"require_tenant_isolation": True, "max_timing_auc": 0.75},
           "provenance": {"require_attestation": True}}
    pol = parse_policy(raw, "p.toml")
    assert {c.kind for c in pol.checks} <= set(words(CheckKind))
    rows = evaluate(pol, Analysis(load_run(make_run(tmp_path / "run", n_per_task=20, n_docs=12))))
    assert {r.kind for r in rows} <= set(words(CheckKind)) and {r.status for r in rows} <= set(words(GateStatus))


def test_the_replay_reads_only_its_words(tmp_path):
    assert POLICIES == words(ReplayPolicy) and set(words(Schedule)) == {"arrivals", "waves"}
    d = ReplayDir(tmp_path / "r")
    d.path.mkdir()
    cfg = ReplayConfig(workload="w", workload_hash="h", policy="segment", budget_bytes=1, model="m", backend="vllm",
                       concurrency=1, max_new_tokens=1, n_requests=1, schedule="arrivals")
    d.write_config(cfg)
    assert d.read_config() == cfg
    obj = json.loads(d.config_file.read_text())
    obj["schedule"] = "wavez"
    d.config_file.write_text(json.dumps(obj))
    with pytest.raises(DatasetError, match=r"field 'schedule' must be one of 'arrivals', 'waves', got 'wavez'"):
        d.read_config()


def test_every_check_kind_has_its_evaluator():
    """Each gate row kind is judged by one registered evaluator (kvaudit.reports.gate_checks), except
    the rows the policy and gate add themselves: the noise-floor controls, "quality checked" and the
    run's completeness."""
    from kvaudit.reports.gate_checks import EVALUATORS, sections

    assert set(EVALUATORS) | {"noise_control", "coverage", "completeness"} == set(words(CheckKind))
    assert [s.name for s in sections()] == ["delta", "speed", "flips", "audit", "hit_rate", "leak", "security",
                                            "provenance"]

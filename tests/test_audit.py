"""`kvaudit audit RUN`: a real SmolLM2 run passes untouched (the model tier); a run fails naming
check and case when tampered, and bad input is a clear error (synthetic runs shaped like the real
one: the real audit reads only what the records say, so no model is needed for those)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import kvaudit
from kvaudit.audit import checks
from kvaudit.cli import main
from kvaudit.core.arms import NOISE_ARM
from kvaudit.core.jsonio import write_json, write_jsonl
from kvaudit.core.run_format import read_pairs
from kvaudit.testing.synthetic import make_pairs, make_run

EXAMPLE = Path(kvaudit.__file__).parent / "data" / "example"
REQUIRED = {"records", "same_inputs", "one_configuration", "identity_control", "reuse_happened",
            "history_independence", "leak_probes", "repair_equals_reuse", "repair_equals_recompute",
            "server_consumed_ids", "server_model", "server_cache_evidence"}
N_CASES = 13  # the synthetic run: 3 cases per task family of four, and one leak probe
PROBE = "leak_probe-000"


@pytest.fixture
def synth(tmp_path) -> Path:
    """A synthetic run shaped like the real one (every arm the real run has that the records
    checks read, one leak probe) whose recompute is bit-reproducible: the noise floor is exactly
    0, so identity is held to the dtype's fixed tolerance and must match answer for answer, as on
    the transformers backend on CPU."""
    pairs = make_pairs(n_per_task=3, leak_probes=1)
    for p in pairs:
        p.arms[NOISE_ARM].logit_diff_vs_recompute = 0.0
    return make_run(tmp_path / "run", pairs, audit_passed=None)


# --------------------------------------------------------------------------- helpers


def load_rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "pairs.jsonl").read_text().splitlines() if line.strip()]


def save_rows(run: Path, rows: list[dict]) -> None:
    write_jsonl(run / "pairs.jsonl", rows)


def edit_manifest(run: Path, fn: Callable[[dict], None]) -> None:
    m = json.loads((run / "manifest.json").read_text())
    fn(m)
    write_json(run / "manifest.json", m)


def audit(run: Path, *extra: str) -> tuple[int, dict | None]:
    rc = main(["audit", str(run), *extra])
    path = run / "audit.json"
    return rc, json.loads(path.read_text()) if path.exists() else None


def by_name(result: dict) -> dict[str, dict]:
    return {c["name"]: c for c in result["checks"]}


def row(rows: list[dict], case_id: str) -> dict:
    return next(r for r in rows if r["case_id"] == case_id)


def assert_fails(run: Path, check: str, case: str | None) -> dict:
    rc, result = audit(run)
    assert rc == 1
    assert result is not None and result["passed"] is False
    c = by_name(result)[check]
    assert c["passed"] is False and c["required"] is True
    if case is not None:
        assert case in c["failing_cases"]
        assert case in c["detail"]
    return result


# --------------------------------------------------------------------------- the real run


def test_untampered_run_passes(run_copy, capsys):
    rc, result = audit(run_copy)
    assert rc == 0
    assert result["passed"] is True
    checks_ = by_name(result)
    serving = {"engines_differ_only_in_change", "candidate_control", "candidate_noise_floor"}
    assert REQUIRED | serving | {s.name for s in checks.registered() if not s.required} == set(checks_)
    assert all(checks_[n]["not_applicable"] for n in serving)  # a reuse run: they do not apply
    assert checks_["prefix_cache_control"]["detail"] == "not run: no prefix_cache arms"
    assert checks_["prefix_cache_control"]["not_applicable"]  # shown as "not run", never as "pass"
    for name in REQUIRED:
        assert checks_[name]["required"] and checks_[name]["passed"], checks_[name]
        assert checks_[name]["failing_cases"] == []
    for c in result["checks"]:
        assert set(c) == {"name", "passed", "required", "detail", "failing_cases", "warning", "cannot_judge",
                          "not_applicable"}
        assert c["cannot_judge"] is False
    assert result["verdict"] == "passed" and result["format"] == 2
    assert set(result["inputs"]) == {"pairs.jsonl", "manifest.json", "dataset", "simulation.json"}
    assert result["inputs"]["simulation.json"] is None  # the run has none: bound as absent
    # the noise floor and the leak probes report numbers, not just a verdict
    assert "recompute_again flips 0 of 8" in checks_["noise_floor"]["detail"]
    assert "tolerance 0.0001 for float32" in checks_["identity_control"]["detail"]
    assert "1 probes" in checks_["leak_probes"]["detail"]
    assert "needs 5 for 80%" in checks_["leak_probes"]["warning"]  # one probe cannot test exposure
    out = capsys.readouterr().out
    assert "audit PASSED" in out and "identity_control" in out


def test_real_run_has_what_the_checks_rely_on(smollm2_run):
    """Guards against a vacuous pass: the run really holds the arms and numbers checked."""
    pairs = read_pairs(smollm2_run)
    assert len(pairs) == 8
    for p in pairs:
        assert {"recompute", "reuse", "identity", "reuse_norope", "recompute_again"} <= set(p.arms)
        assert p.arms["reuse"].tokens_reused > 0
        assert set(p.arms["reuse"].segment_kv_fingerprints) == set(p.segment_ids)
        assert p.arms["identity"].logit_diff_vs_recompute < checks.DEFAULT_TOL
    assert sum(1 for p in pairs if p.canary) == 1


def test_coverage_from_dataset_option(run_copy):
    rc, result = audit(run_copy, "--dataset", str(EXAMPLE))
    c = by_name(result)["coverage"]
    assert rc == 0 and c["detail"].startswith(f"computed from {EXAMPLE}") and c["warning"] is None


# --------------------------------------------------------------------------- tampering (synthetic runs)


def test_the_synthetic_run_passes_and_holds_what_the_tampering_needs(synth):
    """Guards against a vacuous failure below: untouched, the run passes every required check."""
    rc, result = audit(synth)
    assert rc == 0 and result["verdict"] == "passed"
    assert all(c["passed"] for c in result["checks"] if c["required"])
    assert "tolerance 0.0001 for float32" in by_name(result)["identity_control"]["detail"]
    rows = load_rows(synth)
    assert len(rows) == N_CASES and len(row(rows, "multi_hop_bridge-001")["segment_hashes"]) > 1
    assert "reuse_first_user" in row(rows, PROBE)["arms"]


def tamper_ids_hash(rows):
    row(rows, "single_doc-002")["arms"]["reuse"]["ids_hash"] = "0" * 32


def tamper_segment_hash(rows):
    row(rows, "multi_hop_bridge-001")["arms"]["identity"]["segment_hashes"][1] = "f" * 32


def tamper_arm_decoding(rows):
    row(rows, "aggregate-000")["arms"][NOISE_ARM]["decoding"]["max_new_tokens"] = 32


def tamper_truncation(rows):
    row(rows, "single_doc-000")["arms"]["reuse"]["truncation"]["truncated"] = True


def tamper_zero_reuse(rows):
    arm = row(rows, "aggregate-001")["arms"]["reuse"]
    arm["tokens_computed"] += arm["tokens_reused"]  # a consistent silent miss, not a bookkeeping slip
    arm["tokens_reused"] = 0


def tamper_identity_logits(rows):
    row(rows, "aggregate-002")["arms"]["identity"]["logit_diff_vs_recompute"] = 3e-4


def tamper_identity_answer(rows):
    row(rows, "agreement-000")["arms"]["identity"]["answer"] = "Something else entirely."


def tamper_kv_fingerprint(rows):
    fps = row(rows, "multi_hop_bridge-001")["arms"]["reuse"]["segment_kv_fingerprints"]
    fps[next(iter(fps))] = "0123456789abcdef01234567"


def tamper_missing_arm(rows):
    del row(rows, PROBE)["arms"]["reuse_first_user"]
    row(rows, PROBE)["arm_order"].remove("reuse_first_user")


def tamper_duplicate(rows):
    rows.append(dict(row(rows, "single_doc-000")))


@pytest.mark.parametrize("tamper, check, case", [
    (tamper_ids_hash, "same_inputs", "single_doc-002"),
    (tamper_segment_hash, "same_inputs", "multi_hop_bridge-001"),
    (tamper_arm_decoding, "same_inputs", "aggregate-000"),
    (tamper_truncation, "same_inputs", "single_doc-000"),
    (tamper_zero_reuse, "reuse_happened", "aggregate-001"),
    (tamper_identity_logits, "identity_control", "aggregate-002"),
    (tamper_identity_answer, "identity_control", "agreement-000"),
    (tamper_kv_fingerprint, "history_independence", "multi_hop_bridge-001"),
    (tamper_missing_arm, "records", PROBE),
    (tamper_duplicate, "records", "single_doc-000"),
], ids=lambda x: getattr(x, "__name__", str(x)))
def test_tampered_run_fails_naming_check_and_case(synth, capsys, tamper, check, case):
    rows = load_rows(synth)
    tamper(rows)
    save_rows(synth, rows)
    result = assert_fails(synth, check, case)
    # only the tampered case is blamed
    assert by_name(result)[check]["failing_cases"] == [case]
    out = capsys.readouterr().out
    assert "audit FAILED" in out and check in out and case in out


def test_silent_zero_hit_run_fails_on_every_case(synth):
    rows = load_rows(synth)
    for r in rows:
        for name, arm in r["arms"].items():
            if name != "recompute" and name != "recompute_again":
                arm["tokens_computed"] += arm["tokens_reused"]
                arm["tokens_reused"] = 0
    save_rows(synth, rows)
    result = assert_fails(synth, "reuse_happened", None)
    assert sorted(by_name(result)["reuse_happened"]["failing_cases"]) == sorted(r["case_id"] for r in rows)


def test_pair_decoding_differing_from_the_manifest_fails_configuration(synth):
    rows = load_rows(synth)
    r = row(rows, "single_doc-001")
    for d in [r["decoding"], *(a["decoding"] for a in r["arms"].values())]:
        d["strategy"] = "sample"
    save_rows(synth, rows)
    result = assert_fails(synth, "one_configuration", "single_doc-001")
    assert by_name(result)["same_inputs"]["passed"]  # consistent within the pair, not with the run


def test_run_without_identity_arm_fails_as_unvalidated(synth):
    rows = load_rows(synth)
    for r in rows:
        del r["arms"]["identity"]
        r["arm_order"].remove("identity")
    save_rows(synth, rows)

    def drop(m):
        m["arms"].remove("identity")
        m["identity"]["arms"].remove("identity")

    edit_manifest(synth, drop)
    result = assert_fails(synth, "identity_control", None)
    assert "identity arm not run" in by_name(result)["identity_control"]["detail"]
    assert by_name(result)["records"]["passed"]


def test_two_model_fingerprints_fail_configuration(synth):
    edit_manifest(synth, lambda m: m["model"].update(fingerprint="deadbeef"))
    result = assert_fails(synth, "one_configuration", None)
    assert "model.fingerprint" in by_name(result)["one_configuration"]["detail"]


def test_bfloat16_run_uses_the_documented_looser_tolerance(synth):
    rows = load_rows(synth)
    row(rows, "aggregate-002")["arms"]["identity"]["logit_diff_vs_recompute"] = 0.5
    save_rows(synth, rows)
    assert_fails(synth, "identity_control", "aggregate-002")  # float32: 0.5 is far beyond 1e-4

    def to_bf16(m):
        m["identity"]["dtype"] = m["model"]["dtype"] = m["backend"]["dtype"] = "bfloat16"

    edit_manifest(synth, to_bf16)
    rc, result = audit(synth)
    c = by_name(result)["identity_control"]
    assert rc == 0 and c["passed"]
    assert "tolerance 1 for bfloat16" in c["detail"] and "low-precision" in c["detail"]
    rc, result = audit(synth, "--identity-tol", "0.1")
    assert rc == 1 and by_name(result)["identity_control"]["failing_cases"] == ["aggregate-002"]


def test_noise_floor_warns_but_does_not_fail(synth):
    rows = load_rows(synth)
    n_flips = sum(r["arms"]["reuse"]["answer"] != r["arms"]["recompute"]["answer"] for r in rows)
    assert n_flips > 0  # the run's reuse changes some answers
    for r in rows:  # recompute_again flips exactly where reuse flips: reuse is within the noise
        r["arms"]["recompute_again"]["answer"] = r["arms"]["reuse"]["answer"]
    save_rows(synth, rows)
    rc, result = audit(synth)
    c = by_name(result)["noise_floor"]
    assert rc == 0 and result["passed"]
    assert c["required"] is False and "within the noise floor" in c["warning"]
    assert f"recompute_again flips {n_flips} of {N_CASES}" in c["detail"]
    assert f"reuse flips {n_flips} of {N_CASES}" in c["detail"]


def test_neutral_exposure_beyond_chance_fails_leak_check(synth):
    rows = load_rows(synth)
    probe = row(rows, PROBE)
    for i in range(8):  # eight probes where the true name gains 2 nats under neutral reuse
        new = json.loads(json.dumps(probe))
        new["case_id"] = f"leak-{i}"
        new["arms"]["reuse"]["canary_logprobs"][new["canary"]["value"]] += 2.0
        rows.append(new)
    save_rows(synth, rows)
    result = assert_fails(synth, "leak_probes", "leak-0")
    c = by_name(result)["leak_probes"]
    assert PROBE not in c["failing_cases"] and len(c["failing_cases"]) == 8
    assert "rank test" in c["detail"]
    # the audit and the report read the same leak statistics
    from kvaudit.stats.leaks import leak_summary

    assert leak_summary(read_pairs(synth))["neutral_exposure_beyond_chance"] is True


def test_coverage_below_minimums_warns(synth):
    def low(m):
        m["dataset"]["path"] = str(synth / "gone")  # so the card's coverage is what is read
        m["dataset"]["coverage"] = {"refs_per_segment": {"mean": 1.2}, "never_cached_position_share": 0.1}

    edit_manifest(synth, low)
    rc, result = audit(synth)
    c = by_name(result)["coverage"]
    assert rc == 0 and c["passed"] and not c["required"]
    assert "references per segment 1.2 < 2" in c["warning"] and "0.1 < 0.5" in c["warning"]



# --------------------------------------------------------------------------- bad input => exit 2


def test_corrupt_pairs_is_a_clear_error(synth, capsys):
    lines = (synth / "pairs.jsonl").read_text().splitlines(keepends=True)
    lines[2] = lines[2][: len(lines[2]) // 2] + "\n"
    (synth / "pairs.jsonl").write_text("".join(lines))
    assert main(["audit", str(synth)]) == 2
    err = capsys.readouterr().err
    assert "pairs.jsonl, line 3" in err and "Traceback" not in err
    assert not (synth / "audit.json").exists()


def test_wrong_field_type_is_a_clear_error(synth, capsys):
    rows = load_rows(synth)
    rows[3]["arms"]["reuse"]["tokens_reused"] = "93"
    save_rows(synth, rows)
    assert main(["audit", str(synth)]) == 2
    err = capsys.readouterr().err
    assert "line 4" in err and "arm 'reuse'" in err and "'tokens_reused'" in err


def test_missing_manifest_is_a_clear_error(synth, capsys):
    (synth / "manifest.json").unlink()
    assert main(["audit", str(synth)]) == 2
    assert "manifest.json" in capsys.readouterr().err


def test_missing_run_dir_and_wrong_dataset_are_clear_errors(synth, tmp_path, capsys):
    assert main(["audit", str(tmp_path / "nowhere")]) == 2
    assert "run directory not found" in capsys.readouterr().err
    other = tmp_path / "other"
    shutil.copytree(EXAMPLE, other)
    (other / "dataset.json").unlink()  # no card: the run's own hash check is what refuses it
    with open(other / "cases.jsonl", "a") as f:
        f.write("\n")
    assert main(["audit", str(synth), "--dataset", str(other)]) == 2
    assert "differs from the run's dataset hash" in capsys.readouterr().err


def test_torn_last_line_is_ignored_and_reported_as_partial(synth):
    text = (synth / "pairs.jsonl").read_text()
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    (synth / "pairs.jsonl").write_text(text[: len(text) - len(last) - 1] + last[:50])
    rc, result = audit(synth)
    c = by_name(result)["records"]
    assert rc == 0 and c["passed"] and f"{N_CASES - 1} of {N_CASES} cases" in c["warning"]

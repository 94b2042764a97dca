"""The real default model: identity control, reuse accounting, identical ids, kill and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvaudit.core.arms import get_arm
from kvaudit.core.manifest import read_manifest
from kvaudit.core.run_format import read_pairs

from .conftest import ALL_ARMS, EXAMPLE


def test_identity_control_matches_recompute(smollm2_run: Path):
    pairs = read_pairs(smollm2_run)
    assert len(pairs) == 8
    for rec in pairs:
        ident = rec.arms["identity"]
        assert ident.logit_diff_vs_recompute is not None
        assert ident.logit_diff_vs_recompute <= 1e-4, rec.case_id
        assert ident.answer_ids == rec.arms["recompute"].answer_ids, rec.case_id


def test_reuse_reports_segment_tokens_as_reused(smollm2_run: Path):
    for rec in read_pairs(smollm2_run):
        seg_tokens = sum(e - s for s, e in rec.segment_spans)
        for name, res in rec.arms.items():
            if get_arm(name).source is None:
                assert res.tokens_reused == 0 and res.tokens_computed == rec.n_prompt_tokens
            else:
                assert res.tokens_reused == seg_tokens > 0, (rec.case_id, name)
                assert res.tokens_computed == rec.n_prompt_tokens - seg_tokens


def test_arms_see_identical_ids(smollm2_run: Path):
    for rec in read_pairs(smollm2_run):
        for res in rec.arms.values():
            assert res.ids_hash == rec.ids_hash
            assert res.segment_hashes == rec.segment_hashes
            assert res.truncation == rec.truncation and res.decoding == rec.decoding


def test_reuse_moves_logits_and_neutral_kv_is_history_independent(smollm2_run: Path):
    pairs = read_pairs(smollm2_run)
    assert max(p.arms["reuse"].logit_diff_vs_recompute for p in pairs) > 0.1
    seen: dict[str, str] = {}
    for rec in pairs:
        for sid, fp in rec.arms["reuse"].segment_kv_fingerprints.items():
            assert seen.setdefault(sid, fp) == fp
    assert max(p.arms["recompute_again"].logit_diff_vs_recompute for p in pairs) <= 1e-4


def test_leak_probe_arms_and_manifest(smollm2_run: Path):
    pairs = read_pairs(smollm2_run)
    probes = [p for p in pairs if p.canary]
    assert probes and all("reuse_first_user" in p.arms for p in probes)
    assert all("reuse_first_user" not in p.arms for p in pairs if not p.canary)
    for p in probes:
        names = {p.canary["value"], *p.canary["decoys"]}
        assert set(p.arms["reuse"].canary_logprobs) == names
    m = read_manifest(smollm2_run)
    assert m.status == "complete"
    assert m.identity.arms == ALL_ARMS.split(",")[:3] + ["reuse_norope", "reuse_first_user", "recompute_again"]
    seg = m.sessions[-1].segment_cache
    assert seg["builds"] == len({s for p in pairs for s in p.segment_ids})  # one warm-up per unique segment
    for key in ("recompute", "reuse", "controls", "caching", "wall"):
        assert m.timing_s[key] > 0


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvaudit.cli", *args]


def test_killed_run_resumes_without_loss(smollm2_run: Path, tmp_path: Path):
    out = tmp_path / "run"
    # Three arms and five cases keep this test short; answers must match the full run's.
    cmd = _cli("run", "--dataset", str(EXAMPLE), "--out", str(out), "--arms", "recompute,reuse,identity",
               "--limit", "5", "--max-new-tokens", "8", "--no-progress")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ.copy())
    pairs = out / "pairs.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline:
        if pairs.exists() and pairs.read_text().count("\n") >= 2:
            break
        if proc.poll() is not None:
            pytest.fail(f"run exited early: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_before = pairs.read_text().count("\n")
    assert 2 <= n_before < 5
    from kvaudit.cli import main

    main(["audit", str(out)])  # an audit of the partial run must not survive its resumption
    assert (out / "audit.json").exists()
    with open(pairs, "a") as f:  # a torn line, as a kill during a write leaves
        f.write('{"case_id": "ex-0')
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    resumed = read_pairs(out)
    assert sorted(p.case_id for p in resumed) == sorted({p.case_id for p in resumed})
    ref = {p.case_id: p for p in read_pairs(smollm2_run)[:5]}
    assert set(ref) == {p.case_id for p in resumed}
    for p in resumed:
        r = ref[p.case_id]
        assert p.ids_hash == r.ids_hash and p.segment_hashes == r.segment_hashes
        for name, res in p.arms.items():
            assert res.answer_ids == r.arms[name].answer_ids, (p.case_id, name)
    manifest = read_manifest(out)
    assert manifest.status == "complete" and len(manifest.sessions) == 2
    assert not (out / "audit.json").exists()


def test_run_dir_of_other_arm_set_is_refused(smollm2_run: Path, tmp_path: Path, capsys):
    import shutil

    from kvaudit.cli import main

    dst = tmp_path / "run"
    shutil.copytree(smollm2_run, dst)
    code = main(["run", "--dataset", str(EXAMPLE), "--out", str(dst), "--arms", "recompute,reuse",
                 "--max-new-tokens", "8", "--no-progress"])
    assert code == 2
    assert "different arms" in capsys.readouterr().err


def test_bad_dataset_names_file_line_and_field(tmp_path: Path, capsys):
    from kvaudit.cli import main

    d = tmp_path / "ds"
    d.mkdir()
    (d / "segments.jsonl").write_text((EXAMPLE / "segments.jsonl").read_text())
    lines = (EXAMPLE / "cases.jsonl").read_text().splitlines()
    bad = json.loads(lines[2])
    bad["answers"] = "Lisa"
    lines[2] = json.dumps(bad)
    (d / "cases.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["run", "--dataset", str(d), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "cases.jsonl, line 3" in err and "'answers'" in err

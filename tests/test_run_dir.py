"""The run directory's one reader and writer (kvaudit.core.run_dir.RunDir): appended and whole-file
pairs are the same bytes, a resumed run's tail is mended, missing files are named, and no module
outside core builds a run file's path itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvaudit.core.errors import DatasetError, KvauditError
from kvaudit.core.run_dir import RunDir
from kvaudit.core.run_format import (
    ATTESTATION_FILE,
    AUDIT_FILE,
    MANIFEST_FILE,
    PAIRS_FILE,
    REPORT_FILE,
    SAMPLES_FILE,
    SIMULATION_FILE,
    SUMMARY_FILE,
)
from kvaudit.testing.synthetic import make_pairs, make_run

ROOT = Path(__file__).resolve().parents[1] / "kvaudit"


def test_appended_pairs_are_the_bytes_of_a_whole_file_write(tmp_path):
    pairs = make_pairs(2, seed=3, leak_probes=0)
    whole, appended = RunDir(tmp_path / "a"), RunDir(tmp_path / "b")
    whole.path.mkdir()
    whole.write_pairs(pairs)
    with appended.appending() as out:
        for p in pairs[:5]:
            out.append(p)
    with appended.appending() as out:  # a second session appends the rest
        for p in pairs[5:]:
            out.append(p)
        assert out.written == len(pairs) - 5
    assert appended.pairs_file.read_bytes() == whole.pairs_file.read_bytes()
    assert [p.case_id for p in whole.read_pairs()] == [p.case_id for p in pairs]


def test_finished_keeps_a_complete_unterminated_record_and_cuts_a_torn_one(tmp_path):
    run = RunDir(tmp_path)
    run.write_pairs(make_pairs(1, seed=1, leak_probes=0)[:3])
    raw = run.pairs_file.read_bytes()
    run.pairs_file.write_bytes(raw[:-1])  # the last newline lost
    assert len(run.finished()) == 3
    assert run.pairs_file.read_bytes() == raw
    run.pairs_file.write_bytes(raw[:-40])  # killed mid-line
    assert len(run.finished()) == 2
    assert run.pairs_file.read_bytes().endswith(b"\n")


def test_require_names_what_is_missing(tmp_path):
    with pytest.raises(KvauditError, match="run directory not found"):
        RunDir(tmp_path / "nope").require()
    tmp_path.joinpath("r").mkdir()
    with pytest.raises(KvauditError, match=f"no {MANIFEST_FILE}"):
        RunDir(tmp_path / "r").require()
    run = RunDir(make_run(tmp_path / "s", n_per_task=1))
    run.pairs_file.write_text("")
    with pytest.raises(KvauditError, match="no pair records"):
        run.read_pairs(required=True)
    assert run.read_pairs() == []


def test_a_simulation_that_is_not_an_object_is_refused(tmp_path):
    run = RunDir(tmp_path)
    assert run.read_simulation() is None
    run.simulation_file.write_text("[1, 2]")
    with pytest.raises(DatasetError, match=f"{SIMULATION_FILE}: expected a JSON object"):
        run.read_simulation()


def test_a_synthetic_run_reads_back_through_the_same_reader(tmp_path):
    run = RunDir(make_run(tmp_path, n_per_task=2))
    n = run.read_manifest().dataset.n_cases
    assert run.read_audit().passed
    assert len(run.require().read_pairs(required=True)) == n > 0


RUN_FILES = (MANIFEST_FILE, PAIRS_FILE, AUDIT_FILE, SUMMARY_FILE, REPORT_FILE, SAMPLES_FILE, ATTESTATION_FILE)
NAMES = ("MANIFEST_FILE", "PAIRS_FILE", "AUDIT_FILE", "SUMMARY_FILE", "REPORT_FILE", "SAMPLES_FILE",
         "ATTESTATION_FILE")
# The modules that define a run file's format and may build its path: the run format itself, each
# typed record's reader, the lock, the attestation (which hashes the files), and RunDir.
OWNERS = {"core/run_format.py", "core/run_dir.py", "core/manifest.py", "core/audit_format.py",
          "core/run_lock.py", "core/attestation.py"}


def test_no_module_outside_the_run_format_builds_a_run_files_path():
    names, files = "|".join(NAMES), "|".join(re.escape(f) for f in RUN_FILES)
    joined = re.compile(rf"/\s*(?:{names})\b|/\s*[\"'](?:{files})[\"']")
    offenders = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel in OWNERS:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if joined.search(line):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "run files are read and written through RunDir:\n" + "\n".join(offenders)

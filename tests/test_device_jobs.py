"""benchmarks/h200/bg.sh, the detached-job helper every GPU benchmark runs through (a device call
lasts at most 600 s, a 500-request replay longer): a job's output and files come back packed, and a
poll on a machine that never ran the job (the lease ended and the next call met a fresh one) says
so at once instead of waiting out its seconds and printing "JOB RUNNING"."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

BG = Path(__file__).resolve().parents[1] / "benchmarks" / "h200" / "bg.sh"


def _bg(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(BG), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OUT": str(out)})


def test_a_job_polled_right_after_its_start_comes_back_with_its_files(tmp_path):
    job, out = tmp_path / "rs", tmp_path / "out"
    out.mkdir()
    started = _bg(out, "start", str(job), f"echo 42 > '{job}/n.txt'; echo served; sleep 1")
    assert started.returncode == 0 and "started" in started.stdout
    polled = _bg(out, "poll", str(job), "30")
    assert polled.returncode == 0, polled.stderr
    assert "served" in polled.stdout and "JOB ENDED rc=0" in polled.stdout
    with tarfile.open(out / "rs.tgz") as tgz:
        assert {"./log", "./rc", "./n.txt"} <= set(tgz.getnames())


def test_a_poll_on_a_machine_that_never_ran_the_job_says_so_at_once(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    polled = _bg(out, "poll", str(tmp_path / "rs"), "600")  # _bg's 60 s timeout fails a poll that waits
    assert polled.returncode == 2 and "lease that ran it has ended" in polled.stderr
    assert "JOB RUNNING" not in polled.stdout
    assert list(out.iterdir()) == []  # no half-written archive left to be mistaken for results

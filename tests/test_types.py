"""The type checker (mypy, configured in pyproject.toml's [tool.mypy]) passes on core, stats and
reports, and would catch a misspelled word of the vocabulary (kvaudit.core.vocabulary): a probe
file that writes a gate status, a check kind and an arm role wrongly fails with one error each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = '''
from kvaudit.core.arms import ArmSpec
from kvaudit.reports.gate_checks import ThresholdResult

row = ThresholdResult("overall quality", "delta", "pas", "lower bound -1.0 pts", "lower bound >= -2.0 pts")
kind = ThresholdResult("overall quality", "deltas", "pass", "", "")
arm = ArmSpec("reuse2", "neutral", "under test")
'''


def test_types_hold_and_catch_a_misspelled_word(tmp_path):
    probe = tmp_path / "vocabulary_probe.py"
    probe.write_text(PROBE)
    # one run for both (mypy's cold start is most of its time): the package's files, then the probe
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "kvaudit/core", "kvaudit/stats",
                           "kvaudit/reports", str(probe)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    in_package = [e for e in errors if probe.name not in e]
    assert not in_package, "\n".join(in_package[:20])
    in_probe = [e for e in errors if probe.name in e]
    assert len(in_probe) == 3, done.stdout[-3000:]
    assert "'pas'" in in_probe[0] and "'deltas'" in in_probe[1] and "'under test'" in in_probe[2]
    assert done.returncode == 1

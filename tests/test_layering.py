"""The package's layering (pyproject.toml's import-linter contract) holds, and would catch an
inverted import: the same contract on a copy of the package with one upward import fails, and
one engine importing another breaks the engines' independence."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lint(root: Path) -> subprocess.CompletedProcess:
    """import-linter's own command on ``root`` (its package first on the path, no cache)."""
    exe = Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(exe), "--config", str(root / "pyproject.toml"), "--no-cache"],
                          cwd=root, capture_output=True, text=True, timeout=300, env=env)


def test_layers_are_kept():
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 kept, 0 broken" in done.stdout


def _lint_with(tmp_path: Path, module: str, addition: str) -> subprocess.CompletedProcess:
    """The contracts on a copy of the package with ``addition`` appended to ``module`` (a path)."""
    shutil.copytree(ROOT / "kvaudit", tmp_path / "kvaudit")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "kvaudit" / module
    target.write_text(target.read_text() + "\n\n" + addition + "\n")
    return _lint(tmp_path)


def test_an_inverted_import_breaks_the_contract(tmp_path):
    done = _lint_with(tmp_path, "core/run_format.py", "def _upward():\n    from kvaudit.reports import gate  # noqa: F401")
    assert done.returncode != 0
    assert "kvaudit.core.run_format -> kvaudit.reports.gate" in done.stdout


def test_an_engine_importing_another_breaks_the_rooms(tmp_path):
    done = _lint_with(tmp_path, "runners/engines/http/backend.py",
                      "def _across():\n    from kvaudit.runners.engines.vllm import store  # noqa: F401")
    assert done.returncode != 0
    assert "engines are rooms: no engine imports another BROKEN" in done.stdout


def test_the_demo_may_not_import_the_cli_that_lists_it(tmp_path):
    done = _lint_with(tmp_path, "demo.py", "def _cycle():\n    from kvaudit.cli import main  # noqa: F401")
    assert done.returncode != 0
    assert "kvaudit.demo -> kvaudit.cli" in done.stdout

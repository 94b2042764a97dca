"""A `kvaudit run --backend openai` against a test server, and its audit's checks by name."""

from __future__ import annotations

import json
from pathlib import Path

from kvaudit.cli import main


def run(url: str, dataset: Path, out: Path, arms: str, *extra: str) -> int:
    return main(["run", "--backend", "openai", "--base-url", url, "--dataset", str(dataset), "--out", str(out),
                 "--arms", arms, "--max-new-tokens", "8", "--no-progress", *extra])


def checks(run_dir: Path) -> tuple[int, dict]:
    code = main(["audit", str(run_dir)])
    return code, {c["name"]: c for c in json.loads((run_dir / "audit.json").read_text())["checks"]}

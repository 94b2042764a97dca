"""A `kvaudit run --backend openai` against a test server, and its audit's checks by name; a
`kvaudit replay` against one through a recording proxy, with what it asked the server for."""

from __future__ import annotations

import json
from pathlib import Path

from kvaudit.cli import main
from kvaudit.core.replay_format import RequestRecord

from .lying_proxy import lying_proxy


def run(url: str, dataset: Path, out: Path, arms: str, *extra: str) -> int:
    return main(["run", "--backend", "openai", "--base-url", url, "--dataset", str(dataset), "--out", str(out),
                 "--arms", arms, "--max-new-tokens", "8", "--no-progress", *extra])


def checks(run_dir: Path) -> tuple[int, dict]:
    code = main(["audit", str(run_dir)])
    return code, {c["name"]: c for c in json.loads((run_dir / "audit.json").read_text())["checks"]}


def recorded_replay(server: str, tmp_path: Path) -> tuple[list[RequestRecord], list[dict], list[dict]]:
    """Three requests replayed at 20/s (recompute, 4 tokens each) through a recording proxy:
    (their records, the bodies of the replayed requests, every completion body the server got)."""
    from kvaudit.core.replay_format import ReplayDir

    wl = tmp_path / "w.jsonl"
    assert main(["generate", "workload", "--out", str(wl), "--requests", "3", "--documents", "3", "--queries", "2",
                 "--docs-per-request", "2", "--doc-tokens", "uniform:30:50", "--no-progress"]) == 0
    seen: list[dict] = []
    with lying_proxy(server, "record", seen) as url:
        assert main(["replay", "--backend", "openai", "--base-url", url, "--workload", str(wl), "--cache-policy",
                     "recompute", "--cache-budget", "1MB", "--rate", "20", "--max-new-tokens", "4",
                     "--out", str(tmp_path / "replay"), "--no-progress"]) == 0
    recs = ReplayDir(tmp_path / "replay").read_requests()
    lengths = {r.n_prompt_tokens for r in recs}
    return recs, [b for b in seen if len(b["prompt"]) in lengths and b["max_tokens"] == 4], seen

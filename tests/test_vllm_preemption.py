"""A batch that vLLM must preempt, end to end (CPU, SmolLM2, the project's KV connector): the
requests it preempts after their segment KV was loaded come back with new blocks, the connector
loads their range into those, and every answer is the one the case gets alone. The connector's
reading of vLLM's resumed requests is tested without an engine (tests/test_connector_resumed.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from .conftest import BOXOFFICE5  # noqa: E402

PROBE = Path(__file__).with_name("vllm_preemption_probe.py")


def test_a_preempted_request_reloads_its_segment_kv_and_answers_as_it_does_alone(vllm_prewarmed, tmp_path):
    from kvaudit.cli import main

    data = tmp_path / "bo10"
    assert BOXOFFICE5[:2] == ["--cases", "5"]
    assert main(["generate", "boxoffice", "--out", str(data), "--cases", "10", *BOXOFFICE5[2:], "--no-progress"]) == 0
    done = vllm_prewarmed.run_script(PROBE, [str(data)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["preempted_together"] >= 1, got  # the KV space ran out mid-batch
    assert got["preempted_alone"] == 0, got  # the reference: one request at a time fits
    assert all(n > 0 for n in got["reused"]), got  # every request loaded segment KV
    # one load per request, and one more for each request preempted after its load and resumed
    assert got["loads_together"] > got["requests"], got
    assert all(got["same"]), got
    # on the replay's path every request's record carries its preemptions (its own and its warm-ups'),
    # and together they are every preemption the engine counted: none lost, none counted twice
    assert None not in got["live_recorded"] and len(got["live_recorded"]) == got["requests"], got
    assert sum(got["live_recorded"]) == got["live_engine"] >= 1, got
    assert got["live_warmed"] > 0, got  # caches emptied first: the requests warmed their documents

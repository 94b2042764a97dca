"""The connector's reading of vLLM's scheduler output for requests back from preemption: their
``new_block_ids`` replace their blocks (vLLM's contract, stated on ``CachedRequestData``), so a
save or load planned for such a request must use the new blocks whole. Run in .venv-vllm."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm.v1.core.sched.output import CachedRequestData  # noqa: E402

from kvaudit.runners.engines.vllm.connector import _resumed  # noqa: E402


def test_requests_back_from_preemption_are_read_from_vllms_own_scheduler_output():
    cached = CachedRequestData.make_empty()
    cached.req_ids = ["a", "b"]
    cached.resumed_req_ids = {"b"}
    cached.new_block_ids = [([7],), ([1, 2, 3],)]
    assert _resumed(cached) == {"b"}
    assert _resumed(CachedRequestData.make_empty()) == set()
    # older vLLM: one flag per scheduled request
    old = SimpleNamespace(req_ids=["a", "b", "c"], resumed_from_preemption=[False, True, True])
    assert _resumed(old) == {"b", "c"}

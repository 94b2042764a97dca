"""What each engine dialect asks a server for: the audit's top-20 first-token log-probabilities,
or none for a replay's requests (``top_logprobs=0``), as far as the engine still shows the
generated ids (llama.cpp shows them only inside its log-probabilities: one is asked)."""

from __future__ import annotations

import pytest

from kvaudit.runners.engines.http.dialects import BY_OWNER, GENERIC, LOGPROBS


def _body(owner: str, top: int, bypass: bool = False) -> dict:
    d = BY_OWNER.get(owner, GENERIC)
    return d.request("m", [1, 2, 3], max_tokens=4, salt=None, kv_transfer_params=None, stop_token_ids=None,
                     stream=True, logprob_token_ids=None, bypass_cache=bypass, top_logprobs=top)


@pytest.mark.parametrize("owner, asked, none", [
    ("vllm", {"logprobs": LOGPROBS}, {}),
    ("generic", {"logprobs": LOGPROBS}, {}),
    ("llamacpp", {"logprobs": LOGPROBS}, {"logprobs": 1}),
    ("sglang", {"return_logprob": True, "top_logprobs_num": LOGPROBS}, {}),
])
def test_a_replay_request_asks_no_more_log_probabilities_than_the_ids_need(owner, asked, none):
    keys = ("logprobs", "return_logprob", "top_logprobs_num")
    assert {k: v for k, v in _body(owner, LOGPROBS).items() if k in keys} == asked
    assert {k: v for k, v in _body(owner, 0).items() if k in keys} == none


def test_sglang_keeps_asking_for_log_probabilities_where_they_bypass_its_cache():
    body = _body("sglang", 0, bypass=True)
    assert body["logprob_start_len"] == 0 and body["return_logprob"] is True and body["top_logprobs_num"] == 0

"""SGLang's native /generate as kvaudit reads it (kvaudit.runners.engines.http.dialects.SglangDialect):
the request kvaudit sends, and its answers read the same from SGLang's cumulative stream (its
default), its incremental stream (--incremental-streaming-output) and a whole response. The chunks
are SGLang 0.5.17's shapes (srt/managers/tokenizer_manager output processing); the dialect against a
real engine is tests/test_http_prefix_server.py's stand-in test."""

from __future__ import annotations

import pytest

from kvaudit.core.errors import KvauditError
from kvaudit.runners.engines.http.client import _Response
from kvaudit.runners.engines.http.dialects import LOGPROB_IDS, SglangDialect, detect

D = SglangDialect()
TOP0 = [[-0.1, 42, "a"], [-2.5, 7, "b"]]  # the first generated token's top log-probabilities
TOP1 = [[-0.3, 9, "c"]]


def _meta(n: int, top: list, *, cached: int = 96, finish: dict | None = None) -> dict:
    return {"id": "r", "prompt_tokens": 128, "completion_tokens": n, "cached_tokens": cached,
            "output_top_logprobs": top, "finish_reason": finish}


CUMULATIVE = [{"text": None, "output_ids": [42], "meta_info": _meta(1, [TOP0])},
              {"text": None, "output_ids": [42, 9], "meta_info": _meta(2, [TOP0, TOP1])},
              {"text": "ab", "output_ids": [42, 9, 2], "meta_info": _meta(3, [TOP0, TOP1, []],
                                                                          finish={"type": "stop", "matched": 2})}]
INCREMENTAL = [{"text": "a", "output_ids": [42], "meta_info": _meta(1, [TOP0])},
               {"text": "b", "output_ids": [9], "meta_info": _meta(2, [TOP1])},
               {"text": "", "output_ids": [2], "meta_info": _meta(3, [[]], finish={"type": "stop", "matched": 2})}]
WHOLE = [CUMULATIVE[-1]]


@pytest.mark.parametrize("chunks", [CUMULATIVE, INCREMENTAL, WHOLE], ids=["cumulative", "incremental", "whole"])
def test_every_stream_shape_reads_the_same_answer(chunks):
    r = _Response(0.0, D)
    for c in chunks:
        r.add(c)
    out = r.completion(1.0)
    assert out.token_ids == [42, 9, 2] and out.first_lp == {42: -0.1, 7: -2.5}
    assert out.logprob_keys == LOGPROB_IDS and out.cached_tokens == 96 and out.prompt_tokens == 128
    assert out.finish_reason == "stop" and out.prompt_ids is None and not r.missing_ids()


def test_a_repeated_id_in_an_incremental_stream_is_not_read_as_cumulative():
    r = _Response(0.0, D)
    for ids, n in (([5], 1), ([5], 2), ([5, 5], 4)):
        r.add({"output_ids": ids, "meta_info": _meta(n, [[[-0.1, 5, "x"]]])})
    assert r.tokens == [5, 5, 5, 5]


def test_the_prompt_echo_an_abort_and_an_error():
    r = _Response(0.0, D)
    r.add({"output_ids": [1], "meta_info": {**_meta(1, [TOP0], cached=0), "prompt_tokens": 3,
                                            "input_token_logprobs": [[None, 11, None], [-1.0, 12, None],
                                                                     [-2.0, 13, None]],
                                            "finish_reason": {"type": "abort", "message": "oom"}}})
    out = r.completion(1.0)
    assert out.prompt_ids == [11, 12, 13] and out.finish_reason == "error"
    r = _Response(0.0, D)
    r.add({"error": {"message": "bad request"}})
    assert r.error == {"message": "bad request"}


def test_the_request_names_the_namespace_and_the_bypass():
    body = D.request("m", [1, 2, 3], max_tokens=4, salt="tenant", kv_transfer_params=None, stop_token_ids=[2, 1],
                     stream=True, logprob_token_ids=[9, 9, 8], bypass_cache=False)
    assert body == {"input_ids": [1, 2, 3], "stream": True, "return_logprob": True, "top_logprobs_num": 20,
                    "sampling_params": {"max_new_tokens": 4, "temperature": 0.0, "skip_special_tokens": True,
                                        "stop_token_ids": [1, 2]},
                    "token_ids_logprob": [8, 9], "extra_key": "tenant"}
    bypass = D.request("m", [1], max_tokens=1, salt=None, kv_transfer_params=None, stop_token_ids=None,
                       stream=False, logprob_token_ids=None, bypass_cache=True)
    assert bypass["logprob_start_len"] == 0 and "extra_key" not in bypass
    with pytest.raises(KvauditError, match="connector protocol needs vLLM"):
        D.request("m", [1], max_tokens=1, salt=None, kv_transfer_params={"x": 1}, stop_token_ids=None, stream=False,
                  logprob_token_ids=None, bypass_cache=False)
    assert detect({"id": "m", "owned_by": "sglang"}).name == "sglang"

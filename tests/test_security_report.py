"""The report's security probes on hand-built records: cold / flushed / warm attribution, isolation
and timing from the tenant-probe arms (no server: the real-server runs are tests/test_http_*.py)."""

from __future__ import annotations

from kvaudit.core.run_format import ArmResult, PairRecord
from kvaudit.reports.security import cold_flushed_warm, security_summary, timing_probes


def arm(name: str, answer_ids: list[int], *, ttft: float = 0.1, cached: int | None = 0) -> ArmResult:
    return ArmResult(arm=name, answer=" ".join(map(str, answer_ids)), answer_ids=answer_ids, top_k=[(1, 0.0)],
                     margin=1.0, ttft_s=ttft, tokens_reused=cached or 0, tokens_computed=10, ids_hash="h",
                     segment_hashes=[], truncation={}, decoding={}, cache_hit_tokens=cached or 0,
                     engine={"cached_tokens": cached, "prompt_ids_hash": "h", "model": "m"})


def pair(i: int, cold: list[int], flushed: list[int], warm: list[int], *, warm_ttft: float = 0.02,
         other_cached: int = 0) -> PairRecord:
    arms = {"recompute": arm("recompute", cold, ttft=0.2),
            "prefix_cache_cold": arm("prefix_cache_cold", cold, ttft=0.2),
            "prefix_cache_flushed": arm("prefix_cache_flushed", flushed, ttft=0.2),
            "prefix_cache": arm("prefix_cache", warm, ttft=warm_ttft, cached=96),
            "prefix_cache_other_tenant": arm("prefix_cache_other_tenant", cold, ttft=0.2 + 0.001 * i,
                                             cached=other_cached)}
    return PairRecord(case_id=f"c{i}", task="single_doc", strata={}, n_prompt_tokens=128, ids_hash="h",
                      segment_ids=[], segment_hashes=[], segment_spans=[], truncation={}, decoding={},
                      arm_order=list(arms), arms=arms)


def test_flips_are_attributed_to_the_engine_or_to_the_cache():
    pairs = [pair(0, [1], [1], [1]),        # stable
             pair(1, [1], [2], [2]),        # the cold rerun already differs: the engine
             pair(2, [1], [1], [3]),        # only warm differs: the cache
             pair(3, [1], [2], [3])]        # both
    c = cold_flushed_warm(pairs)
    assert c["counts"] == {"stable": 1, "engine": 1, "cache": 1, "both": 1}
    assert c["cases"]["cache"] == ["c2"]


def test_isolation_and_timing_come_from_the_tenant_probe():
    good = [pair(i, [1], [1], [1]) for i in range(12)]
    s = security_summary(good, timing_probes(good, 0.95))
    (iso,) = s["isolation"]
    assert iso["what"] == "prefix cache" and iso["verdict"] == "pass"
    (t,) = s["timing"]
    assert t["auc"] == 1.0 and t["lower"] > 0.75 and t["requests_needed"] == 1  # hits 10x faster every time
    leaky = good[:11] + [pair(11, [1], [1], [1], other_cached=64)]
    (iso,) = security_summary(leaky, timing_probes(leaky, 0.95))["isolation"]
    assert iso["verdict"] == "fail" and iso["leaked"] == ["c11"]

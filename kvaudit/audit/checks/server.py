"""The server checks: what a black-box serving engine reported, held against what each arm was.

Runs made over HTTP (:mod:`kvaudit.runners.engines.http.backend`) record per arm what the server said
about its request (``ArmResult.engine``). These checks hold that evidence against the arm's
spec; evidence the server does not give is "cannot judge", never a pass. On in-process runs
(no ``engine`` records) the three evidence checks do not apply (scope ``server``): they say "does not
apply: not a server run", never "pass".

* ``server_consumed_ids``: the prompt ids the server echoes equal the ids kvaudit assembled.
* ``server_model``: every response names the model the server listed when the run began.
* ``server_cache_evidence``: the reference and noise-floor arms found nothing cached; kvaudit's
  connector loaded exactly [head][segments]; the server's own reuse path (``--reuse-protocol
  server``) reused something somewhere (a reuse arm that never reuses measures nothing); every
  arm's recorded reuse equals what the server reported.
* ``tenant_isolation`` (not required: a security finding, gated by the policy): the same
  tenant's repeat is served from the cache and another tenant's identical request is not
  (:func:`kvaudit.stats.timing.isolation_decision`), for the prefix cache and for segment reuse.
"""

from __future__ import annotations

from collections import defaultdict

from kvaudit.audit.checks.base import check, from_problems, not_run, result, server_decides_reuse
from kvaudit.audit.checks.loading import LoadedRun
from kvaudit.core.arms import FRESH_ROLES, arm_for, arms_where, get_arm, known_arm
from kvaudit.core.run_format import PairRecord
from kvaudit.stats.timing import IsolationResult, isolation_decision


def server_arms(p: PairRecord) -> dict:
    """The arms of ``p`` that carry a server's report."""
    return {name: r for name, r in p.arms.items() if r.engine is not None}


@check("server_consumed_ids", required=True, scope="server")
def check_server_consumed_ids(run: LoadedRun):
    """The prompt ids the server says it consumed are kvaudit's, for every arm of every case."""
    problems: dict[str, list[str]] = defaultdict(list)
    unechoed = counted = 0
    n = 0
    for p in run.pairs:
        for name, r in server_arms(p).items():
            n += 1
            echoed = r.engine.get("prompt_ids_hash")
            count = r.engine.get("prompt_tokens")
            if count is not None and int(count) != p.n_prompt_tokens:
                problems[p.case_id].append(f"arm '{name}': the server counted {count} prompt tokens, kvaudit sent "
                                           f"{p.n_prompt_tokens}")
            if echoed is None:
                unechoed += 1
                counted += count is not None
            elif echoed != r.ids_hash:
                problems[p.case_id].append(f"arm '{name}': the server consumed other ids (hash {echoed[:12]} "
                                           f"vs kvaudit's {r.ids_hash[:12]})")
    if problems:
        return from_problems(problems, "")
    if unechoed:
        shown = (f"; its prompt-token counts equal kvaudit's on {counted} of them, which rules out a token added "
                 "or dropped but not one replaced") if counted else ""
        return result(False, f"the server did not echo the prompt ids of {unechoed} of {n} requests "
                             f"(vLLM: `return_token_ids`; llama.cpp echoes none; SGLang only where no prefix may match): what "
                             f"it consumed cannot be shown"
                             f"{shown}", cannot_judge=True)
    return result(True, f"the server echoed exactly kvaudit's prompt ids on all {n} arm requests")


@check("server_model", required=True, scope="server")
def check_server_model(run: LoadedRun):
    """Every response names the model the server listed when the run began."""
    listed = ((run.manifest.backend or {}).get("server_model") or {}).get("id")
    if not listed:
        return result(False, "the manifest records no model listed by the server", cannot_judge=True)
    problems: dict[str, list[str]] = defaultdict(list)
    unnamed = 0
    for p in run.pairs:
        for name, r in server_arms(p).items():
            got = r.engine.get("model")
            if got is None:
                unnamed += 1
            elif got != listed:
                problems[p.case_id].append(f"arm '{name}' was answered by model {got!r}, not {listed!r}")
    if problems:
        return from_problems(problems, "")
    if unnamed:
        return result(False, f"{unnamed} responses name no model (SGLang's /generate names none)", cannot_judge=True)
    root = ((run.manifest.backend or {}).get("server_model") or {}).get("root")
    return result(True, f"every response names {listed!r}" + (f" (served from {root})" if root else ""))


def _segment_end(p: PairRecord) -> int:
    return max((int(e) for _, e in p.segment_spans), default=0)


@check("server_cache_evidence", required=True, scope="server")
def check_server_cache_evidence(run: LoadedRun):
    """Cached prompt tokens as the server reported them: none for the reference and the noise
    floor, exactly [head][segments] through kvaudit's connector, more than none somewhere for the
    server's own reuse path, and equal to the reuse each arm recorded."""
    # kvaudit's connector loads exactly what it is told; the server's own path decides
    exact = not server_decides_reuse(run)
    probe = (run.manifest.backend or {}).get("cache_probe") or {}
    shared = probe.get("caching") and probe.get("salt_isolates") is False  # salts do not isolate
    problems: dict[str, list[str]] = defaultdict(list)
    unreported = 0
    server_reuse: dict[str, int] = defaultdict(int)
    for p in run.pairs:
        for name, r in server_arms(p).items():
            cached = r.engine.get("cached_tokens")
            if cached is None:
                unreported += 1
                continue
            spec = get_arm(name) if known_arm(name) else None
            if spec is None:
                continue
            if spec.role in FRESH_ROLES:
                if cached:
                    problems[p.case_id].append(f"arm '{name}' must bypass every cache but the server reported "
                                               f"{cached} cached prompt tokens")
            elif spec.loads_segment_kv:
                if shared and not exact:
                    problems[p.case_id].append(
                        f"arm '{name}' ran on the server's own reuse path, whose cache_salt does not isolate: its "
                        f"{cached} cached tokens could be exact prefixes left by any earlier request, not segment reuse")
                    continue
                if exact:
                    if cached != _segment_end(p):
                        problems[p.case_id].append(f"arm '{name}': the server reported {cached} cached tokens; "
                                                   f"kvaudit's connector loads exactly {_segment_end(p)}")
                else:
                    server_reuse[name] += cached
                    if r.tokens_reused != cached:
                        problems[p.case_id].append(f"arm '{name}' recorded {r.tokens_reused} reused tokens, the "
                                                   f"server reported {cached}")
            elif spec.source == "engine_prefix":
                if r.tokens_reused != cached:
                    problems[p.case_id].append(f"arm '{name}' recorded {r.tokens_reused} reused tokens, the server "
                                               f"reported {cached}")
                if shared and spec.role == "engine_prefix" and not r.engine.get("cache_reset"):
                    problems[p.case_id].append(
                        f"arm '{name}' is a first arrival on a server whose cache_salt does not isolate, sent without "
                        f"a cache reset before it: its {cached} cached tokens may be what an earlier run left")
    if problems:
        return from_problems(problems, "")
    if unreported:
        return result(False, f"the server reported no cached-token count for {unreported} requests (vLLM: "
                             "--enable-prompt-tokens-details): cache bypass and reuse cannot be shown", cannot_judge=True)
    vacuous = [a for a, total in server_reuse.items() if total == 0]
    if vacuous:
        return result(False, f"the server's reuse path reused no token for arm(s) {', '.join(vacuous)} on any case, "
                             "after warm-ups with every document: it has no segment reuse, so these arms measure "
                             "nothing (audit its prefix cache with the prefix_cache arms instead)")
    parts = ["reference and noise-floor requests found nothing cached"]
    if exact:
        parts.append("kvaudit's connector loaded exactly [head][segments] on every cached-segment arm")
    if server_reuse:
        n_prompt = sum(p.n_prompt_tokens for p in run.pairs)
        parts.append("the server's own reuse found " + ", ".join(
            f"{a} {t} of {n_prompt} prompt tokens" for a, t in sorted(server_reuse.items())))
    return result(True, "; ".join(parts))


def _isolation_pairs(pairs: list[PairRecord], same_arm: str, probe_arm: str) -> tuple[list[str], list[int], list[int]]:
    ids, same, other = [], [], []
    for p in pairs:
        a, b = p.arms.get(same_arm), p.arms.get(probe_arm)
        if a is None or b is None or a.engine is None or b.engine is None:
            continue
        if a.engine.get("cached_tokens") is None or b.engine.get("cached_tokens") is None:
            continue
        ids.append(p.case_id)
        same.append(int(a.engine["cached_tokens"]))
        other.append(int(b.engine["cached_tokens"]))
    return ids, same, other


# What each tenant probe checks: (what, the same tenant's arm role, the probe's role).
PROBES = (("prefix cache", "engine_prefix_warm", "tenant_probe"),
          ("segment reuse", "under_test", "segment_tenant_probe"))


def probe_arms(pairs: list[PairRecord]) -> list[tuple[str, str, str]]:
    """``(what, same-tenant arm, probe arm)`` for the tenant probes that ran in ``pairs``."""
    ran = {a for p in pairs for a in p.arms}
    out = []
    for what, same_role, probe_role_ in PROBES:
        same_arm = arm_for(same_role)
        for probe_arm in arms_where(role=probe_role_):
            if probe_arm in ran and same_arm in ran:
                out.append((what, same_arm, probe_arm))
    return out


def isolation_results(pairs: list[PairRecord]) -> dict[str, IsolationResult]:
    """``{"prefix cache" | "segment reuse": IsolationResult}`` for the probes that ran."""
    out = {}
    for what, same, probe in probe_arms(pairs):
        ids, same_hits, other_hits = _isolation_pairs(pairs, same, probe)
        out[what] = isolation_decision(same_hits, other_hits, case_ids=ids)
    return out


@check("tenant_isolation", required=False, scope="reuse")
def check_tenant_isolation(run: LoadedRun):
    """Another tenant's identical request is never served from the cache, while the same
    tenant's is (so the check cannot pass with caching off)."""
    res = isolation_results(run.pairs)
    if not res:
        return not_run("no tenant probe (reuse_other_tenant or prefix_cache_other_tenant arms)")
    parts = [f"{what}: {r.verdict} ({r.reason})" for what, r in res.items()]
    leaked = sorted({c for r in res.values() for c in r.leaked})
    if leaked:
        return result(False, "; ".join(parts), leaked,
                      warning=f"another tenant was served from the cache on {len(leaked)} case(s)")
    if any(r.verdict != "pass" for r in res.values()):
        return result(False, "; ".join(parts), cannot_judge=True)
    return result(True, "; ".join(parts))

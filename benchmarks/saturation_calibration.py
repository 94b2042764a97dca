"""Operating characteristic of the past-saturation rule (``kvaudit.stats.saturation``): how often it
flags a load the server sustains, and misses one it does not, by simulation.

A first-come-first-served queue with ``servers`` servers (1: prefills one after another; 8: eight
requests served side by side), lognormal service times of mean 1 (spread ``sigma``), Poisson
arrivals at ``utilisation * servers`` per unit time, starting empty as a replay's load does. TTFT
is a request's wait plus its service. For each utilisation, replay length and queue, draws ``reps``
replays and counts those the rule calls past saturation. Below 1 that is a false flag (the SLO
reading then drops a load the server sustains: conservative); above 1 a miss is the error that
matters (a load the server cannot sustain could be named sustainable). The stated characteristic
(``CLAIMS``, docs/replay.md), each within three Monte Carlo standard errors: replays of 200 requests
or more miss at most 10% of loads at utilisation 1.2 or more and flag at most 5% at 0.5 or less;
of 500 or more, at most 5% either way at 1.2 or more and 0.7 or less. Between, and for shorter
replays, the rule is reported, not claimed. A fast slice runs in tests/test_saturation.py.

    python benchmarks/saturation_calibration.py [--reps 400] [--seed 0]

``--replications K``: a load replayed K times (``kvaudit replay --replications``) is past
saturation when any of its replays is; each cell then draws ``reps`` groups of K replays. The same
claims are checked (a miss needs every replay to miss, so misses only fall; false flags may rise
up to K times).

    python benchmarks/saturation_calibration.py --replications 6 --reps 200 --lengths 200,500 --utilisations 0.5,0.7,1.2,1.5
"""

from __future__ import annotations

import argparse
import heapq

import numpy as np

from kvaudit.stats.saturation import ttft_growth

UTILISATIONS = (0.5, 0.7, 0.8, 0.9, 0.95, 1.05, 1.1, 1.2, 1.5, 2.0)
LENGTHS = (40, 80, 200, 500)
SERVERS = (1, 8)
SIGMAS = (0.5, 1.0)
# (at least this many requests, false flags at or below this utilisation at most, misses at or above at most)
CLAIMS = ((200, 0.5, 0.05, 1.2, 0.10), (500, 0.7, 0.05, 1.2, 0.05))


def claimed_limit(n: int, utilisation: float) -> float | None:
    """The error rate claimed for this replay length and utilisation, or None where none is."""
    limits = [fa if utilisation <= f else ma for m, f, fa, mu, ma in CLAIMS
              if n >= m and (utilisation <= f or utilisation >= mu)]
    return min(limits) if limits else None


def replay_queue(rng: np.random.Generator, n: int, utilisation: float, servers: int = 1,
                 sigma: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """One replay of ``n`` requests: arrival times and TTFTs (wait plus service), starting empty."""
    arrivals = np.cumsum(rng.exponential(1.0 / (utilisation * servers), n))
    service = rng.lognormal(-sigma * sigma / 2, sigma, n)  # mean 1
    free = [0.0] * servers
    ttft = np.empty(n)
    for i in range(n):
        start = max(arrivals[i], heapq.heappop(free))
        heapq.heappush(free, start + service[i])
        ttft[i] = start + service[i] - arrivals[i]
    return arrivals, ttft


def flag_rate(rng: np.random.Generator, reps: int, n: int, utilisation: float, servers: int, sigma: float,
              replications: int = 1) -> float:
    """The share of ``reps`` loads called past saturation: any of a load's ``replications`` replays."""
    flagged = 0
    for _ in range(reps):
        for _ in range(replications):
            g = ttft_growth(*replay_queue(rng, n, utilisation, servers, sigma))
            if g and g["past_saturation"]:
                flagged += 1
                break
    return flagged / reps


def grid(reps: int = 400, seed: int = 0, utilisations: tuple[float, ...] = UTILISATIONS,
         lengths: tuple[int, ...] = LENGTHS, servers: tuple[int, ...] = SERVERS,
         sigmas: tuple[float, ...] = SIGMAS, replications: int = 1) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for c in servers:
        for sigma in sigmas:
            for n in lengths:
                for u in utilisations:
                    rate = flag_rate(rng, reps, n, u, c, sigma, replications)
                    limit = claimed_limit(n, u)
                    err = rate if u < 1 else 1 - rate
                    ok = limit is None or err <= limit + 3 * (limit * (1 - limit) / reps) ** 0.5
                    rows.append({"servers": c, "sigma": sigma, "requests": n, "utilisation": u, "flagged": rate,
                                 "error": err, "claimed": limit, "ok": ok})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--replications", type=int, default=1, help="replays per load; past saturation when any is")
    ap.add_argument("--lengths", type=lambda t: tuple(int(x) for x in t.split(",")), default=LENGTHS)
    ap.add_argument("--utilisations", type=lambda t: tuple(float(x) for x in t.split(",")), default=UTILISATIONS)
    args = ap.parse_args()
    rows = grid(args.reps, args.seed, args.utilisations, args.lengths, replications=args.replications)
    print(f"past saturation when TTFT grows by more than its limit; {args.reps} loads per cell, "
          f"{args.replications} replay(s) each (any past saturation flags the load); flagged share")
    for c in SERVERS:
        for sigma in SIGMAS:
            print(f"\nservers {c}, service-time spread (lognormal sigma) {sigma}")
            print("  requests  " + "  ".join(f"{u:>5g}" for u in args.utilisations))
            for n in args.lengths:
                cells = [r for r in rows if r["servers"] == c and r["sigma"] == sigma and r["requests"] == n]
                print(f"  {n:>8}  " + "  ".join(f"{r['flagged']:>5.2f}" + ("!" if not r["ok"] else "")
                                                 for r in cells))
    print("\n(! a claimed cell over its limit)")
    for m, f, fa, mu, ma in CLAIMS:
        mine = [r for r in rows if r["requests"] >= m]
        if not any(r["utilisation"] <= f for r in mine) or not any(r["utilisation"] >= mu for r in mine):
            continue
        worst_false = max(r["error"] for r in mine if r["utilisation"] <= f)
        worst_miss = max(r["error"] for r in mine if r["utilisation"] >= mu)
        print(f"{m}+ requests: worst false flag at utilisation <= {f:g}: {worst_false:.3f} (claimed {fa:g}); "
              f"worst miss at >= {mu:g}: {worst_miss:.3f} (claimed {ma:g})")
    print(f"{sum(not r['ok'] for r in rows)} claimed cells over their limit (three Monte Carlo standard errors allowed)")


if __name__ == "__main__":
    main()

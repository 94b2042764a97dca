"""Past bugs, put back one at a time: does the test suite still catch every one? (run by hand)

The proof that a faster test suite (issue 39: the fast tier is ``pytest -m "not engine and not
server"``) still catches the bugs the old one caught. Each record below is a bug this project
fixed (the commit that fixed it is named), written as one exact string replacement that puts it
back into today's code, with the test files that should catch it.

For each bug: a scratch copy of a source tree (``git archive REV``, or the working tree with
``--working-tree``), the replacement applied there (the old string must occur exactly once: a bug
whose string is not found is refused, by name, and counts as an error), then

    .venv/bin/python -m pytest -q -x -p no:cacheprovider -m "<markers>" <its test files>

in that copy, with ``PYTHONPATH`` set to it (checked once: ``import kvaudit`` must resolve to the
copy, not to the editable install in this checkout). pytest's exit status says what happened:
1 (a test failed) caught, 0 missed, anything else (a collection or import error, no test run, a
timeout) an error, since a patch that breaks import proves nothing. The unpatched copy runs the
same test files first and must pass, else the comparison means nothing.

The marker expression defaults to the fast tier, ``not engine and not server``; on a tree whose
pyproject.toml does not register those markers (before issue 39) it is ``not model``, that tree's
fast tier. Bugs of the ``vllm`` tier are caught only by tests that need vLLM, a model or a
``vllm serve`` process: they run in ``.venv-vllm`` with no marker expression, and only when asked
for (``--tier vllm``, ``--tier all``, or by name with ``--only``).

Prints a table (bug, fixed in, caught, the first failing test, seconds) and the totals. Exit
status: 0 every bug caught, 1 some bug missed, 2 an error (a bug not reintroduced, a copy whose
unpatched tests fail, a run that did not get as far as a test failing).

    python benchmarks/past_bugs.py --working-tree      # the uncommitted suite, fast tier
    python benchmarks/past_bugs.py                     # HEAD
    python benchmarks/past_bugs.py --rev 98d8e00 --only vacuous-gate-pass,deff-ignored
    python benchmarks/past_bugs.py --list              # the bugs, and whether each applies to HEAD
    python benchmarks/past_bugs.py --tier vllm         # the bugs only the vLLM tier catches (slow)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
FAST_TIER = "not engine and not server"
OLD_FAST_TIER = "not model"  # the fast tier before the engine/server markers (issue 14's 'model')
# Left out of a --working-tree copy (the brief's rsync excludes, plus caches nothing reads).
TOP_EXCLUDES = {".git", "runs", "build"}
ANY_EXCLUDES = {"__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache"}


@dataclass(frozen=True)
class Bug:
    name: str
    fixed_in: str  # the commit that fixed it
    file: str  # relative to the repository root
    old: str  # today's code: must occur exactly once in ``file``
    new: str  # the bug
    tests: tuple[str, ...]  # the test files that should catch it
    what: str
    tier: str = "fast"  # "vllm": caught only by tests in .venv-vllm (a model, vLLM, a server)


BUGS: tuple[Bug, ...] = (
    Bug("resume-drops-unterminated-record", "5e1ff8e", "kvaudit/core/jsonio.py",
        'write_atomic(path, (raw + b"\\n" if complete else raw[:cut])',
        "write_atomic(path, (raw[:cut])",
        ("tests/test_run_dir.py", "tests/test_hostile_run.py"),
        "a complete last record without its newline is cut on resume (its case runs again)"),
    Bug("torn-tail-not-mended", "5e1ff8e", "kvaudit/core/work_dir.py",
        "        mend_jsonl_tail(self.journal_file)\n",
        "",
        ("tests/test_run_dir.py", "tests/test_hostile_run.py"),
        "a resumed run appends after a torn last line of pairs.jsonl instead of cutting it"),
    Bug("replay-torn-tail-not-mended", "fc1a42e", "kvaudit/core/work_dir.py",
        "        mend_jsonl_tail(self.journal_file)\n",
        "",
        ("tests/test_replay.py",),
        "a resumed replay appends after a torn last line of requests.jsonl"),
    Bug("two-writers-one-run", "5e1ff8e", "kvaudit/core/run_lock.py",
        "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        "fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)",
        ("tests/test_hostile_run.py",),
        "two kvaudit processes write one run directory at once (every case recorded twice)"),
    Bug("jsonl-split-on-unicode-separators", "5e1ff8e", "kvaudit/core/jsonio.py",
        '    parts = text.split("\\n")\n'
        '    lines = [p + "\\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])\n',
        "    lines = text.splitlines(keepends=True)\n",
        ("tests/test_hostile_run.py", "tests/test_fuzz_readers.py"),
        "JSONL records split at U+2028, U+0085, ... inside JSON strings, not only at newlines"),
    Bug("vacuous-gate-pass", "772a343", "kvaudit/reports/policy.py",
        'return any(r.status in ("pass", "fail") for r in results if r.kind in QUALITY_KINDS)',
        'return any(r.status in ("pass", "fail", "skip") for r in results if r.kind in QUALITY_KINDS)',
        ("tests/test_hostile_gate.py", "tests/test_gate.py"),
        "a gate whose every quality threshold was skipped passes"),
    Bug("cannot-judge-outranks-fail", "772a343", "kvaudit/reports/policy.py",
        '    if "fail" in statuses:\n        return "fail"\n'
        '    if "error" in statuses or not _judged(results):\n        return "error"\n',
        '    if "error" in statuses or not _judged(results):\n        return "error"\n'
        '    if "fail" in statuses:\n        return "fail"\n',
        ("tests/test_hostile_gate.py", "tests/test_gate.py"),
        "a failed threshold beside a row that cannot be judged gives 'cannot judge' (exit 2), not fail"),
    Bug("straddling-interval-fails", "772a343", "kvaudit/reports/gate_checks/quality.py",
        '"fail" if d.upper_bound < margin else "error")',
        '"fail")',
        ("tests/test_repairs.py", "tests/test_hostile_gate.py"),
        "a delta whose interval straddles the margin fails instead of 'cannot judge'"),
    Bug("reference-arm-gated", "772a343", "kvaudit/reports/policy.py",
        "    if spec.compared_with == spec.name:\n",
        "    if False:\n",
        ("tests/test_hostile_gate.py",),
        "the reference arm is not refused as the arm under test (is_gated, 98d8e00, refuses it "
        "later with another message)"),
    Bug("noise-floor-not-held", "6ea32bc", "kvaudit/reports/policy.py",
        'r = ThresholdResult(r.name, "noise_control", "error", r.observed',
        'r = ThresholdResult(r.name, "noise_control", "skip", r.observed',
        ("tests/test_gate.py",),
        "a noise floor (recompute_again) that does not clear the margin only warns; the gate passes"),
    Bug("identity-fixed-tolerance-on-noisy-engine", "6ea32bc", "kvaudit/audit/checks/identity_reuse.py",
        'relative = noise is not None and not noise["exact"]',
        "relative = False",
        ("tests/test_identity_noise.py",),
        "identity held to the dtype's fixed tolerance, not to the measured noise floor"),
    Bug("stale-audit-accepted", "6ea32bc", "kvaudit/audit/trust.py",
        "        if want != hashes[name]:\n",
        "        if not want:\n",
        ("tests/test_gate.py",),
        "an audit.json whose pairs/manifest sha256 no longer match the files is not refused as stale"),
    Bug("cached-token-field-misread", "aca0f41", "kvaudit/core/hit_rate.py",
        "h, n = int(p.arms[arm].cache_hit_tokens), int(p.n_prompt_tokens)",
        "h, n = int(p.arms[arm].tokens_reused), int(p.n_prompt_tokens)",
        ("tests/test_simulator.py", "tests/test_quiet_holes.py"),
        "the measured hit rate reads tokens_reused instead of cache_hit_tokens (the simulator's "
        "definition)"),
    Bug("deff-ignored", "cab1aed", "kvaudit/stats/noninferiority.py",
        "    return max(floor, ratio), g\n",
        "    return 1.0, g\n",
        ("tests/test_gate_calibration.py", "tests/test_stats.py"),
        "the document design effect forced to 1: cases on shared documents counted as independent"),
    Bug("sequential-looks-without-spending", "76a397c", "kvaudit/stats/sequential.py",
        "nominal = tuple(float(norm.sf(c)) if np.isfinite(c) else 0.0 for c in z)",
        "nominal = tuple(float(alpha) for c in z)",
        ("tests/test_sequential.py", "tests/test_gate_calibration.py"),
        "every look of a sequential run tested at the full alpha (no alpha spending)"),
    Bug("head-stored-before-load", "36e1ef6", "kvaudit/simulator/segment_cache.py",
        "                elif late_stored_after_load:\n                    after_load.append(i)\n",
        "",
        ("tests/test_replay.py",),
        "the engine-order simulation stores a new head before the request's load, not at the end "
        "of that engine step (5e83987 moved the head into the loading request's step)"),
    Bug("slower-hits-cannot-tell", "099b750", "kvaudit/stats/timing.py",
        "requests_needed=requests_to_distinguish(max(auc, 1 - auc), error)",
        "requests_needed=requests_to_distinguish(auc, error)",
        ("tests/test_timing_stats.py",),
        "a timing channel whose cached requests are the slower ones (AUC below 0.5, SGLang on the "
        "H200) reported as one no observer can use ('cannot tell')"),
    Bug("saturated-load-within-slo", "52a725f", "kvaudit/stats/saturation.py",
        '        if x["p95_s"] > slo_s or x.get("past_saturation"):\n            break\n',
        '        if x["p95_s"] > slo_s:\n            continue\n',
        ("tests/test_saturation.py", "tests/test_replay.py"),
        "the SLO reading named the highest load whose p95 met the SLO, even one past saturation (its "
        "TTFT growing with the replay's length: 82 s p50 over 500 requests where 80 gave 14 s on the "
        "H200) or one above a lighter load that failed"),
    Bug("queued-intervals-claimed", "77ce4a1", "kvaudit/replay/summary.py",
        "    return all(r.arrival_s is None for r in records) and len(set(waves)) == len(waves)\n",
        "    return len(set(waves)) == len(waves)\n",
        ("tests/test_replay.py",),
        "open-loop replays quoted independent-request percentile intervals as 95% intervals (coverage "
        "of p95 0.20 on queued requests at utilisation 0.8)"),
    Bug("wave-intervals-claimed", "1f80fce", "kvaudit/replay/summary.py",
        "    return all(r.arrival_s is None for r in records) and len(set(waves)) == len(waves)\n",
        "    return all(r.arrival_s is None for r in records)\n",
        ("tests/test_replay.py",),
        "closed-loop replays in waves of several requests quoted independent-request percentile "
        "intervals as 95% intervals (a wave's requests share its batch: coverage of p95 0.37-0.62 in "
        "waves of 8)"),
    Bug("replay-summary-untyped", "e9c5a60", "kvaudit/core/replay_format.py",
        "        obj = check_summary(read_json(self.summary_file), where)\n",
        "        obj = read_json(self.summary_file)\n        return obj\n",
        ("tests/test_fuzz_readers.py",),
        "the replay page read replay.json unchecked: an edited or older summary (ttft_growth 5, a NaN "
        "percentile, a missing field) gave a traceback instead of an error naming the field"),
    Bug("speed-batches-as-independent-cases", "c0bbb8a", "kvaudit/reports/analysis.py",
        "        if any(k is not None for k in batch) and not (self.concurrent_cases > 1 and None in batch):\n",
        "        if False:\n",
        ("tests/test_speed.py",),
        "a speed row of a run whose cases ran several at a time took them as independent: at the "
        "threshold it passed up to 20% of runs where 2.5% is promised (batches of 8)"),
    Bug("timing-judged-in-batches", "43431e7", "kvaudit/reports/security.py",
        "            out[what] = timing_auc(hit, miss, confidence, batches=batch)\n",
        "            out[what] = timing_auc(hit, miss, confidence)\n",
        ("tests/test_speed.py",),
        "the timing side channel was judged on probes run several cases at a time, its interval "
        "clustered by case (coverage 0.34-0.51 in batches of 8)"),
    Bug("store-at-arrivals-load-untouched", "df41950", "kvaudit/simulator/segment_cache.py",
        "    events += [(float(ready[r]), 3, r, 0) for r in range(trace.n_requests)]\n",
        "",
        ("tests/test_replay.py",),
        "the simulation of the segment store under overlap marked a request's pieces used only at its "
        "admission, not when its load read them after later admissions: a CI replay measured one "
        "document more than simulated (2.3 points)"),
    Bug("replay-drops-documents", "495cdf1", "kvaudit/replay/replay_cli.py",
        "        check_requests_fit(args, backend.max_prompt_tokens,\n"
        "                           {r.id: full_prompt_tokens(c, segs, backend.tok) for r, (c, segs) in cases})\n",
        "",
        ("tests/test_replay.py",),
        "a replay dropped a request's trailing documents to fit the engine, silently: its TTFT and hit rate "
        "described shorter prompts than the workload's (a 5K-token workload served as 3.3K-token prompts)",
        tier="vllm"),
    Bug("load-plot-raw-mathtext", "a42a7a1", "kvaudit/reports/replay_report.py",
        "        log_seconds(ax.yaxis)\n        ax.set_title(\"Time to first token against offered load",
        "        ax.set_title(\"Time to first token against offered load",
        ("tests/test_replay.py",),
        "the replay page's TTFT-against-load plot labelled its log axis in mathtext, which the page's "
        "text-as-text SVG showed as raw markup ($\\mathdefault{10^{5}}$)"),
    # Caught only where vLLM runs (.venv-vllm): a model, the engine, a `vllm serve`.
    Bug("tenant-salt-shared", "58b770e", "kvaudit/runners/engines/http/backend.py",
        "        self.reuse_salt = _salt()\n",
        "        self.reuse_salt = self.prefix_salt\n",
        ("tests/test_http_prefix_server.py",),
        "the server's reuse path and the cold prefix arm share one tenant salt (cold found warm)",
        tier="vllm"),
    Bug("replay-opens-vllm-at-the-default-length", "495cdf1", "kvaudit/replay/replay_cli.py",
        "            max_len = min(fit, int(context)) if isinstance(context, int) else fit\n",
        "            max_len = min(fit, 4096)  # --max-model-len's default\n",
        ("tests/test_replay_vllm.py",),
        "`kvaudit replay --backend vllm` opened the engine at --max-model-len's default (4096) whatever the "
        "workload: a longer request could not be served whole", tier="vllm"),
    Bug("store-budget-past-free-memory", "76b545d", "kvaudit/runners/engines/vllm/backend.py",
        "            check_store_room(llm.collective_rpc(store_rpc, args=(store, \"room\")), store_bytes,\n"
        "                             workers=tensor_parallel_size * pipeline_parallel_size)\n",
        "            pass\n",
        ("tests/test_replay_vllm.py",),
        "a segment-store budget past the memory free where the store lives was taken: the store filled as "
        "documents came and the run stopped out of memory midway (an H100, 40 GB beside an 8B model)",
        tier="vllm"),
    Bug("arrivals-admit-at-arrival", "f598657", "kvaudit/runners/engines/vllm/live.py",
        "        while queue and queue[0].arrival_s <= now and srv.in_flight < limit:\n",
        "        while queue and queue[0].arrival_s <= now:\n",
        ("tests/test_replay_vllm.py::test_requests_past_the_engines_slots_wait_holding_nothing",),
        "an arrivals replay admitted each request at its arrival: past saturation the queue pinned the "
        "whole segment store and every later document overflowed (the H100 at 2.5/s: hit 29.9% to 7.7%, "
        "served load below the lighter load's)", tier="vllm"),
    Bug("store-budget-for-every-policy", "f598657", "kvaudit/replay/serve.py",
        "    return budget_bytes if policy == \"segment\" else 0\n",
        "    return budget_bytes\n",
        ("tests/test_replay_vllm.py::test_a_recompute_replay_opens_for_its_longest_request_and_is_not_held_to_the_stores_room",),
        "a prefix or recompute replay passed its cache budget as the segment store's, so the store's room "
        "check refused replays that keep nothing there (an H100's prefix caching at 20 GB)", tier="vllm"),
    Bug("warm-ups-built-to-be-refused", "73444aa", "kvaudit/core/store_plan.py",
        "        if need > room:\n            break\n",
        "        if need > room and False:\n            break\n",
        ("tests/test_replay_vllm.py::test_arrivals_join_the_running_batch_and_a_full_store_serves_misses",),
        "under arrivals a segment request sent a warm-up for every missing entry whatever the store's room: "
        "a warm-up the store then refused was prefilled again by the request (the 20 MB CPU example at "
        "2/s: two thirds of warmed tokens)", tier="vllm"),
    Bug("replay-asks-logprobs-over-http", "848953f", "kvaudit/replay/replay_cli.py",
        "        self.backend.asks_logprobs = False  # a replay reads tokens and times only\n",
        "",
        ("tests/test_http_prefix_server.py::test_a_replay_asks_the_server_for_no_log_probabilities",),
        "a replay over HTTP asked the server for every token's top-20 log-probabilities, which it never "
        "reads and which cost a loaded server throughput (the peer comparison with vllm bench serve "
        "carried the difference)",
        tier="vllm"),
    Bug("leak-candidates-on-recomputed-kv", "ee7211b", "kvaudit/runners/engines/vllm/backend.py",
        "skip_reading_prefix_cache=False if scoring else None",
        "skip_reading_prefix_cache=None",
        ("tests/test_vllm.py",),
        "leak-probe candidates scored on recomputed KV, not on the arm's own",
        tier="vllm"),
    Bug("same-step-head-counted-as-hit", "e376279", "kvaudit/replay/serve.py",
        "held_head = stores_heads and out.head_s == 0 and not out.head_prefilled",
        "held_head = stores_heads and out.head_s == 0",
        ("tests/test_replay_vllm.py",),
        "a replay counts a head prefilled in the loading request's engine step as a hit",
        tier="vllm"),
)


@dataclass
class Outcome:
    bug: Bug
    caught: str  # yes / no / error
    test: str = ""  # the first FAILED (or ERROR) line's test, or why it is an error
    seconds: float = 0.0
    output: str = field(default="", repr=False)


# ------------------------------------------------------------------------------------ copies


def git(*args: str, **kw) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True,
                          **kw).stdout.strip()


def export_rev(rev: str, dst: Path) -> None:
    """The tree of commit ``rev`` into ``dst`` (``git archive``: no worktree to clean up)."""
    dst.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", "--format=tar", rev], stdout=subprocess.PIPE)
    untar = subprocess.run(["tar", "-x", "-C", str(dst)], stdin=archive.stdout, capture_output=True)
    archive.stdout.close()
    if archive.wait() != 0 or untar.returncode != 0:
        raise SystemExit(f"past_bugs: git archive {rev} failed: {untar.stderr.decode()[-500:]}")


def _ignore_for(src_root: Path):
    def ignore(directory: str, names: list[str]) -> set[str]:
        out = {n for n in names if n in ANY_EXCLUDES or n.endswith(".egg-info")}
        if Path(directory) == src_root:
            out |= {n for n in names if n in TOP_EXCLUDES or n.startswith(".venv")}
        return out
    return ignore


def copy_working_tree(dst: Path) -> None:
    """The working tree as it is (uncommitted edits included), without .git, .venv*, runs."""
    shutil.copytree(ROOT, dst, symlinks=True, ignore=_ignore_for(ROOT))


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=True, ignore=_ignore_for(src))


def default_markers(tree: Path) -> str | None:
    """The fast tier's marker expression for ``tree``, from the markers its pyproject registers."""
    try:
        ini = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return None
    names = {str(m).split(":", 1)[0].strip() for m in ini.get("markers", [])}
    if {"engine", "server"} <= names:
        return FAST_TIER
    if "model" in names:
        return OLD_FAST_TIER
    return None


def occurrences(tree: Path, bug: Bug) -> int:
    path = tree / bug.file
    return path.read_text(encoding="utf-8").count(bug.old) if path.is_file() else -1


def apply(tree: Path, bug: Bug) -> None:
    path = tree / bug.file
    text = path.read_text(encoding="utf-8")
    assert text.count(bug.old) == 1, bug.name
    path.write_text(text.replace(bug.old, bug.new), encoding="utf-8")


# ------------------------------------------------------------------------------------ pytest


def env_for(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = str(tree)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_import(python: str, tree: Path) -> None:
    """``import kvaudit`` in ``tree`` must load the copy, not the editable install in ROOT."""
    r = subprocess.run([python, "-c", "import kvaudit; print(kvaudit.__file__)"], cwd=tree, env=env_for(tree),
                       capture_output=True, text=True)
    where = Path(r.stdout.strip()).resolve() if r.returncode == 0 and r.stdout.strip() else None
    if where is None or not where.is_relative_to(tree.resolve()):
        raise SystemExit(f"past_bugs: error: with PYTHONPATH={tree}, {python} imports kvaudit from "
                         f"{where or '(nowhere: ' + r.stderr.strip()[-300:] + ')'}, not from the copy: "
                         "every result would measure the checkout, not the patched copy")
    print(f"import kvaudit -> {where} (the copy)", flush=True)


FAILED = re.compile(r"^(FAILED|ERROR) (.+?)(?: - .*)?$")  # a parameter id may hold spaces


def run_pytest(python: str, tree: Path, markers: str | None, tests: tuple[str, ...],
               timeout: float) -> tuple[int | None, str, float]:
    cmd = [python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
    if markers:
        cmd += ["-m", markers]
    cmd += list(tests)
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=tree, env=env_for(tree), capture_output=True, text=True, timeout=timeout)
        code, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        code = None
        out = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""))
        out += f"\n(timed out after {timeout:g} s)"
    return code, out, time.perf_counter() - t0


def first_failure(output: str) -> str:
    for line in output.splitlines():
        m = FAILED.match(line)
        if m:
            return m.group(2) if m.group(1) == "FAILED" else f"ERROR {m.group(2)}"
    return ""


def why_error(code: int | None, output: str) -> str:
    if code is None:
        return "timed out"
    if code == 5:
        return "exit 5: no test ran (all deselected?)"
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    last = next((ln for ln in reversed(lines) if "error" in ln.lower() or "interrupted" in ln.lower()),
                lines[-1] if lines else "")
    return f"exit {code}: {last[:100]}"


def tail(output: str, n: int = 25) -> str:
    return "\n".join("    " + ln for ln in output.rstrip().splitlines()[-n:])


# ------------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--rev", default="HEAD", help="the commit whose tree is copied (default HEAD)")
    src.add_argument("--working-tree", action="store_true",
                     help="copy the working tree instead (uncommitted edits included; .git, .venv*, runs left out)")
    ap.add_argument("--only", metavar="NAME[,NAME]", help="these bugs only (any tier)")
    ap.add_argument("--tier", choices=("fast", "vllm", "all"), default="fast",
                    help="which bugs run without --only (default fast; vllm runs in .venv-vllm, slowly)")
    ap.add_argument("--markers", help=f"marker expression for the fast tier (default {FAST_TIER!r}, or "
                                      f"{OLD_FAST_TIER!r} where the tree does not register engine/server)")
    ap.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"), help="the fast tier's interpreter")
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"),
                    help="the vllm tier's interpreter")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per pytest run (default 1800)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch copies (their folder is printed)")
    ap.add_argument("--list", action="store_true", help="list the bugs (and whether each applies) and exit")
    return ap.parse_args(argv)


def select(args: argparse.Namespace) -> list[Bug]:
    by_name = {b.name: b for b in BUGS}
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise SystemExit(f"past_bugs: error: unknown bug(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
        return [by_name[n] for n in names]
    return [b for b in BUGS if args.tier == "all" or b.tier == args.tier]


def print_table(outcomes: list[Outcome]) -> None:
    rows = [("bug", "fixed in", "caught", "failing test (first FAILED line)", "s")]
    rows += [(o.bug.name, o.bug.fixed_in, o.caught, o.test or "-", f"{o.seconds:.0f}") for o in outcomes]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4].rjust(5))
        if i == 0:
            print("  ".join("-" * w for w in widths) + "  " + "-" * 5)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bugs = select(args)
    scratch = Path(tempfile.mkdtemp(prefix="pb-"))
    try:
        base = scratch / "base"
        if args.working_tree:
            copy_working_tree(base)
            source = f"working tree of {ROOT}"
        else:
            sha = git("rev-parse", "--verify", f"{args.rev}^{{commit}}")
            export_rev(sha, base)
            source = f"{args.rev} ({sha[:7]})"
        if args.list:
            for b in bugs if args.only else BUGS:
                n = occurrences(base, b)
                found = "applies" if n == 1 else ("file missing" if n < 0 else f"old string found {n} times")
                print(f"{b.name}  [{b.tier}] fixed in {b.fixed_in}; {b.file}: {found} in {source}\n"
                      f"    {b.what}\n    caught by: {' '.join(b.tests)}")
            return 0
        return measure(args, bugs, base, scratch, source)
    finally:
        if args.keep:
            print(f"scratch copies kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


def measure(args: argparse.Namespace, bugs: list[Bug], base: Path, scratch: Path, source: str) -> int:
    total0 = time.perf_counter()
    outcomes: dict[str, Outcome] = {}
    runnable = []
    for b in bugs:
        n = occurrences(base, b)
        if n == 1:
            runnable.append(b)
            continue
        why = f"{b.file} missing" if n < 0 else f"old string found {n} times in {b.file}"
        print(f"past_bugs: refusing to run bug {b.name}: {why} (it must occur exactly once)", flush=True)
        outcomes[b.name] = Outcome(b, "error", why)

    fast_markers = args.markers if args.markers is not None else default_markers(base)
    tiers = {"fast": (args.python, fast_markers), "vllm": (args.vllm_python, None)}
    print(f"source: {source}; fast tier: -m {fast_markers!r}" if fast_markers else
          f"source: {source}; fast tier: no marker expression", flush=True)

    baseline_ok: dict[str, bool] = {}
    for tier in ("fast", "vllm"):
        mine = [b for b in runnable if b.tier == tier]
        if not mine:
            continue
        python, markers = tiers[tier]
        tree = scratch / f"unpatched-{tier}"
        copy_tree(base, tree)
        check_import(python, tree)
        tests = tuple(dict.fromkeys(t for b in mine for t in b.tests))
        code, out, secs = run_pytest(python, tree, markers, tests, args.timeout)
        shutil.rmtree(tree, ignore_errors=True)
        baseline_ok[tier] = code == 0
        print(f"unpatched copy, {tier} tier, {len(tests)} test files: "
              f"{'pass' if code == 0 else 'FAILS (' + why_error(code, out) + ')'} in {secs:.0f} s", flush=True)
        if code != 0:
            print(tail(out), flush=True)
            for b in mine:
                outcomes[b.name] = Outcome(b, "error", "the unpatched copy fails these tests")

    for b in runnable:
        if not baseline_ok.get(b.tier):
            continue
        python, markers = tiers[b.tier]
        tree = scratch / b.name
        copy_tree(base, tree)
        apply(tree, b)
        code, out, secs = run_pytest(python, tree, markers, b.tests, args.timeout)
        shutil.rmtree(tree, ignore_errors=True)
        if code == 1:
            o = Outcome(b, "yes", first_failure(out), secs, out)
        elif code == 0:
            o = Outcome(b, "no", "", secs, out)
        else:
            o = Outcome(b, "error", why_error(code, out), secs, out)
        outcomes[b.name] = o
        print(f"{b.name}: caught {o.caught} ({secs:.0f} s){' ' + o.test if o.test else ''}", flush=True)
        if o.caught == "error":
            print(tail(out), flush=True)

    ordered = [outcomes[b.name] for b in bugs]
    print()
    print_table(ordered)
    n = {k: sum(o.caught == k for o in ordered) for k in ("yes", "no", "error")}
    print(f"\n{len(ordered)} bugs: caught {n['yes']}, missed {n['no']}, errors {n['error']}; "
          f"{time.perf_counter() - total0:.0f} s in all ({source})")
    missed = [o.bug.name for o in ordered if o.caught == "no"]
    if missed:
        print(f"missed: {', '.join(missed)}")
    return 2 if n["error"] else 1 if n["no"] else 0


if __name__ == "__main__":
    sys.exit(main())

"""The long fuzzing run over every reader of user-supplied files, run by hand.

``tests/test_fuzz_readers.py`` holds the readers, the inputs and the property (an input reads, as
documented, or is a user error naming the file; never another exception, never a hang) and runs
a fast, derandomized slice of it in the test suite. This runs the same readers for ``--examples``
inputs each (after the suite's regression examples), never stopping at a failure: per reader it
prints the inputs tried and the failures found, and for each distinct failure (exception type,
where it was raised, first words of its message) how often it occurred and the smallest input
that showed it. A read that takes longer than ``--timeout`` seconds is a failure (a hang); each
reader runs in a child process, so one that kills the process (a segfault in a C library) is a
failure too, named with the input it was reading, and the other readers still run.
Exit status 1 if any reader failed, else 0::

    .venv/bin/python benchmarks/fuzz_readers.py --examples 500
    .venv/bin/python benchmarks/fuzz_readers.py --examples 5000 --readers workload,kv_config --seed 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from kvaudit.testing.fuzz_readers import EXAMPLES, READERS, Bytes, Mutation, attempt, inputs  # noqa: E402


class Hang(Exception):
    """A read ran past ``--timeout``."""


def _alarm(signum, frame):
    raise Hang


def _short(v: object, n: int = 40) -> str:
    r = repr(v)
    return r if len(r) <= n else f"{r[:n]}...<{len(r)} chars>"


def describe(recipe: Bytes | Mutation, n: int = 400) -> str:
    """A fuzz input in one line: its fields that differ from the defaults, long values cut."""
    if isinstance(recipe, Bytes):
        return f"Bytes({_short(recipe.data, 80)})"
    default = Mutation()
    parts = []
    for f in fields(Mutation):
        v = getattr(recipe, f.name)
        if f.name == "more":
            if v:
                parts.append("more=[" + ", ".join(describe(x, n) for x in v) + "]")
        elif v != getattr(default, f.name):
            parts.append(f"{f.name}={_short(v)}")
    text = "Mutation(" + ", ".join(parts) + ")"
    return text if len(text) <= n else text[:n] + "..."


def failure_kind(e: BaseException) -> str:
    """Exception type, the innermost kvaudit (or harness) frame, and the message's first words."""
    if isinstance(e, Hang):
        return "hang"
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if "/kvaudit/" in f.filename or "test_fuzz_readers" in f.filename]
    where = ""
    if frames:
        f = frames[-1]
        where = f" at {Path(f.filename).relative_to(REPO)}:{f.lineno}"
    msg = str(e).split("\n")[0]
    if isinstance(e, AssertionError):  # group by the broken promise, not by the input echoed
        msg = re.sub(r"\[[^\]]*\]", "[]", msg)  # indices, keys, lists of characters
        msg = re.sub(r"'[^']{0,300}'|\"[^\"]{0,300}\"", "'.'", msg)  # quoted values
    return f"{type(e).__name__}{where}: {msg[:110]}"


@dataclass
class Tally:
    tried: int = 0
    failed: int = 0
    kinds: dict[str, list] = field(default_factory=dict)  # kind -> [count, smallest input]
    seconds: float = 0.0


def fuzz_reader(name: str, n: int, seed_value: int, timeout: int, state: Path) -> Tally:
    """Fuzz one reader; ``state`` holds the tally and the input being read, for the parent
    process when this one dies."""
    tally = Tally()

    def one(recipe: Bytes | Mutation) -> None:
        tally.tried += 1
        state.write_text(json.dumps({**asdict(tally), "last": describe(recipe)}))
        signal.alarm(timeout)
        try:
            attempt(name, recipe)
        except Exception as e:  # every failure is counted, none stops the run
            signal.alarm(0)
            tally.failed += 1
            entry = tally.kinds.setdefault(failure_kind(e), [0, None])
            entry[0] += 1
            text = describe(recipe)
            if entry[1] is None or len(text) < len(entry[1]):
                entry[1] = text
        finally:
            signal.alarm(0)

    t0 = time.perf_counter()
    for recipe in EXAMPLES:
        one(recipe)
    fuzz = settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck))(given(recipe=inputs())(one))
    seed(seed_value)(fuzz)()
    tally.seconds = time.perf_counter() - t0
    return tally


def in_child(name: str, n: int, seed_value: int, timeout: int) -> Tally:
    """:func:`fuzz_reader` in a forked child; a child killed by a signal is one more failure."""
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state.json"
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # the child
            code = 0
            try:
                signal.signal(signal.SIGALRM, _alarm)
                t = fuzz_reader(name, n, seed_value, timeout, state)
                state.write_text(json.dumps({**asdict(t), "last": None}))
            except BaseException:  # noqa: B036 - the child must not return into the parent's loop
                traceback.print_exc()
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        saved = json.loads(state.read_text()) if state.exists() else {"tried": 0, "failed": 0, "kinds": {}}
        last = saved.pop("last", None)
        t = Tally(**{k: v for k, v in saved.items() if k in ("tried", "failed", "kinds")})
        t.seconds = time.perf_counter() - t0
        if os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0:
            how = (f"signal {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status)
                   else f"exit status {os.WEXITSTATUS(status)}")
            t.failed += 1
            t.kinds[f"process died ({how}): the run of this reader stopped there"] = [1, last]
        return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=500, help="random inputs per reader (default 500)")
    ap.add_argument("--readers", default=",".join(READERS),
                    help=f"comma-separated, of: {', '.join(READERS)} (default all)")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0; same seed, same inputs)")
    ap.add_argument("--timeout", type=int, default=30, help="seconds one read may take (default 30)")
    args = ap.parse_args(argv)
    names = [r.strip() for r in args.readers.split(",") if r.strip()]
    unknown = [r for r in names if r not in READERS]
    if unknown or not names or args.examples < 1 or args.timeout < 1:
        ap.error(f"unknown reader {unknown[0]!r}" if unknown else "--examples and --timeout must be >= 1")
    total_tried = total_failed = 0
    for name in names:
        t = in_child(name, args.examples, args.seed, args.timeout)
        total_tried += t.tried
        total_failed += t.failed
        print(f"{name:<18} {t.tried:>6} inputs  {t.failed:>5} failures  {t.seconds:6.1f}s  "
              f"({READERS[name].owner})", flush=True)
        for kind, (count, smallest) in sorted(t.kinds.items(), key=lambda kv: -kv[1][0]):
            print(f"    {count:>5}x {kind}\n           e.g. {smallest}", flush=True)
    print(f"total: {total_tried} inputs over {len(names)} readers, {total_failed} failures")
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(main())

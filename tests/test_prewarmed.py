"""The vLLM tests' prewarmed processes (kvaudit/testing/prewarmed.py): each command is a new process
with the exit status, output and working directory a `python -m kvaudit.cli` process would have,
nothing carried from the command before, and a command past its time is killed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kvaudit.testing.prewarmed import Prewarmed, next_line


@pytest.fixture(scope="module")
def prewarmed():
    with Prewarmed(preload=("json",)) as p:  # the mechanism, without vLLM's 12 s import
        yield p


def test_each_command_is_a_process_with_its_own_status_output_and_directory(prewarmed, tmp_path):
    ok = prewarmed.run(["--help"], cwd=tmp_path)
    assert ok.returncode == 0 and "usage: kvaudit" in ok.stdout and ok.stderr == ""
    bad = prewarmed.run(["audit", "no-such-run"], cwd=tmp_path)
    direct = subprocess.run([sys.executable, "-m", "kvaudit.cli", "audit", "no-such-run"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert (bad.returncode, bad.stdout, bad.stderr) == (direct.returncode, direct.stdout, direct.stderr)
    assert bad.returncode == 2 and "no-such-run: run directory not found" in bad.stderr


def test_a_command_leaves_nothing_to_the_next(prewarmed, tmp_path, monkeypatch):
    # a child that changes its process state (a module imported, an environment variable set)
    # leaves the parent as it was: the next child starts from the prewarmed state
    probe = tmp_path / "probe.py"
    probe.write_text("import os, sys\nprint(os.getpid(), 'kvaudit.cli' in sys.modules, os.environ.get('KV_PROBE'))\n"
                     "os.environ['KV_PROBE'] = 'set'\n")
    runs = [prewarmed.run_script(probe, cwd=tmp_path) for _ in range(2)]
    first, second = (r.stdout.split() for r in runs)
    assert first[1:] == second[1:] == ["False", "None"], (first, second)
    assert len({first[0], second[0], str(os.getpid())}) == 3
    # the caller's environment at the call is the child's, as with subprocess.run
    monkeypatch.setenv("KV_PROBE", "caller")
    assert prewarmed.run_script(probe, cwd=tmp_path).stdout.split()[1:] == ["False", "caller"]


def test_a_command_runs_its_exit_handlers_as_a_process_does(prewarmed, tmp_path):
    # kvaudit removes the engine log's configuration file at exit (atexit): a forked child that
    # skipped its handlers left one in the temporary directory per vLLM command. The handlers run
    # where Python runs them: after sys.exit's message, before the output is flushed.
    mark = tmp_path / "at-exit"
    script = tmp_path / "handler.py"
    script.write_text("import atexit, pathlib, sys\n"
                      f"atexit.register(pathlib.Path({str(mark)!r}).write_text, 'ran')\n"
                      "atexit.register(print, 'handler output', file=sys.stderr)\n"
                      "print('before exit')\nsys.exit('the message')\n")
    done = prewarmed.run_script(script, cwd=tmp_path)
    assert mark.read_text() == "ran"
    mark.unlink()
    direct = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True)
    assert mark.read_text() == "ran"
    assert (done.returncode, done.stdout, done.stderr) == (direct.returncode, direct.stdout, direct.stderr)
    assert done.returncode == 1 and done.stderr == "the message\nhandler output\n"


def test_a_command_past_its_time_is_killed_and_the_parent_serves_the_next(prewarmed, tmp_path):
    slow = tmp_path / "slow.py"
    slow.write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        prewarmed.run_script(slow, timeout=1.0)
    assert prewarmed.run(["--help"], cwd=tmp_path).returncode == 0


def test_a_command_that_raises_exits_1_with_its_traceback(prewarmed, tmp_path):
    boom = tmp_path / "boom.py"
    boom.write_text("raise ValueError('boom from the child')\n")
    done = prewarmed.run_script(boom, cwd=tmp_path)
    assert done.returncode == 1 and "ValueError: boom from the child" in done.stderr


def test_two_lines_that_arrive_together_are_both_read_at_once():
    # a command that ends at once sends its pid and status together: the second line must come from
    # what already arrived, not be waited for until the timeout (a buffered readline after select did)
    r, w = os.pipe()
    try:
        os.write(w, b'{"pid": 1}\n{"returncode": 0}\n')
        first, rest = next_line(r, b"", 5.0)
        start = time.monotonic()
        second, rest = next_line(r, rest, 5.0)
        assert (first, second, rest) == (b'{"pid": 1}', b'{"returncode": 0}', b"")
        assert time.monotonic() - start < 1.0
        assert next_line(r, rest, 0.2) == (None, b"")  # nothing more: no line, no hang
        os.close(w)
        w = -1
        assert next_line(r, b"", 5.0) == (b"", b"")  # the writer gone: end of file
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_quick_commands_back_to_back_are_never_taken_for_hung(prewarmed, tmp_path):
    empty = tmp_path / "empty.py"
    empty.write_text("")
    for _ in range(30):
        assert prewarmed.run_script(empty, cwd=tmp_path, timeout=10.0).returncode == 0

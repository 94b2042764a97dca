"""`kvaudit` commands as fresh processes that start with vLLM already imported (the vLLM tests).

A `kvaudit replay --backend vllm` process on the project's 2-core CPU host spends about 12 s of its
25 importing vLLM before its engine opens, and the vLLM tier starts about ten such processes.
:class:`Prewarmed` starts one parent process that imports vLLM once (nothing else: no engine, no
kvaudit module, no torch operation, so no thread pool is running), then forks a child per command.
Each child is a new process as a user's ``python -m kvaudit.cli`` is: ``kvaudit.cli`` run as
``__main__`` with its own ``sys.argv``, its own engine, exit code, stdout and stderr, and nothing
left by an earlier command; only the import is shared. Measured here (the vLLM tier's prefix replay
of 12 requests): 25.5 s as a process of its own, 14.2 s forked, the same throughput.

The protocol is one JSON line each way per command on the parent's stdin and stdout: the command
(with the caller's working directory and environment at the call, as ``subprocess.run`` would pass
them) in, the child's pid and then its exit status out. The child's stdin is ``/dev/null``. What
vLLM reads from the environment at import (few of its settings: most are read when used) is the
parent's, taken when it started.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any


class Prewarmed:
    """A parent process holding vLLM's import; :meth:`run` forks a ``kvaudit`` command from it."""

    def __init__(self, python: str = sys.executable, *, preload: tuple[str, ...] = ("vllm",),
                 startup_s: float = 120.0) -> None:
        self._proc = subprocess.Popen([python, "-m", "kvaudit.testing.prewarmed", *preload],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self._pending = b""  # read from the parent, not yet a whole line
        reply = self._read(startup_s, what="the prewarmed parent's import")
        if reply.get("ready") is not True:
            raise RuntimeError(f"the prewarmed parent did not start: {reply}")

    def _read(self, timeout_s: float, *, what: str, child: int | None = None) -> dict[str, Any]:
        assert self._proc.stdout is not None
        line, self._pending = next_line(self._proc.stdout.fileno(), self._pending, timeout_s)
        if line is None:
            if child is not None:  # its status not yet sent: the parent has not reaped it
                os.kill(child, signal.SIGKILL)
                self._read(60.0, what="the killed child's status")
            raise subprocess.TimeoutExpired(what, timeout_s)
        if not line:
            raise RuntimeError(f"the prewarmed parent exited ({self._proc.wait()}) during {what}")
        return json.loads(line)

    def run(self, argv: list[str], *, timeout: float = 500.0, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """``python -m kvaudit.cli *argv`` in a child of the prewarmed parent; its output captured as text."""
        return self._fork({"module": "kvaudit.cli"}, argv, timeout, cwd)

    def run_script(self, script: Path, argv: list[str] | None = None, *, timeout: float = 500.0,
                   cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """``python SCRIPT *argv`` in a child of the prewarmed parent."""
        return self._fork({"script": str(script)}, argv or [], timeout, cwd)

    def _fork(self, target: dict[str, str], argv: list[str], timeout: float,
              cwd: Path | None) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory(prefix="kvaudit-prewarmed-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            stdin = self._proc.stdin
            assert stdin is not None
            stdin.write((json.dumps({**target, "argv": argv, "cwd": str(cwd or Path.cwd()), "env": dict(os.environ),
                                     "stdout": str(out), "stderr": str(err)}) + "\n").encode())
            stdin.flush()
            pid = int(self._read(30.0, what="forking the command")["pid"])
            what = " ".join([*target.values(), *argv])
            status = self._read(timeout, what=what, child=pid)
            text = [f.read_text(errors="replace") if f.exists() else "" for f in (out, err)]
            return subprocess.CompletedProcess([*target.values(), *argv], int(status["returncode"]), *text)

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def __enter__(self) -> Prewarmed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def next_line(fd: int, pending: bytes, timeout_s: float) -> tuple[bytes | None, bytes]:
    """The next line from ``fd`` (without its newline) and what was read past it; ``None`` when no
    whole line came within ``timeout_s``, ``b""`` at end of file. Read unbuffered, with ``pending``
    kept by the caller: two lines that arrive together (a quick command's pid and status) must not
    leave the second in a buffer that ``select`` cannot see."""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in pending:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None, pending
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"", pending
        pending += chunk
    line, rest = pending.split(b"\n", 1)
    return line, rest


def _child(cmd: dict[str, Any]) -> None:
    """In the forked child: become ``python -m MODULE ARGV`` (or ``python SCRIPT ARGV``) and exit with its status."""
    import atexit
    import runpy

    code: Any = 0
    try:
        # the output first: whatever fails after is reported where the caller reads it
        for fd, path in ((1, cmd["stdout"]), (2, cmd["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the child's whole life
        os.chdir(cmd["cwd"])
        os.environ.clear()  # the caller's environment now, as subprocess.run would pass it
        os.environ.update(cmd["env"])
        if "script" in cmd:
            sys.argv = [cmd["script"], *cmd["argv"]]
            runpy.run_path(cmd["script"], run_name="__main__")
        else:
            sys.argv = [sys.executable, *cmd["argv"]]
            runpy.run_module(cmd["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code
    except BaseException:  # noqa: BLE001 - a traceback, as python -m prints one, and status 1
        import traceback

        traceback.print_exc()
        code = 1
    # then as Python ends a process: sys.exit's message, the exit handlers (os._exit skips them:
    # kvaudit's removes the engine log's configuration file from the temporary directory), the flush
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed, status 1
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - exiting regardless
            pass
    os._exit(code)


def _serve(preload: list[str], proto: IO[str]) -> None:
    import importlib

    for name in preload:
        importlib.import_module(name)
    print(json.dumps({"ready": True}), file=proto, flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            proto.close()
            _child(cmd)
        print(json.dumps({"pid": pid}), file=proto, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), file=proto, flush=True)


if __name__ == "__main__":
    # the protocol keeps its own copy of stdout; fd 1 goes to stderr, so a preloaded module's
    # prints cannot corrupt it
    _proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    _serve(sys.argv[1:], _proto)

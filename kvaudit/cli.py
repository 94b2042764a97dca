"""The single `kvaudit` command and its subcommands.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
those modules import heavy libraries (torch, transformers) only inside ``run``, so ``--help`` is fast.

Exit codes (docs/reports.md, "Exit codes"): 0 success or pass; 1 a verdict that failed (``gate``,
``audit``); 2 anything else: bad input, an unwritable or unreadable path (any ``OSError``, one line
naming the path), a run that cannot be judged, an internal error (one line; ``--debug`` shows the
traceback); 130 on Ctrl-C. A reader that closes stdout early (``kvaudit gate RUN | head -1``) is
not an error: output stops quietly and the command's own code is returned (2 where it has none yet).
"""

from __future__ import annotations

import argparse
import os
import sys

from kvaudit.commands import COMMANDS, GENERATORS
from kvaudit.core.errors import USER_ERRORS, cut, error_line, os_error_message
from kvaudit.core.registry import Entry

MAX_INTERNAL = 300  # characters of an internal error's message
_DEBUG_HELP = "show the traceback of an error instead of one line"


def _stderr(line: str) -> None:
    try:
        print(line, file=sys.stderr)
    except (OSError, ValueError):  # stderr closed too: nothing left to tell
        pass


def stdout_closed() -> bool:
    """Whether stdout's reader has gone (a pipe whose read end is closed). True when it cannot
    be told (no file descriptor, no poll), the usual cause of a BrokenPipeError."""
    try:
        import select

        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return True


def quiet_stdout() -> None:
    """Send the rest of stdout to os.devnull once its reader went away, as the Python docs
    recommend ("Note on SIGPIPE"), so that the flush at exit cannot raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (AttributeError, OSError, ValueError):  # no real file descriptor (tests, embedding)
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115


def _add(sub: argparse._SubParsersAction, entry: Entry, load: bool) -> None:
    p = sub.add_parser(entry.name, help=entry.help, description=entry.help)
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)
    if load:  # import only the module of the command being run: --help stays fast
        mod = entry.load()
        p.description = (mod.__doc__ or entry.help).strip().splitlines()[0]
        mod.add_arguments(p)
        p.set_defaults(_module=mod)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    parser = argparse.ArgumentParser(prog="kvaudit", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP + " (also after the subcommand)")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write a dataset or workload")
    gen.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)
    gsub = gen.add_subparsers(dest="generator", required=True)
    for name, entry in GENERATORS.items():
        _add(gsub, entry, words[:2] == ["generate", name])
    for name, entry in COMMANDS.items():
        _add(sub, entry, words[:1] == [name])
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code (module docstring). Never a traceback without ``--debug``."""
    try:
        args = build_parser(argv).parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a bad option (2, its message printed)
        return e.code if isinstance(e.code, int) else 2
    debug = bool(getattr(args, "debug", False))
    code: int | None = None
    try:
        code = int(args._module.run(args) or 0)
        sys.stdout.flush()  # a reader gone after the last write shows up here, not at exit
        return code
    except KeyboardInterrupt:
        _stderr("kvaudit: interrupted; finished cases are saved, rerun the same command to resume")
        return 130
    except BrokenPipeError as e:
        if stdout_closed():  # the reader of our output left (`| head -1`): not an error
            quiet_stdout()
            return 2 if code is None else code
        if debug:
            raise
        error_line(os_error_message(e))
        return 2
    except USER_ERRORS as e:
        if debug:
            raise
        error_line(str(e))
        return 2
    except OSError as e:
        if debug:
            raise
        error_line(os_error_message(e))
        return 2
    except Exception as e:
        if debug:
            raise
        _stderr(f"kvaudit: internal error: {type(e).__name__}: {cut(e, MAX_INTERNAL)} "
                "(rerun with --debug for the traceback)")
        return 2


if __name__ == "__main__":
    sys.exit(main())

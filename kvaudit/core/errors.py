"""User-facing errors: the CLI prints their message as one clear sentence, never a traceback."""

import os
import sys

MAX_MESSAGE = 500  # characters of an error message (they may echo user input)


class DatasetError(ValueError):
    """A dataset or run file is malformed; the message names the file, line and field."""


class KvauditError(Exception):
    """An error whose message is meant for the user as is."""


class UnsupportedModelError(KvauditError):
    """The model's architecture cannot be reused faithfully (e.g. partial rotary, sliding window)."""


USER_ERRORS = (KvauditError, DatasetError)


def printable(text: object) -> str:
    """``text`` safe to print on a terminal: control and other non-printable characters (ESC,
    newlines, bidi overrides) shown escaped as ``\\x1b``, ``\\n``, ``\\u202e``; the rest as is."""
    s = str(text)
    return s if s.isprintable() else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in s)


def cut(text: object, limit: int = MAX_MESSAGE) -> str:
    """``text`` on one line, at most ``limit`` characters (an ellipsis marks a cut), control
    characters escaped (:func:`printable`): every error line goes through it to the terminal."""
    one = printable(" ".join(str(text).splitlines()))
    return one if len(one) <= limit else one[: limit - 3] + "..."


def os_error_message(e: OSError) -> str:
    """``<path>: <reason>`` for an OSError; the path is the destination of a rename (what the
    user named: write_atomic renames a temp file onto it) or the file the call was given."""
    path = e.filename2 if e.filename2 is not None else e.filename
    reason = e.strerror or str(e) or type(e).__name__
    return cut(f"{os.fsdecode(path)}: {reason}" if path is not None else reason)


def excerpt(text: str, n: int = 80) -> str:
    """User input echoed in a message: control characters escaped, cut to ``n`` characters."""
    shown = printable(text[:n])
    return shown if len(text) <= n else shown + f"... ({len(text)} chars)"


def error_line(message: str) -> None:
    """Print ``kvaudit: error: <message>`` (one line, cut) to stderr; silent if stderr is closed."""
    try:
        print(f"kvaudit: error: {cut(message)}", file=sys.stderr)
    except (OSError, ValueError):  # stderr closed too: nothing left to tell
        pass

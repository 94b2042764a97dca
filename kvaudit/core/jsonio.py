"""Files, JSON and JSONL: atomic writes, one parser that fails only with a DatasetError naming the
file and field, a JSONL line reader, and content hashes.

Every reader in kvaudit parses through :func:`parse_json` (hostile input: malformed JSON, integers
longer than Python converts, nesting deeper than the interpreter recurses, lone surrogates) and
every file kvaudit writes whole goes through :func:`write_atomic` (a reader never sees half a file).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TextIO

from kvaudit.core.errors import DatasetError


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def ids_hash(ids: Iterable[int]) -> str:
    """Stable hash of a token-id sequence (what the audit compares across arms)."""
    return sha256_hex(",".join(str(int(i)) for i in ids))[:32]


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks (the audit and the attestation bind to it)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@contextmanager
def atomic_open(path: str | os.PathLike) -> Iterator[TextIO]:
    """A UTF-8 text file to write that appears at ``path`` whole when the block ends, or not at all
    when it raises: written to a temp file beside ``path``, synced, given the mode a plain
    ``open()`` would give (0666 less the umask; the temp file's own is 0600), then renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise naming(e, path) from e
        raise


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file and rename, so readers never see half a file."""
    with atomic_open(path) as f:
        f.write(text)


@contextmanager
def removed_on_failure(*paths: str | os.PathLike) -> Iterator[None]:
    """Run the block that writes ``paths`` (files or folders); when it raises, remove each of them
    that did not exist before it, with everything in it, and the parent folders the block made
    for it. A failed command leaves no empty or half-written output of its own behind."""
    made = []
    for p in map(Path, paths):
        new = []
        while not os.path.lexists(p) and p != p.parent:
            new.append(p)
            p = p.parent
        made.append(new)
    try:
        yield
    except BaseException:
        for new in made:
            for i, p in enumerate(new):
                if i == 0 and p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                elif i == 0:
                    p.unlink(missing_ok=True)
                else:
                    with suppress(OSError):
                        p.rmdir()  # only if empty: a parent also holding another output stays
        raise


def naming(e: OSError, path: str | os.PathLike) -> OSError:
    """``e`` naming ``path``, the file the user asked for: a failed write (ENOSPC, EFBIG, EIO)
    names no file, and a failed temp file or rename names the temp file."""
    return OSError(e.errno, e.strerror or str(e) or type(e).__name__, os.fspath(path))


def write_all(files: Mapping[str | os.PathLike, str]) -> None:
    """Write several files so that either every one is new or none is: each text goes to a temp
    file beside its path (:func:`atomic_open`), and only once all are written are they renamed
    into place (a rename needs no space). When a write fails, the temp files and the folders
    made for them are removed (:func:`removed_on_failure`); an OSError names the file."""
    paths = [Path(p) for p in files]
    temps: list[Path] = []
    with removed_on_failure(*{p.parent for p in paths}):
        try:
            for path, text in zip(paths, files.values()):
                temps.append(path.with_name(f".{path.name[:32]}.{secrets.token_hex(4)}.tmp"))
                try:
                    with atomic_open(temps[-1]) as f:
                        f.write(text)
                except OSError as e:
                    raise naming(e, path) from e
            for tmp, path in zip(temps, paths):
                try:
                    os.replace(tmp, path)
                except OSError as e:
                    raise naming(e, path) from e
        except BaseException:
            for tmp in temps:
                tmp.unlink(missing_ok=True)
            raise


def check_writable_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Fail early, before any expensive work, when ``path`` cannot become a directory we write:
    it is a file, or its nearest existing ancestor is not writable."""
    d = Path(path)
    if d.exists() and not d.is_dir():
        raise DatasetError(f"{flag} {d}: exists and is not a directory")
    probe = d
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise DatasetError(f"{flag} {d}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise DatasetError(f"{flag} {d}: {probe} is not writable")
    return d


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_atomic(path, dump_json(obj))


def dump_jsonl(rows: Iterable[Any]) -> str:
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows)


def write_jsonl(path: str | os.PathLike, rows: Iterable[Any]) -> None:
    write_atomic(path, dump_jsonl(rows))


def parse_json(text: str | bytes, where: str) -> Any:
    """``json.loads`` that fails only with a :class:`DatasetError` naming ``where``.

    Beyond malformed JSON this covers what the standard parser raises on hostile input: an
    integer of more digits than Python converts (ValueError) and nesting deeper than the
    interpreter's recursion limit (RecursionError).
    """
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        at = "" if e.lineno == 1 else f": line {e.lineno} column {e.colno}"
        raise DatasetError(f"{where}: not valid JSON ({e.msg}{at})") from None
    except UnicodeDecodeError as e:
        raise DatasetError(f"{where}: not UTF-8 text ({e.reason})") from None
    except RecursionError:
        raise DatasetError(f"{where}: JSON nested too deeply to read") from None
    except ValueError as e:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        raise DatasetError(f"{where}: unreadable JSON value ({str(e)[:120]})") from None
    # A "\ud800" escape decodes to a lone surrogate, which reads fine and then cannot be written
    # back as UTF-8 (a resumed run would die writing it). Checked only when such an escape occurs.
    if _SURROGATE_ESCAPE.search(text if isinstance(text, str) else text.decode("utf-8", "replace")):
        bad = unwritable(obj, max_nesting=None)
        if bad is not None:
            raise DatasetError(f"{where}: {bad}")
    return obj


_SURROGATE_ESCAPE = re.compile(r"\\[uU][dD][89a-fA-F]")


# How deep a run file's values may nest. The parser reads up to the interpreter's recursion
# limit, but writing such a value back (json.dumps, dataclasses.asdict) from a deeper call fails
# far below it; no record kvaudit writes nests beyond a few levels.
MAX_NESTING = 64


def _utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _name(key: str) -> str:
    """A key for a field path in a message: as is when short and printable, else quoted and cut."""
    return key if len(key) <= 40 and key.isprintable() and _utf8(key) else ascii(key)[:40]


def unwritable(obj: Any, max_nesting: int | None = MAX_NESTING) -> str | None:
    """Why a parsed JSON value cannot be written back as UTF-8 JSON, naming the field, else
    ``None``: a string (key or value) holding a lone surrogate (JSON's ``\\ud800`` escape
    decodes to one; no UTF-8 file can hold it), or nesting deeper than ``max_nesting`` (None: no
    limit). Iterative, so a value nested as deeply as the parser allows is walked without recursion."""
    stack: list[tuple[str, int, Any]] = [("", 0, obj)]
    while stack:
        where, depth, v = stack.pop()
        field_ = f"field '{where if len(where) <= 80 else where[:80] + '...'}'" if where else "the document"
        if isinstance(v, str):
            if not _utf8(v):
                return (f"{field_} is not Unicode text (it holds a lone surrogate, a \\ud800-\\udfff "
                        "escape without its pair)")
        elif isinstance(v, (dict, list)):
            if max_nesting is not None and depth >= max_nesting:
                return f"{field_} nests deeper than {max_nesting} levels"
            if isinstance(v, dict):
                for k, x in reversed(v.items()):
                    sub = f"{where}.{_name(k)}" if where else _name(k)
                    if not _utf8(k):
                        return f"field '{sub[:80]}' is not Unicode text (a key with a lone surrogate)"
                    stack.append((sub, depth + 1, x))
            else:
                stack.extend((f"{where}[{i}]", depth + 1, x) for i, x in reversed(list(enumerate(v))))
    return None


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    return parse_json(read_bytes(path), str(path))


def read_bytes(path: str | os.PathLike) -> bytes:
    """A file's bytes (a DatasetError naming it when it is missing)."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise DatasetError(f"{path}: is a directory, not a file") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot be read ({e.strerror or e})") from None


def iter_jsonl(path: str | os.PathLike, *, tolerate_torn_tail: bool = False,
               data: bytes | None = None) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)``.

    A last line without its newline is a record like any other when it parses; when it does not
    (a writer killed mid-line) it is skipped if ``tolerate_torn_tail``, else an error.
    ``data``: the file's bytes, when the caller has read them already (``path`` names them).
    """
    path = Path(path)
    try:
        text = (read_bytes(path) if data is None else data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    # Split on "\n" only: str.splitlines also breaks at U+2028, U+0085 and other separators that
    # JSON strings may hold raw (json.dumps(ensure_ascii=False) writes them so).
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = parse_json(line, f"{path}, line {n}")
        except DatasetError:
            if tolerate_torn_tail and n == len(lines) and not line.endswith("\n"):
                return
            raise
        if not isinstance(obj, dict):
            raise DatasetError(f"{path}, line {n}: expected a JSON object, got {type(obj).__name__}")
        yield n, obj


def type_name(typ: type | tuple) -> str:
    """A Python type, or a tuple of them, as a message names it (``int/float``)."""
    return typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)


def mend_jsonl_tail(path: str | os.PathLike) -> None:
    """Make an appended JSONL file end at a record boundary before more records are appended.

    A last line without its newline is either a complete record (killed between the write and the
    newline, or saved by an editor): it gets its newline and is kept; or a torn one (killed
    mid-line): it is cut, and its record is made again.
    """
    path = Path(path)
    if not path.exists():
        return
    raw = read_bytes(path)
    if not raw or raw.endswith(b"\n"):
        return
    cut = raw.rfind(b"\n") + 1
    try:
        complete = isinstance(parse_json(raw[cut:], str(path)), dict)
    except DatasetError:
        complete = False
    write_atomic(path, (raw + b"\n" if complete else raw[:cut]).decode("utf-8", errors="strict"))


class JsonlAppender:
    """Appends whole records to an open JSONL file (``to_dict`` makes each one's JSON object);
    :meth:`flush` makes them durable. The run's pairs and a replay's requests are appended this way."""

    def __init__(self, f: Any, to_dict: Any) -> None:
        self._f = f
        self._to_dict = to_dict
        self.written = 0

    def append(self, rec: Any) -> None:
        try:
            self._f.write(dump_jsonl([self._to_dict(rec)]))
        except OSError as e:  # a full disk: the error names no file
            raise naming(e, self._f.name) from e
        self.written += 1

    def flush(self) -> None:
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
        except OSError as e:
            raise naming(e, self._f.name) from e


@contextmanager
def appending_jsonl(path: str | os.PathLike, to_dict: Any) -> Iterator[JsonlAppender]:
    """A :class:`JsonlAppender` on ``path`` (created with its folder), flushed and closed when the
    block ends; an error of that flush or close (a full disk) names ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed below, its error named)
    appender = JsonlAppender(f, to_dict)
    try:
        yield appender
    finally:
        try:
            appender.flush()
        finally:
            try:
                f.close()  # flushes again what the failed flush left in the buffer
            except OSError as e:
                raise naming(e, path) from e

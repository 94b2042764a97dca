"""Reading a corpus: the documents of a folder, one file or a saved ``datasets`` folder.

A folder is searched recursively in sorted path order: ``.txt``/``.md`` files are one document
each, ``.jsonl`` and ``.parquet`` files one document per row (text in ``text_field``). A file that
cannot be used (unreadable: not UTF-8, permission denied, damaged JSONL or parquet; empty; or
larger than ``max_file_bytes``) is skipped and named with its reason, or refused with ``strict``;
hidden and unsupported files and empty documents are counted. A whole file is used or skipped.

The walk stays inside the folder: a link that resolves outside it (a file or a folder) is skipped
and named (kind ``outside``), a broken link too; a link to a file inside the folder is read; a
link to a folder is never descended into (one inside the folder is counted: its files are read
under their own path), so no link can make the walk loop.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvaudit.core.errors import DatasetError, KvauditError
from kvaudit.core.jsonio import parse_json
from kvaudit.core.progress import progress_bar

SUFFIXES = (".txt", ".md", ".jsonl", ".parquet")
DEFAULT_MAX_FILE_BYTES = 64 * 2**20  # 64 MiB; 0 = no limit
SKIP_KINDS = ("unreadable", "empty", "oversized", "outside")


@dataclass
class SourceDoc:
    source: str  # file path, plus ":line" or "#row" for multi-document files
    text: str



def _is_saved_dataset(p: Path) -> bool:
    return any((p / n).exists() for n in ("dataset_info.json", "dataset_dict.json", "state.json"))


def _cut(name: str, n: int = 80) -> str:
    """A user's field name quoted for a message (``repr``: control characters escaped), cut to
    ``n`` characters."""
    r = repr(name)
    return r if len(r) <= n else r[:n] + "..."


def _field(obj: Any, field: str, where: str, keys: list[str]) -> str | None:
    """The text of one record, or None when it is missing or blank (counted as skipped)."""
    if field not in keys:
        named = ", ".join(_cut(str(k), 40) for k in keys[:10]) + (f", ... ({len(keys)} fields)"
                                                                   if len(keys) > 10 else "")
        raise KvauditError(f"{where}: no field {_cut(field)} (fields: {named or 'none'}); "
                           "choose one with --text-field")
    if obj is None:
        return None
    if not isinstance(obj, str):
        raise KvauditError(f"{where}: field {_cut(field)} must be a string, got {type(obj).__name__}")
    return obj if obj.strip() else None


class SkippedFile(Exception):
    """A corpus file that cannot be used: ``kind`` is one of :data:`SKIP_KINDS`."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason


def _json_line(line: str, n: int) -> Any:
    """One JSONL line's value; a line :func:`parse_json` refuses (malformed, an integer of more
    digits than Python converts, nesting too deep, a lone surrogate) makes the file unreadable,
    named by its line."""
    try:
        return parse_json(line, f"line {n}")
    except DatasetError as e:
        raise SkippedFile("unreadable", str(e)) from None


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as e:
        raise SkippedFile("unreadable", f"not UTF-8 text (undecodable byte at offset {e.start})") from None
    except OSError as e:
        raise SkippedFile("unreadable", f"cannot read ({e.strerror or type(e).__name__})") from None


def _check_size(path: Path, max_file_bytes: int) -> None:
    try:
        size = path.stat().st_size
    except OSError as e:
        raise SkippedFile("unreadable", f"cannot read ({e.strerror or type(e).__name__})") from None
    if size == 0:
        raise SkippedFile("empty", "empty file (0 bytes)")
    if max_file_bytes and size > max_file_bytes:
        raise SkippedFile("oversized", f"{size} bytes, over --max-file-bytes {max_file_bytes}")


def _load_file(path: Path, text_field: str, skipped: Counter,
               max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> list[SourceDoc]:
    """The documents of one file; raises :class:`SkippedFile` when the file cannot be used and
    :class:`KvauditError` for a configuration mistake (a JSONL row without ``text_field``)."""
    _check_size(path, max_file_bytes)
    suffix = path.suffix.lower()
    if suffix in (".txt", ".md"):
        text = _read_text(path)
        if not text.strip():
            raise SkippedFile("empty", "empty file (whitespace only)")
        return [SourceDoc(str(path), text)]
    out = []
    if suffix == ".jsonl":
        # Lines end at "\n" only: str.splitlines would also break inside a JSON string holding a
        # raw U+2028, U+0085 or U+001C (iter_jsonl's rule).
        lines = _read_text(path).split("\n")
        if not any(line.strip() for line in lines):
            raise SkippedFile("empty", "empty file (whitespace only)")
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            obj = _json_line(line, n)
            if not isinstance(obj, dict):
                raise SkippedFile("unreadable", f"line {n}: expected a JSON object, got "
                                                f"{type(obj).__name__}")
            text = _field(obj.get(text_field), text_field, f"{path}, line {n}", list(obj))
            if text is None:
                skipped["empty_documents"] += 1
            else:
                try:
                    out.append(SourceDoc(f"{path}:{n}", text))
                except SkippedFile as e:
                    raise SkippedFile(e.kind, f"line {n}: field {_cut(text_field)}: {e.reason}") from None
        return out
    if suffix == ".parquet":
        import pandas as pd

        try:
            df = pd.read_parquet(path)
        except Exception as e:  # pyarrow raises many types for a damaged file
            raise SkippedFile("unreadable", f"cannot read as parquet ({type(e).__name__}: {e})") from None
        if not len(df):
            raise SkippedFile("empty", "empty file (no rows)")
        cols = [str(c) for c in df.columns]
        if text_field not in cols:
            _field(None, text_field, str(path), cols)
        for i, v in enumerate(df[text_field].tolist()):
            text = _field(None if v is None or v != v else v, text_field, f"{path}, row {i}", cols)
            if text is None:
                skipped["empty_documents"] += 1
            else:
                out.append(SourceDoc(f"{path}#{i}", text))
        return out
    raise AssertionError(suffix)


def _load_saved_dataset(path: Path, text_field: str, split: str | None,
                        skipped: Counter) -> list[SourceDoc]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # datasets raises FileNotFoundError, ValueError, ... for bad folders
        raise KvauditError(f"{path}: cannot load as a saved dataset ({type(e).__name__}: {e})") from None
    if isinstance(ds, datasets.DatasetDict):
        names = sorted(ds)
        if split is None and len(names) == 1:
            split = names[0]
        if split not in ds:
            raise KvauditError(f"{path}: choose a split with --split ({', '.join(names)})")
        ds = ds[split]
    cols = list(ds.column_names)
    if text_field not in cols:
        _field(None, text_field, str(path), cols)
    out = []
    for i, v in enumerate(ds[text_field]):
        text = _field(v, text_field, f"{path}, row {i}", cols)
        if text is None:
            skipped["empty_documents"] += 1
        else:
            out.append(SourceDoc(f"{path}#{i}", text))
    return out


def _link_usable(link: Path, root: Path, skipped: Counter, skipped_files: list[dict[str, str]],
                 strict: bool) -> bool:
    """Whether a link in the corpus folder is read: a link to a file inside the folder is; a link
    that resolves outside the folder, or to nothing, is skipped and named (refused with
    ``strict``); a link to a folder inside it is counted and passed over (that folder is read
    under its own path)."""
    target = Path(os.path.realpath(link))  # never raises, even on a link loop
    if not target.is_relative_to(root):
        e = SkippedFile("outside", f"a link to {target}, outside the corpus folder {root}")
        counter = "links_outside"
    elif target.is_dir():
        skipped["linked_folders"] += 1
        return False
    elif not target.is_file():
        e = SkippedFile("unreadable", "a broken link (it leads to no file, or loops)")
        counter = "broken_links"
    else:
        return True
    if strict:
        raise _refuse(link, e)
    skipped[counter] += 1
    skipped_files.append({"file": str(link), "kind": e.kind, "reason": e.reason})
    return False


def _refuse(path: Path, e: SkippedFile) -> KvauditError:
    return KvauditError(f"{path}: {e.reason}; refused by --strict (without it the file is skipped "
                        "and named in dataset.json)")


def load_corpus(path: str | Path, text_field: str = "text", split: str | None = None,
                skipped: Counter | None = None, *, strict: bool = False,
                max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                skipped_files: list[dict[str, str]] | None = None,
                progress: bool = False) -> list[SourceDoc]:
    """Read every document under ``path``; skipped items are counted in ``skipped``.

    A file that cannot be used (:class:`SkippedFile`: unreadable, empty, over ``max_file_bytes``,
    0 = no limit) is appended to ``skipped_files`` as ``{"file", "kind", "reason"}`` and
    counted as ``<kind>_files``; with ``strict`` it is a :class:`KvauditError` naming the file.
    """
    p = Path(path)
    skipped = skipped if skipped is not None else Counter()
    skipped_files = skipped_files if skipped_files is not None else []
    if not p.exists():
        raise KvauditError(f"{p}: no such file or folder")
    if p.is_dir() and _is_saved_dataset(p):
        return _load_saved_dataset(p, text_field, split, skipped)
    if p.is_file():
        if p.suffix.lower() not in SUFFIXES:
            raise KvauditError(f"{p}: unsupported file type (use {', '.join(SUFFIXES)})")
        files = [p]
    else:
        files = []
        root = Path(os.path.realpath(p))
        # rglob lists a link but never descends into a linked folder, so the walk stays in the
        # folder's own tree and cannot loop; a link is then judged by where it resolves to.
        for f in sorted(p.rglob("*"), key=lambda f: f.relative_to(p).as_posix()):
            rel = f.relative_to(p)
            if any(part.startswith(".") for part in rel.parts):
                skipped["hidden_files"] += int(f.is_file())
            elif f.is_symlink() and not _link_usable(f, root, skipped, skipped_files, strict):
                continue
            elif f.is_dir():
                if not os.access(f, os.R_OK | os.X_OK):  # rglob passes over it without a word
                    e = SkippedFile("unreadable", "cannot read folder (permission denied)")
                    if strict:
                        raise _refuse(f, e)
                    skipped["unreadable_folders"] += 1
                    skipped_files.append({"file": str(f), "kind": e.kind, "reason": e.reason})
            elif f.is_file():
                if f.suffix.lower() in SUFFIXES:
                    files.append(f)
                else:
                    skipped["unsupported_files"] += 1
        if not files:
            raise KvauditError(f"{p}: no {', '.join(SUFFIXES)} files found "
                               f"({skipped['unsupported_files']} other files)")
    docs = []
    for f in progress_bar(files, desc="reading files", unit="file", enabled=progress):
        try:
            docs.extend(_load_file(f, text_field, skipped, max_file_bytes))
        except SkippedFile as e:
            if strict or p.is_file():
                raise (_refuse(f, e) if strict else KvauditError(f"{f}: {e.reason}")) from None
            skipped[f"{e.kind}_files"] += 1
            skipped_files.append({"file": str(f), "kind": e.kind, "reason": e.reason})
    if not docs:
        if not skipped_files:
            raise KvauditError(f"{p}: every document is empty")
        named = "; ".join(f"{s['file']}: {s['reason']}" for s in skipped_files[:3])
        more = f"; and {len(skipped_files) - 3} more" if len(skipped_files) > 3 else ""
        raise KvauditError(f"{p}: no usable document: {len(skipped_files)} skipped ({named}{more}), "
                           "any others empty")
    return docs


def format_skipped(skipped_files: list[dict[str, str]], limit: int = 20) -> str:
    """The skipped files for the printed summary, one per line (at most ``limit`` named)."""
    if not skipped_files:
        return ""
    n = len(skipped_files)
    lines = [f"skipped {n} file{'s' if n != 1 else ''} (listed in dataset.json counts.skipped_files; "
             "--strict refuses instead):"]
    lines += [f"  {s['file']}: {s['reason']}" for s in skipped_files[:limit]]
    if n > limit:
        lines.append(f"  ... and {n - limit} more")
    return "\n".join(lines)

"""What a run directory and a replay directory share (:class:`WorkDir`): a path, one writer at a
time (the directory's lock), and a journal: an append-only JSONL file of finished records (a run's
``pairs.jsonl``, a replay's ``requests.jsonl``) that a killed process may leave torn, mended before
appending so that a resumed command runs again only what did not finish.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from kvaudit.core.jsonio import JsonlAppender, appending_jsonl, mend_jsonl_tail
from kvaudit.core.run_lock import run_lock

R = TypeVar("R")


class WorkDir(Generic[R]):
    """A directory one kvaudit command writes at ``path`` (which need not exist yet); subclasses
    name their journal (:attr:`journal_name`), read it (:meth:`read_journal`) and write a record
    (:meth:`record_to_dict`)."""

    journal_name: ClassVar[str]

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    @property
    def journal_file(self) -> Path:
        return self.path / self.journal_name

    def lock(self, command: str, *, create: bool = False) -> contextlib.AbstractContextManager[None]:
        """This directory's writer lock (:func:`kvaudit.core.run_lock.run_lock`)."""
        return run_lock(self.path, command, create=create)

    def read_journal(self) -> list[R]:
        """Every record of the journal, validated (a torn last line is skipped)."""
        raise NotImplementedError

    def record_to_dict(self, record: R) -> dict[str, Any]:
        """One journal record as its JSON object."""
        raise NotImplementedError

    def finished_records(self) -> list[R]:
        """The journal's records after mending its tail for appending: a complete unterminated last
        record gets its newline, a torn one is cut (and runs again)."""
        mend_jsonl_tail(self.journal_file)
        return self.read_journal() if self.journal_file.exists() else []

    @contextlib.contextmanager
    def appending(self) -> Iterator[JsonlAppender]:
        """Append records to the journal (mend its tail first: :meth:`finished_records`)."""
        with appending_jsonl(self.journal_file, self.record_to_dict) as appender:
            yield appender

"""One registry type for everything kvaudit looks up by name: commands, generators, backends and
audit checks.

In the manner of lm-evaluation-harness's registry: a :class:`Registry` maps names to entries, in
the order they were registered, and an unknown name is a user error that lists the known ones. A
lazy :class:`Entry` names its implementation as ``"module"`` or ``"module:attribute"`` and imports
it only in :meth:`Entry.load`, so ``kvaudit --help`` imports no engine, generator or model code.
Entries that are objects already (the audit's checks, registered by a decorator) are stored as they
are; any object with a ``name`` is an entry.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from kvaudit.core.errors import KvauditError


class Named(Protocol):
    @property
    def name(self) -> str: ...


E = TypeVar("E", bound=Named)


class UnknownName(KvauditError, KeyError):
    """A name no entry of the registry has (a :class:`KeyError` too, so ``in`` and ``get`` work)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Entry:
    """A lazily imported implementation: ``target`` is ``"module"`` or ``"module:attribute"``."""

    name: str
    target: str
    help: str = ""

    def load(self) -> Any:
        module, _, attr = self.target.partition(":")
        obj = importlib.import_module(module)
        return getattr(obj, attr) if attr else obj


class Registry(Mapping[str, E], Generic[E]):
    """Entries by name, in registration order. ``kind`` names them in messages ("backend");
    ``requires``: the callables a loaded module must have (checked by :meth:`load`)."""

    def __init__(self, kind: str, entries: Iterable[E] = (), *, requires: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.requires = requires
        self._entries: dict[str, E] = {}
        for e in entries:
            self.register(e)

    def register(self, entry: E) -> E:
        if entry.name in self._entries:
            raise ValueError(f"{self.kind} {entry.name!r} registered twice")
        self._entries[entry.name] = entry
        return entry

    def __getitem__(self, name: str) -> E:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownName(f"unknown {self.kind} {name!r}; known: {', '.join(self._entries)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def load(self, name: str) -> Any:
        """Import entry ``name``'s implementation and check it has :attr:`requires`."""
        entry = self[name]
        obj = entry.load()  # type: ignore[attr-defined]
        missing = [f for f in self.requires if not callable(getattr(obj, f, None))]
        if missing:
            raise TypeError(f"{self.kind} {name!r} ({entry.target}) lacks {', '.join(missing)}")  # type: ignore[attr-defined]
        return obj

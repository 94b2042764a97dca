"""Check a parsed JSON object against a dataclass's own annotations, so a record's field types are
declared once (in the dataclass) and the reader's checks follow from them.

The annotations understood are the ones run records use: ``str``, ``int``, ``float`` (an integer
is a number too), ``Any``, ``Literal[...]`` (one of its words: :mod:`kvaudit.core.vocabulary`), ``list[X]``, ``tuple[X, Y]`` (a JSON list of that length),
``dict[str, X]``, ``X | None`` and a nested dataclass. ``bool`` is never an ``int`` here (JSON
``true`` is not a count). A field without a default is required; a field with a default may be
absent, and may be ``null`` only when its annotation says ``| None``.

Errors are :class:`~kvaudit.core.errors.DatasetError` starting with ``where`` (file and line) and
naming the field: ``field 'top_k[0]' must be [int, int/float], got list``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any

from kvaudit.core.errors import DatasetError, excerpt

_NAMES = {str: "str", int: "int", float: "int/float", dict: "dict", list: "list"}  # as the other readers say


def _describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return "any value"
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (types.UnionType, typing.Union):
        return " or ".join("null" if a is type(None) else _describe(a) for a in args)
    if origin is list:
        return f"a list of {_plural(args[0])}"
    if origin is tuple:
        return "[" + ", ".join(_describe(a) for a in args) + "]"
    if origin is dict:
        return "dict" if args[1] is Any else f"a dict mapping names to {_describe(args[1])}"
    if dataclasses.is_dataclass(tp):
        return "dict"
    return _NAMES.get(tp, getattr(tp, "__name__", str(tp)))


def _plural(tp: Any) -> str:
    if tp is Any:
        return "values"
    if typing.get_origin(tp) is tuple:
        return _describe(tp) + " pairs" if len(typing.get_args(tp)) == 2 else _describe(tp) + " items"
    return {str: "strings", int: "integers", float: "int/float numbers"}.get(tp, _describe(tp))


def _fits(value: Any, tp: Any) -> bool:
    if tp is Any:
        return True
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return not isinstance(value, bool) and any(type(value) is type(a) and value == a for a in args)
    if origin in (types.UnionType, typing.Union):
        return any(_fits(value, a) for a in args)
    if tp is type(None):
        return value is None
    if isinstance(value, bool):
        return tp is bool
    if tp is float:
        return isinstance(value, (int, float))
    if tp in (str, int, bool):
        return isinstance(value, tp)
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if origin is tuple:
        return (isinstance(value, list) and len(value) == len(args)
                and all(_fits(v, a) for v, a in zip(value, args, strict=True)))
    if origin is dict:
        return isinstance(value, dict) and all(_fits(v, args[1]) for v in value.values())
    if tp is dict or tp is list:
        return isinstance(value, tp)
    if dataclasses.is_dataclass(tp):
        return isinstance(value, dict)
    raise TypeError(f"typed_json: annotation {tp!r} is not supported")


@cache
def _spec(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name],
                  f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                 for f in dataclasses.fields(cls))


def _type_word(value: Any, tp: Any = None) -> str:
    if isinstance(value, str) and typing.get_origin(tp) is typing.Literal:  # a word outside the vocabulary
        return repr(excerpt(value, 40))
    return "null" if value is None else type(value).__name__


def check_fields(obj: dict, cls: type, where: str, *, skip: tuple[str, ...] = ()) -> None:
    """Raise :class:`DatasetError` unless ``obj`` fits the fields of dataclass ``cls`` (nested
    dataclass fields are checked as objects only; fields in ``skip`` are the caller's to check)."""
    for name, tp, required in _spec(cls):
        if name in skip:
            continue
        if name not in obj:
            if required:
                raise DatasetError(f"{where}: missing field '{name}'")
            continue
        value = obj[name]
        if not _fits(value, tp):
            path, tp, value = _first_misfit(name, value, tp)
            raise DatasetError(f"{where}: field '{path}' must be {_describe(tp)}, got {_type_word(value, tp)}")


def _first_misfit(path: str, value: Any, tp: Any) -> tuple[str, Any, Any]:
    """The innermost element of ``value`` that does not fit, to name it (``top_k[3]``,
    ``arms.reuse``) rather than the whole container."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union) and value is not None:
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and typing.get_origin(inner[0]) in (list, dict):
            return _first_misfit(path, value, inner[0])
    if origin is list and isinstance(value, list):
        for i, v in enumerate(value):
            if not _fits(v, args[0]):
                return _first_misfit(f"{path}[{i}]", v, args[0])
    if origin is dict and isinstance(value, dict):
        for k, v in value.items():
            if not _fits(v, args[1]):
                return _first_misfit(f"{path}.{excerpt(str(k), 40)}", v, args[1])
    return path, tp, value

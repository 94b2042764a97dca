"""Check a parsed JSON object against a dataclass's own annotations, so a record's field types are
declared once (in the dataclass) and the reader's checks follow from them: the one validator of
every kvaudit record read from disk (the manifest, audit.json, dataset files, pairs, replays).

:func:`record_from_json` reads an object into its dataclass, nested records (and lists of them)
included: a field's JSON key is its name, or its ``metadata["json"]``; an ``extra`` field collects
the keys the record does not define (an open record, as the manifest is), and without one,
``closed=True`` refuses them. :func:`check_fields` checks an object's fields without building the
record (for readers that build it themselves).

The annotations understood are the ones run records use: ``str``, ``int``, ``float`` (an integer
is a number too), ``Any``, ``Literal[...]`` (one of its words: :mod:`kvaudit.core.vocabulary`), ``list[X]``, ``tuple[X, Y]`` (a JSON list of that length),
``dict[str, X]``, ``X | None`` and a nested dataclass. ``bool`` is never an ``int`` here (JSON
``true`` is not a count). A field without a default is required; a field with a default may be
absent, and may be ``null`` only when its annotation says ``| None``.

Errors are :class:`~kvaudit.core.errors.DatasetError` (or the ``error`` class given) starting with
``where`` (file and line) and naming the field in JSON's words: ``field 'top_k[0]' must be [int, a
number], got list``, ``field 'sessions[1].wall_s' must be a number, got str``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any, TypeVar

from kvaudit.core.errors import DatasetError, excerpt

_NAMES = {str: "str", int: "int", float: "a number", dict: "an object", list: "a list", bool: "bool"}
T = TypeVar("T")


def json_type(v: Any) -> str:
    """A JSON value's type as an error message names it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    return {dict: "object", list: "list", str: "str", int: "int", float: "float"}.get(type(v), type(v).__name__)


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
        return "an object" if args[1] is Any else f"an object of {_plural(args[1])}"
    if dataclasses.is_dataclass(tp):
        return "an object"
    return _NAMES.get(tp, getattr(tp, "__name__", str(tp)))


def _plural(tp: Any) -> str:
    if tp is Any:
        return "values"
    if typing.get_origin(tp) is tuple:
        return _describe(tp) + " pairs" if len(typing.get_args(tp)) == 2 else _describe(tp) + " items"
    if typing.get_origin(tp) is dict or tp is dict or dataclasses.is_dataclass(tp):
        return "objects"
    return {str: "strings", int: "integers", float: "numbers"}.get(tp, _describe(tp))


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
def _spec(cls: type) -> tuple[tuple[str, str, Any, bool], ...]:
    """Per field of dataclass ``cls``: ``(name, JSON key, annotation, required)``; the key is the
    name unless the field's ``metadata["json"]`` says otherwise."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, f.metadata.get("json", f.name), hints[f.name],
                  f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                 for f in dataclasses.fields(cls))


def _type_word(value: Any, tp: Any = None) -> str:
    if isinstance(value, str) and typing.get_origin(tp) is typing.Literal:  # a word outside the vocabulary
        return repr(excerpt(value, 40))
    return json_type(value)


def check_fields(obj: dict, cls: type, where: str, *, skip: tuple[str, ...] = (), closed: bool = False) -> None:
    """Raise :class:`DatasetError` unless ``obj`` fits the fields of dataclass ``cls`` (nested
    dataclass fields are checked as objects only; fields in ``skip`` are the caller's to check;
    ``closed``: a key the dataclass does not define is refused)."""
    if closed:
        unknown = sorted(set(obj) - {key for _, key, _, _ in _spec(cls)})
        if unknown:
            raise DatasetError(f"{where}: unknown field '{excerpt(unknown[0], 40)}'")
    for name, key, tp, required in _spec(cls):
        if name in skip:
            continue
        if key not in obj:
            if required:
                raise DatasetError(f"{where}: missing field '{key}'")
            continue
        _check_value(obj[key], tp, key, where, DatasetError)


def _check_value(value: Any, tp: Any, path: str, where: str, error: type[Exception]) -> None:
    if not _fits(value, tp):
        path, tp, value = _first_misfit(path, value, tp)
        raise error(f"{where}: field '{path}' must be {_describe(tp)}, got {_type_word(value, tp)}")


def _record_class(tp: Any) -> tuple[Any, bool]:
    """``(dataclass, is a list of it)`` when ``tp`` is a dataclass, ``list[dataclass]`` or either
    ``| None``; else ``(None, False)``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in args if a is not type(None)]
        return _record_class(inner[0]) if len(inner) == 1 else (None, False)
    if origin is list and dataclasses.is_dataclass(args[0]):
        return args[0], True
    return (tp, False) if dataclasses.is_dataclass(tp) else (None, False)


def record_from_json(obj: Any, cls: type[T], where: str, *, prefix: str = "", closed: bool = False,
                error: type[DatasetError] = DatasetError) -> T:
    """``obj`` read into dataclass ``cls`` after checking every field against its annotation
    (nested records and lists of them read the same way, their fields named ``name.field`` and
    ``name[i].field``); errors are ``error`` naming ``where`` and the field."""
    if not isinstance(obj, dict):
        what = f"field '{prefix[:-1]}' must be" if prefix else "must be"
        raise error(f"{where}: {what} an object, got {json_type(obj)}")
    values: dict[str, Any] = {}
    keys: set[str] = set()
    open_record = False
    for name, key, tp, required in _spec(cls):  # type: ignore[arg-type]  # a class is hashable
        if name == "extra":
            open_record = True
            continue
        keys.add(key)
        if key not in obj:
            if required:
                raise error(f"{where}: missing field '{prefix}{key}'")
            continue
        value = obj[key]
        inner, many = _record_class(tp)
        if inner is None or value is None:
            _check_value(value, tp, prefix + key, where, error)
        elif many:
            _check_value(value, list, prefix + key, where, error)
            value = [record_from_json(v, inner, where, prefix=f"{prefix}{key}[{i}].", closed=closed, error=error)
                     for i, v in enumerate(value)]
        else:
            value = record_from_json(value, inner, where, prefix=f"{prefix}{key}.", closed=closed, error=error)
        values[name] = value
    unknown = [k for k in obj if k not in keys]
    if open_record:
        values["extra"] = {k: obj[k] for k in unknown}
    elif closed and unknown:
        raise error(f"{where}: unknown field '{prefix}{excerpt(sorted(unknown)[0], 40)}'")
    return cls(**values)


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

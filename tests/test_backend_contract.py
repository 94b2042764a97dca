"""The backend contract: every backend available here runs the same small case set to the same
ids, the same record fields and the same audit verdicts, and they all admit the same models.

The transformers backend always runs (in-process, through `kvaudit run`); the vLLM backend runs
where vLLM is importable (`.venv-vllm`, `make test`), in its own process, so its engine never
shares a process with another test module's engine.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kvaudit.core.errors import KvauditError, UnsupportedModelError
from kvaudit.runners.backend import LOGIT_DIFF_KINDS, Backend
from kvaudit.runners.registry import BACKENDS
from kvaudit.runners.rope import RopeSpec

from .conftest import CONTRACT_CASES, contract_run_args

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "kvaudit" / "data" / "example"
HAVE_VLLM = importlib.util.find_spec("vllm") is not None
AVAILABLE = ["transformers"] + (["vllm"] if HAVE_VLLM else [])
# Fields that must be equal across backends, per pair and per arm (the prompt and its accounting).
PAIR_SAME = ("case_id", "task", "n_prompt_tokens", "ids_hash", "segment_ids", "segment_hashes",
             "segment_spans", "truncation", "arm_order", "answers", "metric", "evidence")
ARM_SAME = ("arm", "ids_hash", "segment_hashes", "truncation", "tokens_reused", "tokens_computed",
            "cache_hit_tokens")


@pytest.fixture(scope="module")
def contract_runs(transformers_run, boxoffice5, tmp_path_factory, request) -> dict[str, Path]:
    """Each backend's run of the session's first cases: transformers in process (conftest's
    ``transformers_run``), vLLM in its own process (conftest's ``kvaudit_process``), so its engine
    never shares one with the session's in-process engine."""
    runs = {"transformers": transformers_run}
    if HAVE_VLLM:
        out = tmp_path_factory.mktemp("contract") / "vllm"
        proc = request.getfixturevalue("kvaudit_process")(contract_run_args("vllm", boxoffice5, out), cwd=ROOT,
                                                           timeout=1200)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs["vllm"] = out
    return runs


def _pairs(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "pairs.jsonl").read_text().splitlines()]


def _verdicts(run: Path) -> tuple[str, dict[str, tuple[bool, bool]]]:
    from kvaudit.audit.audit_cli import audit

    res = audit(run)
    return res["verdict"], {c["name"]: (c["passed"], c.get("cannot_judge", False)) for c in res["checks"]}


# --------------------------------------------------------------------------- every backend, one case set


def test_every_backend_writes_the_same_ids_and_fields(contract_runs):
    by_backend = {b: _pairs(r) for b, r in contract_runs.items()}
    ref = by_backend["transformers"]
    assert len(ref) == CONTRACT_CASES
    arm_fields = set(ref[0]["arms"]["recompute"])
    for b, pairs in by_backend.items():
        assert [p["case_id"] for p in pairs] == [p["case_id"] for p in ref], b
        for p, q in zip(pairs, ref):
            assert set(p) == set(q), b
            for k in PAIR_SAME:
                assert p[k] == q[k], (b, p["case_id"], k)
            assert sorted(p["arms"]) == sorted(q["arms"]) == sorted(p["arm_order"])
            for name, r in p["arms"].items():
                assert set(r) == arm_fields, (b, name)
                for k in ARM_SAME:
                    assert r[k] == q["arms"][name][k], (b, p["case_id"], name, k)
                # every arm but the reference is compared with the reference
                assert (r["logit_diff_vs_recompute"] is None) == (name == "recompute"), (b, name)
            assert p["arms"]["reuse"]["tokens_reused"] > 0
            assert p["arms"]["recompute"]["tokens_reused"] == 0


def test_every_backend_says_what_its_logit_difference_measures(contract_runs):
    kinds = {}
    for b, run in contract_runs.items():
        m = json.loads((run / "manifest.json").read_text())
        assert m["backend"]["backend"] == b
        kinds[b] = m["backend"]["logit_diff_kind"]
        assert kinds[b] in LOGIT_DIFF_KINDS
    assert kinds["transformers"] == "logits"
    if "vllm" in kinds:
        assert kinds["vllm"] == "top_logprobs"


def test_every_backend_gets_the_same_audit_verdicts(contract_runs):
    verdicts = {b: _verdicts(r) for b, r in contract_runs.items()}
    ref = verdicts["transformers"]
    assert ref[0] in ("passed", "cannot_judge")
    identity = [v for k, v in ref[1].items() if k.startswith("identity")]  # the check's name: audit's
    assert identity and all(v == (True, False) for v in identity)  # the identity control passes
    for b, v in verdicts.items():
        assert v == ref, b


# --------------------------------------------------------------------------- no model needed


def test_registered_backends_satisfy_the_protocol():
    from kvaudit.runners.engines.http.backend import OpenAIBackend
    from kvaudit.runners.engines.transformers.backend import TransformersBackend

    assert set(BACKENDS) >= {"transformers", "vllm"}
    for attr in ("name", "tok", "fingerprint", "decoding", "neutral_hash", "max_prompt_tokens", "cache"):
        assert attr in Backend.__annotations__
    assert TransformersBackend.name == "transformers" and OpenAIBackend.name == "openai"
    assert issubclass(TransformersBackend, Backend) and issubclass(OpenAIBackend, Backend)
    if HAVE_VLLM:
        from kvaudit.runners.engines.vllm.backend import VllmBackend

        assert VllmBackend.name == "vllm" and issubclass(VllmBackend, Backend)
    for b in BACKENDS.values():
        assert ":" in b.target
        if b.name != "vllm" or HAVE_VLLM:
            assert callable(b.load())


@pytest.mark.parametrize("backend,option", [
    ("transformers", ["--max-model-len", "2048"]),
    ("transformers", ["--tensor-parallel-size", "2"]),
    ("transformers", ["--no-enforce-eager"]),
    ("transformers", ["--batch-invariant"]),
    ("transformers", ["--concurrent-cases", "4"]),
    ("vllm", ["--threads", "2"]),
    ("vllm", ["--device", "cuda"]),
])
def test_another_backends_option_is_refused_not_ignored(backend, option, tmp_path, capsys):
    from kvaudit.cli import main

    code = main(contract_run_args(backend, EXAMPLE, tmp_path / "run") + option)
    assert code == 2
    err = capsys.readouterr().err
    assert option[0] in err and f"--backend {backend} does not take it" in err
    assert not (tmp_path / "run").exists()  # refused before any work


def test_backend_options_reach_the_opener():
    import argparse

    from kvaudit.runners.registry import add_backend_arguments, backend_options

    p = argparse.ArgumentParser()
    add_backend_arguments(p)
    assert backend_options(p.parse_args([])) == {"device": "cpu", "threads": None}
    assert backend_options(p.parse_args(["--backend", "vllm", "--no-enforce-eager", "--max-model-len", "8192",
                                         "--concurrent-cases", "8"])) == {
        "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "max_model_len": 8192, "enforce_eager": False,
        "batch_invariant": False, "concurrent_cases": 8}
    # one option two backends take: listed once, reaching whichever backend is chosen
    got = backend_options(p.parse_args(["--backend", "openai", "--base-url", "http://x", "--concurrent-cases", "4"]))
    assert got["concurrent_cases"] == 4 and got["base_url"] == "http://x"
    with pytest.raises(KvauditError, match="unknown backend"):
        backend_options(argparse.Namespace(backend="http"))


def _config(**overrides):
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def _loaded(cfg):
    """A stand-in for a loaded model: its config and a rotary embedding of the config's size."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rotary = SimpleNamespace(inv_freq=torch.ones(head_dim // 2))
    return SimpleNamespace(config=cfg, model=SimpleNamespace(rotary_emb=rotary))


REFUSED = {
    "dynamic rope": ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}}, "dynamic"),
    "longrope": ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "longrope"),
    "partial rotary": ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                            "partial_rotary_factor": 0.5}}, "partial"),
    "per-layer rope": ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
                       "per-layer"),
    # the two below were admitted by the vLLM side and refused by the transformers side before
    "layers without rope": ({"no_rope_layers": [1, 0]}, "without RoPE"),
    "mixed layer types": ({"layer_types": ["full_attention", "sliding_attention"]}, "mixed attention"),
    "model type": ({"model_type": "gpt2"}, "model type"),
}


@pytest.mark.parametrize("what", list(REFUSED))
def test_both_backends_refuse_the_same_models(what):
    overrides, match = REFUSED[what]
    cfg = _config(**overrides)
    with pytest.raises(UnsupportedModelError, match=match):
        RopeSpec.from_model(_loaded(cfg))  # the transformers backend's path
    with pytest.raises(UnsupportedModelError, match=match):
        RopeSpec.from_config(cfg)  # the vLLM backend's and its connector's path


def test_both_backends_admit_the_same_models():
    for overrides in ({}, {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
                      {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}):
        cfg = _config(**overrides)
        a, b = RopeSpec.from_model(_loaded(cfg)), RopeSpec.from_config(cfg)
        assert (a.rope_type, a.head_dim, a.sliding_window) == (b.rope_type, b.head_dim, b.sliding_window)


class _FakeBackend(Backend):
    """Only what the Backend base class requires: if the runner needed more, this would break."""

    name = "fake"
    fingerprint = "fake-weights"
    neutral_hash = "fake-head"
    max_prompt_tokens = 8000

    def __init__(self):
        from kvaudit.models import load_tokenizer
        from kvaudit.runners.backend import Decoding
        from kvaudit.runners.prompt import Tokenizer
        from kvaudit.runners.segment_cache import CacheStats

        self.tok = Tokenizer(load_tokenizer("smollm2"))
        self.decoding = Decoding(max_new_tokens=4)
        self.cache = SimpleNamespace(capacity_bytes=1 << 20, stats=CacheStats())
        self.ran: list[str] = []

    def info(self):
        return {"backend": self.name, "dtype": "float32", "threads": 1, "torch": torch.__version__,
                "logit_diff_kind": "logits"}

    def run_arm(self, prompt, spec, *, capture_prompt=None, candidates=None):
        from kvaudit.runners.backend import ArmOutput, build_arm_result

        self.ran.append(spec.name)
        shift = {"recompute": 0.0, "reuse": 2.5, "identity": 0.25}[spec.name]
        logits = torch.arange(10, dtype=torch.float32) + shift * (torch.arange(10) == 3)
        res = build_arm_result(spec, prompt, self.tok, self.decoding, answer_ids=[42],
                               top=[(9, 9.0), (8, 8.0)], ttft_s=0.01, decode_s=0.01, tokens_reused=0,
                               cache_hit_tokens=0, fingerprints={}, canary=None)
        return ArmOutput(result=res, first_logits=logits, build_s=0.0)


def test_the_runner_needs_only_the_protocol_and_takes_the_reference_whatever_the_order(tmp_path):
    from kvaudit.core.dataset_format import read_dataset
    from kvaudit.core.run_format import read_pairs
    from kvaudit.runners.runner import RunConfig, execute

    be = _FakeBackend()
    assert isinstance(be, Backend)
    # the reference runs last here: the differences must still be against its logits
    cfg = RunConfig(dataset=read_dataset(EXAMPLE), out=tmp_path / "run", arms=["reuse", "identity", "recompute"],
                    model_name="fake", limit=2)
    execute(cfg, be, progress=False)
    assert be.ran[:3] == ["reuse", "identity", "recompute"]
    for rec in read_pairs(tmp_path / "run"):
        assert rec.arms["recompute"].logit_diff_vs_recompute is None
        assert rec.arms["reuse"].logit_diff_vs_recompute == pytest.approx(2.5)
        assert rec.arms["identity"].logit_diff_vs_recompute == pytest.approx(0.25)
    with pytest.raises(KvauditError, match="reference arm"):
        execute(RunConfig(dataset=read_dataset(EXAMPLE), out=tmp_path / "run2", arms=["reuse"], model_name="fake"),
                be, progress=False)


def test_a_backend_whose_info_lacks_a_required_key_is_refused_before_any_case(tmp_path):
    from kvaudit.core.dataset_format import read_dataset
    from kvaudit.runners.runner import RunConfig, execute

    be = _FakeBackend()
    be.info = lambda: {"backend": "fake", "dtype": "float32", "threads": 1, "logit_diff_kind": "logits"}
    cfg = RunConfig(dataset=read_dataset(EXAMPLE), out=tmp_path / "run", arms=["recompute", "reuse"],
                    model_name="fake", limit=1)
    with pytest.raises(KvauditError, match="info\\(\\) lacks torch"):
        execute(cfg, be, progress=False)
    assert be.ran == []

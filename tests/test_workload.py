"""Workload generator: determinism, structure, the documented calibration, and its CLI."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvaudit.core.errors import KvauditError
from kvaudit.core.trace import DOCUMENT, PREFIX, QUESTION, _read_careful, read_trace
from kvaudit.generators import workload
from kvaudit.generators.workload import WorkloadParams, generate, write_workload
from kvaudit.simulator.kv_bytes import resolve_model
from kvaudit.simulator.prefix_cache import simulate_prefix
from kvaudit.simulator.segment_cache import simulate_segment

SMALL = WorkloadParams(requests=400, documents=500, queries=30, docs_per_request=4,
                       doc_tokens="lognormal:300:0.5", prefix_tokens=50)


def _write(tmp_path: Path, params: WorkloadParams, name: str) -> bytes:
    path = tmp_path / name
    write_workload(path, generate(params), params)
    return path.read_bytes()


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    a = _write(tmp_path, SMALL, "a.jsonl")
    assert a == _write(tmp_path, SMALL, "b.jsonl")
    assert a != _write(tmp_path, replace(SMALL, seed=1), "c.jsonl")


@pytest.mark.parametrize("queries", [30, 0])
def test_request_structure(queries):
    p = replace(SMALL, queries=queries, requests=2000)
    tr = generate(p)
    width = p.docs_per_request + 2
    kind = tr.kind.reshape(-1, width)
    content = tr.content.reshape(-1, width)
    assert (kind[:, 0] == PREFIX).all() and (kind[:, -1] == QUESTION).all()
    assert (kind[:, 1:-1] == DOCUMENT).all()
    docs = np.sort(content[:, 1:-1], axis=1)
    assert (docs[:, 1:] != docs[:, :-1]).all()  # distinct documents within a request
    shared = content[:, 0] == p.documents
    assert abs(shared.mean() - p.shared_prefix_share) < 0.03
    assert len(np.unique(content[~shared, 0])) == (~shared).sum()  # dynamic prefixes never repeat
    assert len(np.unique(content[:, -1])) == p.requests  # nor do questions
    assert (tr.tokens.reshape(-1, width)[:, 0] == p.prefix_tokens).all()
    assert np.all(np.diff(tr.timestamps) >= 0) and tr.timestamps[-1] > 0
    # Zipf: the most popular document shows up far more often than a typical one.
    counts = np.bincount(content[:, 1:-1].ravel(), minlength=p.documents)
    assert counts.max() > 5 * max(1, np.median(counts[counts > 0]))


def test_query_pool_repeats_exact_document_lists():
    tr = generate(SMALL)
    lists = {tuple(r) for r in tr.content.reshape(SMALL.requests, -1)[:, 1:-1]}
    assert len(lists) <= SMALL.queries
    fresh = generate(replace(SMALL, queries=0))
    assert len({tuple(r) for r in fresh.content.reshape(SMALL.requests, -1)[:, 1:-1]}) > 300


def test_shift_every_moves_popularity_and_reuse_decays():
    p = replace(SMALL, requests=600, shift_every=300)
    tr = generate(p)
    docs = tr.content.reshape(p.requests, -1)[:, 1:-1]
    def top_list(rows):
        lists, counts = np.unique(rows, axis=0, return_counts=True)
        return tuple(lists[counts.argmax()])

    assert top_list(docs[:300]) != top_list(docs[300:])
    hits, _ = simulate_segment(tr, capacity_tokens=30_000)
    prompt = tr.request_tokens()
    before = hits[200:300].sum() / prompt[200:300].sum()
    after = hits[300:330].sum() / prompt[300:330].sum()
    assert after < before - 0.2


def test_written_file_reads_back_as_the_same_trace(tmp_path):
    tr = generate(SMALL)
    path = tmp_path / "w.jsonl"
    write_workload(path, tr, SMALL)
    for back in (read_trace(path), _read_careful(path)):
        assert back.request_ids[:2] == ["r0000000", "r0000001"]
        assert np.array_equal(back.offsets, tr.offsets) and np.array_equal(back.tokens, tr.tokens)
        assert np.array_equal(back.kind, tr.kind)
        # Same partition into contents (codes may be renumbered).
        pairs = set(zip(back.content.tolist(), tr.content.tolist(), strict=True))
        assert len(pairs) == len(np.unique(tr.content)) == len(np.unique(back.content))
        assert np.allclose(back.timestamps, tr.timestamps)


def test_defaults_reproduce_the_documented_headline_numbers():
    """docs/simulator.md quotes these (seed 0); update both together."""
    tr = generate(WorkloadParams())
    bpt = resolve_model("gpt-oss-120b").bytes_per_token
    total = tr.request_tokens().sum()
    seg30 = simulate_segment(tr, 30 * 10**9 // bpt)[0].sum() / total
    pre30 = simulate_prefix(tr, 30 * 10**9 // bpt).sum() / total
    pre1t = simulate_prefix(tr, 10**12 // bpt).sum() / total
    assert seg30 == pytest.approx(0.632, abs=0.01)
    assert pre30 == pytest.approx(0.029, abs=0.005)
    assert pre1t == pytest.approx(0.164, abs=0.01)


@pytest.mark.parametrize("change, message", [
    ({"docs_per_request": 0}, "--docs-per-request"),
    ({"shared_prefix_share": 1.5}, "--shared-prefix-share"),
    ({"doc_tokens": "lognormal:500"}, "--doc-tokens"),
    ({"question_tokens": "uniform:50:10"}, "LO <= HI"),
    ({"requests": 0}, "--requests"),
])
def test_bad_parameters_are_clear_errors(change, message):
    with pytest.raises(KvauditError, match=message):
        generate(replace(SMALL, **change))


def test_cli_writes_workload(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    workload.add_arguments(parser)
    out = tmp_path / "w.jsonl"
    args = parser.parse_args(["--out", str(out), "--requests", "50", "--documents", "100",
                              "--queries", "0", "--docs-per-request", "3", "--seed", "7"])
    assert workload.run(args) == 0
    tr = read_trace(out)
    assert tr.n_requests == 50 and len(tr.kind) == 50 * 5
    assert "wrote" in capsys.readouterr().out


def _umask(mask: int) -> int:
    import os

    return os.umask(mask)


def test_outputs_get_the_mode_a_plain_open_gives(tmp_path):
    """Issue 38 (8): the workload was written 0600 (the temp file's mode); now 0666 less the
    umask, as every file written atomically."""
    from kvaudit.cli import main

    log = tmp_path / "log.jsonl"
    log.write_text('{"prompt": "sys##doc##q"}\n')
    old = _umask(0o022)
    try:
        assert main(["generate", "workload", "--out", str(tmp_path / "w.jsonl"), "--requests", "5",
                     "--documents", "20", "--no-progress"]) == 0
        assert main(["generate", "workload", "--from-log", str(log), "--split", "delimiter:##",
                     "--tokenizer", "smollm2", "--out", str(tmp_path / "l.jsonl")]) == 0
        _umask(0o027)
        assert main(["generate", "workload", "--out", str(tmp_path / "w2.jsonl"), "--requests", "5",
                     "--documents", "20", "--no-progress"]) == 0
    finally:
        _umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir() if p.name != "log.jsonl"}
    assert modes == {"w.jsonl": 0o644, "l.jsonl": 0o644, "l.card.json": 0o644, "w2.jsonl": 0o640}


def test_a_failed_write_leaves_no_folder_or_file(tmp_path, monkeypatch, capsys):
    """Issue 38 (8): the folders --out needed are made for the write and removed when it fails."""
    from kvaudit.cli import main

    def interrupted(trace, params):
        yield "{}\n"
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(workload, "workload_lines", interrupted)
    out = tmp_path / "new" / "sub" / "w.jsonl"
    assert main(["generate", "workload", "--out", str(out), "--requests", "5", "--documents", "20",
                 "--no-progress"]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []

"""Importers: a small ctxs-style file and LongBench JSONL, reorder variants, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvaudit import cli
from kvaudit.core.dataset_format import CARD_FILE, CASES_FILE, SEGMENTS_FILE, read_dataset
from kvaudit.generators import importers

CTXS = [
    {"question": "Who founded Varnholt?", "answers": ["Mara Voss"],
     "ctxs": [{"title": "Varnholt", "text": "Varnholt was founded by Mara Voss.", "is_supporting": True},
              {"title": "Ostervale", "text": "Ostervale is a coastal town.", "is_supporting": False},
              {"title": "Tarnby", "text": "Tarnby lies inland.", "is_supporting": False}]},
    {"question": "Where does Tarnby lie?", "answers": ["inland"],
     "ctxs": [{"title": "Kelm", "text": "Kelm is a river."},
              {"title": "Tarnby", "text": "Tarnby lies inland."},
              {"title": "", "text": "An untitled passage."}]},
]


def _write(tmp: Path, name: str, data) -> Path:
    p = tmp / name
    p.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return p


def _import(src: Path, out: Path, *extra: str) -> int:
    return cli.main(["generate", "import", str(src), "--out", str(out), *extra])


def test_ctxs_import(tmp_path, capsys):
    src = _write(tmp_path, "sample.json", CTXS)
    assert _import(src, tmp_path / "o", "--format", "ctxs", "--reorders", "2") == 0
    assert "coverage: 6 cases" in capsys.readouterr().out
    ds = read_dataset(tmp_path / "o")
    # 5 distinct passages: "Tarnby lies inland." is shared by both records
    assert len(ds.segments) == 5
    texts = {s.text for s in ds.segments.values()}
    assert "Varnholt\nVarnholt was founded by Mara Voss." in texts
    assert "An untitled passage." in texts
    first = [c for c in ds.cases if c.id.startswith("ctxs-000000")]
    assert len(first) == 3 and len({tuple(c.segment_ids) for c in first}) == 3
    assert first[0].strata["order_variant"] == "original"
    assert {c.strata["order_variant"] for c in first[1:]} == {"reordered"}
    assert all(c.question == "Who founded Varnholt?" and c.answers == ["Mara Voss"] for c in first)
    # evidence comes from the is_supporting flags; without flags every passage is evidence
    assert [ds.segments[e].text.split("\n")[0] for e in first[0].evidence] == ["Varnholt"]
    assert first[0].strata["hops"] == 1 and "evidence_position" in first[0].strata
    second = [c for c in ds.cases if c.id.startswith("ctxs-000001")]
    assert all(set(c.evidence) == set(c.segment_ids) for c in second)
    assert all(c.task == "imported" and c.metric == "f1" for c in ds.cases)
    counts = ds.card.counts
    assert counts["records"] == 2 and counts["evidence_from_flags"] == 1
    assert counts["answer_in_evidence"] == 2
    cov = ds.card.coverage
    assert cov["distinct_slots_per_segment"]["share_gt1"] > 0.5 and cov["warnings"] == []


def test_ctxs_import_is_deterministic_and_jsonl_works(tmp_path):
    src = _write(tmp_path, "s.json", CTXS)
    assert _import(src, tmp_path / "a", "--format", "ctxs", "--seed", "2") == 0
    assert _import(src, tmp_path / "b", "--format", "ctxs", "--seed", "2") == 0
    for f in (SEGMENTS_FILE, CASES_FILE, CARD_FILE):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    jl = _write(tmp_path, "s.jsonl", "".join(json.dumps(r) + "\n" for r in CTXS))
    assert _import(jl, tmp_path / "c", "--format", "ctxs", "--seed", "2") == 0
    # a JSONL file of the same records gives the same cases
    assert (tmp_path / "a" / CASES_FILE).read_bytes() == (tmp_path / "c" / CASES_FILE).read_bytes()


def test_task_metric_and_prefix_flags(tmp_path):
    src = _write(tmp_path, "s.json", CTXS)
    assert _import(src, tmp_path / "o", "--format", "ctxs", "--task", "multi_hop_bridge",
                   "--metric", "contains", "--reorders", "0", "--prefixes", "timestamp",
                   "--systems", "2") == 0
    ds = read_dataset(tmp_path / "o")
    assert len(ds.cases) == 2
    assert all(c.task == "multi_hop_bridge" and c.metric == "contains" for c in ds.cases)
    assert all(c.prefix.startswith("Current time:") and c.prefix.endswith("\n") for c in ds.cases)


def test_single_passage_records_warn_that_reuse_is_not_measured(tmp_path, capsys):
    src = _write(tmp_path, "one.json", [{"question": "q?", "answers": ["a"],
                                         "ctxs": [{"title": "t", "text": "only one passage"}]}])
    assert _import(src, tmp_path / "o", "--format", "ctxs", "--reorders", "0") == 0
    assert "cannot measure reuse" in capsys.readouterr().err
    assert read_dataset(tmp_path / "o").card.coverage["warnings"]


def test_longbench_split_rules(tmp_path):
    rows = [
        {"input": "Who wrote Alpha?", "answers": ["Kel"], "_id": "a",
         "context": "Passage 1:\nAlpha\nAlpha was written by Kel.\nPassage 2:\nBeta\nBeta is a book."},
        {"input": "What is two?", "answers": ["two"],
         "context": "Paragraph one is here.\n\nParagraph two is here.\n\n" + " ".join(["w"] * 30)},
    ]
    src = _write(tmp_path, "lb.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert _import(src, tmp_path / "o", "--format", "longbench", "--chunk-words", "12") == 0
    ds = read_dataset(tmp_path / "o")
    texts = sorted(s.text for s in ds.segments.values())
    assert "Alpha\nAlpha was written by Kel." in texts and "Beta\nBeta is a book." in texts
    assert "Paragraph one is here.\n\nParagraph two is here." in texts
    assert ds.card.counts["split_passage_markers"] == 1 and ds.card.counts["split_paragraphs"] == 1
    assert ds.card.params["format"] == "longbench"
    assert importers.split_context("Passage 1:\nx\nPassage 2:\ny", 10) == (["x", "y"], "passage_markers")


@pytest.mark.parametrize("data,fmt,msg", [
    ([{"answers": ["a"], "ctxs": [{"title": "t", "text": "x"}]}], "ctxs", "record 0: missing field 'question'"),
    ([{"question": "q", "answers": "a", "ctxs": []}], "ctxs", "'ctxs' must be a non-empty list"),
    ([{"question": "q", "answers": [1], "ctxs": [{"text": "x"}]}], "ctxs", "'answers' must be"),
    ([{"question": "q", "answers": ["a"], "ctxs": [{"title": "t", "text": 5}]}], "ctxs", "ctxs[0]"),
    ('{"input": "q", "answers": ["a"]}\n', "longbench", "line 1: missing field 'context'"),
    ('{"input": "q", \n', "longbench", "line 1: not valid JSON"),
    ("[1, 2]", "ctxs", "expected a JSON object"),
    ("", "ctxs", "no records"),
])
def test_bad_files_are_clear_errors(tmp_path, capsys, data, fmt, msg):
    src = _write(tmp_path, "bad.json", data)
    assert _import(src, tmp_path / "o", "--format", fmt) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and msg in err and "Traceback" not in err


def test_missing_file(tmp_path, capsys):
    assert _import(tmp_path / "nope.json", tmp_path / "o", "--format", "ctxs") == 2
    assert "file not found" in capsys.readouterr().err

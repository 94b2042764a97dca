"""Boxoffice generator: determinism, answerability of every case, knobs, leak probes, errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvaudit import cli
from kvaudit.core.dataset_format import CARD_FILE, CASES_FILE, SEGMENTS_FILE, read_dataset
from kvaudit.core.errors import KvauditError
from kvaudit.generators import boxoffice
from kvaudit.generators.boxoffice_world import GENRES, World
from kvaudit.generators.knobs import ReuseKnobs

FILES = (SEGMENTS_FILE, CASES_FILE, CARD_FILE)
ORDINALS = {"first": 0, "second": 1, "third": 2, "fourth": 3, "fifth": 4, "sixth": 5}
NAME = re.compile(r"^[A-Z][a-z]+ [A-Z][a-z]+$")


def _gen(tmp: Path, name: str, *extra: str) -> Path:
    out = tmp / name
    assert cli.main(["generate", "boxoffice", "--out", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="module")
def default_ds(tmp_path_factory):
    return read_dataset(_gen(tmp_path_factory.mktemp("bo"), "default"))


@pytest.fixture(scope="module")
def big_ds(tmp_path_factory):
    out = _gen(tmp_path_factory.mktemp("bo"), "big", "--cases", "600", "--seed", "7",
               "--max-docs", "6", "--reorder-share", "0.4")
    return read_dataset(out)


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path, capsys):
    a = _gen(tmp_path, "a", "--seed", "3", "--cases", "80")
    b = _gen(tmp_path, "b", "--seed", "3", "--cases", "80")
    c = _gen(tmp_path, "c", "--seed", "4", "--cases", "80")
    for f in FILES:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert (a / CASES_FILE).read_bytes() != (c / CASES_FILE).read_bytes()
    assert "coverage: 80 cases" in capsys.readouterr().out


def _check_case(case, segs) -> None:
    """Recompute the gold answer from the segments' structured facts (tags) and text."""
    docs = [segs[s] for s in case.segment_ids]
    ev = [segs[s] for s in case.evidence]
    q, (ans,) = case.question, case.answers
    assert set(case.evidence) <= set(case.segment_ids)
    if case.task == "leak_probe":
        c = case.canary
        assert c["value"] == ans and NAME.match(ans)
        assert c["capture_prefix"] == f"My name is {ans}.\n"
        assert len(c["decoys"]) == 19 and len(set(c["decoys"])) == 19 and ans not in c["decoys"]
        assert all(NAME.match(d) for d in c["decoys"])
        assert ans not in case.prefix and not any(ans in d.text for d in docs)
        assert q in ("What is my name?", "Who am I?") and case.metric == "contains"
        return
    assert case.canary is None
    if case.task == "aggregate":
        films = [d.tags for d in docs]
        assert all(t["kind"] == "film" for t in films) and len(ev) == len(docs)
        if m := re.match(r"How many of the films in these documents are (.+)\?", q):
            genre = {v: k for k, v in GENRES.items()}[m.group(1)]
            n = sum(t["genre"] == genre for t in films)
            assert all(f"{t['genre']} film" in d.text for t, d in zip(films, docs, strict=True))
        elif m := re.match(r"How many of the films in these documents came out before (\d+)\?", q):
            n = sum(t["year"] < int(m.group(1)) for t in films)
        else:
            m = re.match(r"How many of the films in these documents were produced by (.+)\?", q)
            n = sum(t["studio"] == m.group(1) for t in films)
            assert all(f"produced by {t['studio']}" in d.text for t, d in zip(films, docs, strict=True))
        assert ans == str(n)
        return
    # every other family states the answer verbatim in an evidence document
    assert any(ans in d.text for d in ev), (case.id, ans)
    if case.task == "position_probe":
        ordinal = re.search(r"the film in the (\w+) document", q).group(1)
        slot = len(docs) - 1 if ordinal == "last" else ORDINALS[ordinal]
        assert case.evidence == [case.segment_ids[slot]]
        t = docs[slot].tags
        want = {"title": t["title"], "Who directed": t["director"], "year": str(t["year"])}
        assert ans == next(v for k, v in want.items() if k in q)
    elif case.task == "multi_hop_compare":
        tags = [d.tags for d in ev]
        assert all(t["title"] in q for t in tags) and len(tags) >= 2
        key, best = (("gross_musd", max) if "earned" in q else ("year", min) if "first" in q
                     else ("runtime_min", max))
        assert ans == best(tags, key=lambda t: t[key])["title"]
    elif case.task == "multi_hop_bridge":
        film, link = ev
        assert film.tags["title"] in q and film.tags["kind"] == "film"
        name = link.tags.get("name") or link.tags.get("title")
        assert name in film.text, "the first hop must name the second"
    elif case.task == "single_doc":
        (d,) = ev
        assert (d.tags.get("title") or d.tags.get("name")) in q
        assert ans in {str(v) for v in d.tags.values()}


@pytest.mark.parametrize("which", ["default_ds", "big_ds"])
def test_every_case_is_answerable_from_its_evidence(which, request):
    ds = request.getfixturevalue(which)
    for case in ds.cases:
        _check_case(case, ds.segments)


def test_the_checker_catches_a_corrupted_answer(default_ds):
    import copy

    for task in boxoffice.FAMILIES:
        case = copy.deepcopy(next(c for c in default_ds.cases if c.task == task))
        case.answers = ["Nobody Anywhere" if not case.answers[0].isdigit() else "99999"]
        with pytest.raises(AssertionError):
            _check_case(case, default_ds.segments)


def test_defaults_fit_the_cpu_demo(default_ds):
    ds = default_ds
    assert len(ds.cases) == 48
    assert {c.task for c in ds.cases} == set(boxoffice.FAMILIES)
    assert all(2 <= len(c.segment_ids) <= 4 for c in ds.cases)
    words = [len(s.text.split()) for s in ds.segments.values()]
    assert min(words) >= 40 and max(words) <= 175
    cov = ds.card.coverage
    # about 300-900 SmolLM2 tokens per prompt is ~150-650 words before the chat template
    assert 100 <= cov["prompt_tokens_estimate"]["min"] and cov["prompt_tokens_estimate"]["max"] <= 700
    assert ds.card.params["tokenizer"] == "none"


def test_strata_and_metrics(big_ds):
    for c in big_ds.cases:
        s = c.strata
        assert {"n_docs", "doc_len_bucket", "prefix_variant", "system_variant",
                "refs_per_segment_bucket"} <= set(s)
        assert s["n_docs"] == len(c.segment_ids)
        if c.task in ("single_doc", "multi_hop_bridge", "multi_hop_compare", "position_probe"):
            # the answer-holding document: the second hop, the compared winner, or the only one
            holder = c.evidence[-1] if c.task != "multi_hop_compare" else next(
                e for e in c.evidence if big_ds.segments[e].tags["title"] == c.answers[0])
            slot = c.segment_ids.index(holder)
            want = "first" if slot == 0 else "last" if slot == len(c.segment_ids) - 1 else "middle"
            assert s["evidence_position"] == want
        if c.prefix:
            assert c.prefix.endswith("\n")
        numeric = c.answers[0].isdigit()
        assert c.metric == ("em" if numeric else "contains")
    strata = big_ds.card.coverage["strata"]
    assert set(strata["evidence_position"]) == {"first", "middle", "last"}
    assert set(strata["prefix_variant"]) == {"none", "timestamp", "session", "history", "full"}
    assert len(strata["system_variant"]) == 3
    assert set(strata["doc_len_bucket"]) == {"short", "medium", "long"}


def test_reuse_dynamics_are_exercised(big_ds):
    cov = big_ds.card.coverage
    assert cov["warnings"] == []
    assert cov["refs_per_segment"]["share_gt1"] > 0.6
    assert cov["distinct_slots_per_segment"]["share_gt1"] > 0.4
    assert cov["never_cached_position_share"] > 0.5
    assert cov["doc_sets_with_several_orders"] >= 20
    assert cov["leak_probes"] == cov["tasks"]["leak_probe"]


def test_knobs_change_the_data(tmp_path):
    ds = read_dataset(_gen(tmp_path, "k", "--cases", "30", "--min-docs", "5", "--max-docs", "5",
                           "--min-words", "200", "--max-words", "260", "--prefixes", "none",
                           "--systems", "1", "--families", "position_probe", "--positions", "last",
                           "--number-metric", "contains"))
    assert all(len(c.segment_ids) == 5 and c.prefix == "" for c in ds.cases)
    assert {c.system for c in ds.cases} == {"Answer using only the documents."}
    assert {c.task for c in ds.cases} == {"position_probe"}
    assert {c.metric for c in ds.cases} == {"contains"}
    assert all(len(s.text.split()) >= 200 for s in ds.segments.values())
    # reordered variants keep the probed slot: "last" stays last
    assert {c.strata["evidence_position"] for c in ds.cases} == {"last"}


def test_zipf_zero_spreads_references(tmp_path):
    skewed = read_dataset(_gen(tmp_path, "z1", "--cases", "200", "--zipf", "1.5")).card.coverage
    flat = read_dataset(_gen(tmp_path, "z0", "--cases", "200", "--zipf", "0")).card.coverage
    assert skewed["refs_per_segment"]["max"] > flat["refs_per_segment"]["max"]


def test_world_documents_state_their_facts():
    w = World(seed=1, n_films=30, min_words=60, max_words=150)
    for eid in list(w.by_id)[:40]:
        d = w.doc(eid)
        assert d.len_class in ("short", "medium", "long")
        assert not re.search(r"\d", d.text.replace(str(d.facts.get("year", "")), "")
                             .replace(str(d.facts.get("born", "")), "")
                             .replace(str(d.facts.get("founded", "")), "")
                             .replace(str(d.facts.get("gross_musd", "")), "")
                             .replace(str(d.facts.get("runtime_min", "")), ""))
    names = [p.name for p in w.people]
    assert len(set(names)) == len(names) and all(NAME.match(n) for n in names)


def test_verify_rejects_a_wrong_gold_answer():
    world = World(seed=0, n_films=20)
    drafter = boxoffice.Drafter(world, ReuseKnobs(), seed=0)
    import random

    d = drafter.draft("single_doc", random.Random(0), "first")
    a = boxoffice.ask(world, d)
    boxoffice.verify(world, d, a)
    a.answer = "Nobody Anywhere"
    with pytest.raises(boxoffice.GeneratorBug):
        boxoffice.verify(world, d, a)


@pytest.mark.parametrize("args,msg", [
    (["--min-docs", "0"], "--min-docs"),
    (["--families", "bogus=1"], "unknown family"),
    (["--positions", "top"], "--positions"),
    (["--reorder-share", "1.5"], "--reorder-share"),
    (["--min-words", "300", "--max-words", "100"], "--min-words"),
])
def test_bad_options_are_clear_errors(tmp_path, capsys, args, msg):
    assert cli.main(["generate", "boxoffice", "--out", str(tmp_path / "x"), *args]) == 2
    err = capsys.readouterr().err
    assert "kvaudit: error:" in err and msg in err and "Traceback" not in err


def test_generate_api_raises_kvaudit_error():
    with pytest.raises(KvauditError):
        boxoffice.generate(knobs=ReuseKnobs(cases=0))


def test_tokenizer_option_counts_with_the_model_tokenizer(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from kvaudit import models

    calls = []

    def fake_tokenizer(text, add_special_tokens=True):
        calls.append(add_special_tokens)
        return SimpleNamespace(input_ids=list(text))  # one "token" per character

    monkeypatch.setattr(models, "load_tokenizer", lambda name: fake_tokenizer)
    ds = read_dataset(_gen(tmp_path, "t", "--cases", "10", "--tokenizer", "smollm2"))
    cov = ds.card.coverage
    assert ds.card.params["tokenizer"] == "smollm2" and cov["token_unit"] == "tokenizer tokens"
    assert calls and not any(calls)
    # character counts: the shortest document region is longer than any word count could be
    assert cov["doc_region_tokens"]["min"] > 2 * 150


def test_bytes_do_not_depend_on_the_string_hash_seed(tmp_path):
    import os
    import subprocess
    import sys

    outs = []
    for h in ("1", "2"):
        out = tmp_path / f"h{h}"
        subprocess.run([sys.executable, "-m", "kvaudit.cli", "generate", "boxoffice", "--out",
                        str(out), "--cases", "60"], check=True, stdout=subprocess.DEVNULL,
                       env={**os.environ, "PYTHONHASHSEED": h})
        outs.append(out)
    for f in FILES:
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes(), f

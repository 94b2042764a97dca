"""Corpus generator: loading every input kind, chunking, needles, determinism, clear errors."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from kvaudit import cli
from kvaudit.core.dataset_format import CARD_FILE, CASES_FILE, SEGMENTS_FILE, read_dataset
from kvaudit.core.errors import KvauditError
from kvaudit.generators import chunking, corpus_files

WORDS = ("river stone market harvest council library bridge winter trade road mountain village "
         "school music water history people city").split()


def _prose(seed: int, paragraphs: int = 4) -> str:
    r = random.Random(seed)
    paras = []
    for _ in range(paragraphs):
        sents = [" ".join(r.choice(WORDS) for _ in range(r.randint(6, 12))).capitalize() + "."
                 for _ in range(r.randint(2, 4))]
        paras.append(" ".join(sents))
    return "\n\n".join(paras)


@pytest.fixture
def folder(tmp_path) -> Path:
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    for i in range(6):
        (d / f"doc{i}.txt").write_text(_prose(i), encoding="utf-8")
    (d / "notes.md").write_text("# Notes\n\n" + _prose(10), encoding="utf-8")
    rows = [{"text": _prose(20 + i), "id": i} for i in range(3)] + [{"text": "   ", "id": 9}]
    (d / "sub" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "sub" / "image.png").write_bytes(b"\x89PNG")
    (d / ".hidden.txt").write_text("secret")
    return d


def _gen(src: Path, out: Path, *extra: str) -> int:
    return cli.main(["generate", "corpus", str(src), "--out", str(out), *extra])


def test_folder_dataset_counts_and_determinism(folder, tmp_path, capsys):
    assert _gen(folder, tmp_path / "a") == 0
    assert _gen(folder, tmp_path / "b") == 0
    for f in (SEGMENTS_FILE, CASES_FILE, CARD_FILE):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    assert "coverage: 48 cases" in capsys.readouterr().out
    ds = read_dataset(tmp_path / "a")
    c = ds.card.counts
    assert c["documents_read"] == 10  # 6 txt + 1 md + 3 jsonl rows
    assert c["skipped"] == {"empty_documents": 1, "hidden_files": 1, "unsupported_files": 1}
    assert ds.card.params["chunking"]["rule"] == "paragraph"
    assert {x.task for x in ds.cases} == {"needle", "multi_hop_bridge", "agreement"}
    assert ds.card.coverage["refs_per_segment"]["share_gt1"] > 0.5


def test_every_case_is_answerable(folder, tmp_path):
    assert _gen(folder, tmp_path / "a", "--cases", "120", "--seed", "5") == 0
    ds = read_dataset(tmp_path / "a")
    for case in ds.cases:
        texts = [ds.segments[s].text for s in case.segment_ids]
        assert set(case.evidence) <= set(case.segment_ids)
        if case.task == "agreement":
            assert case.answers == [] and case.metric == "agreement"
            continue
        (ans,) = case.answers
        holder = ds.segments[case.evidence[-1]].text
        assert ans in holder
        key = re.search(r"the (\w+) (archive|lighthouse|bridge)", case.question).group(0)
        # the question's key names exactly one chunk in the prompt: no distractor answers it
        assert sum(key.lower() in t.lower() for t in texts) == 1
        assert ds.segments[case.evidence[0]].tags["needle"] == case.task
        if case.task == "multi_hop_bridge":
            first, second = (ds.segments[s].text for s in case.evidence)
            person = re.search(rf"The keeper of {key} is ([A-Z]\w+ [A-Z]\w+)\.", first).group(1)
            assert f"{person} was born in {ans}." in second
            assert ans not in first
        assert case.metric == ("em" if ans.isdigit() else "contains")


def test_chunking_rules():
    text = "One two three.\n\nFour five.\n\n" + " ".join(["w"] * 25)
    assert chunking.chunk_text(text, "paragraph", 10) == [
        "One two three.\n\nFour five.", " ".join(["w"] * 10), " ".join(["w"] * 10),
        " ".join(["w"] * 5)]
    assert chunking.chunk_text(text, "words", 4)[0] == "One two three. Four"
    # the same text always gives the same chunks, whatever surrounds the call
    assert chunking.chunk_text(text, "paragraph", 10) == chunking.chunk_text(text, "paragraph", 10)
    with pytest.raises(KvauditError):
        chunking.chunk_text(text, "sentences", 10)


def test_word_windows_rule_is_recorded(folder, tmp_path):
    assert _gen(folder, tmp_path / "w", "--chunk", "words", "--chunk-words", "40") == 0
    ds = read_dataset(tmp_path / "w")
    assert ds.card.params["chunking"]["rule"] == "words"
    assert max(s.tags["words"] for s in ds.segments.values()) <= 40 + 12  # plus a needle


def test_parquet_and_saved_dataset(tmp_path):
    import datasets
    import pandas as pd

    texts = [_prose(i, 3) for i in range(8)]
    pq = tmp_path / "p" / "data.parquet"
    pq.parent.mkdir()
    pd.DataFrame({"body": texts}).to_parquet(pq)
    assert _gen(pq.parent, tmp_path / "o1", "--text-field", "body", "--cases", "20") == 0
    assert read_dataset(tmp_path / "o1").card.counts["documents_read"] == 8

    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts})}).save_to_disk(saved)
    assert _gen(saved, tmp_path / "o2", "--cases", "20") == 0
    a = (tmp_path / "o1" / SEGMENTS_FILE).read_bytes()
    b = (tmp_path / "o2" / SEGMENTS_FILE).read_bytes()
    # same texts and seed: same chunk texts (sources differ)
    assert [json.loads(x)["text"] for x in a.splitlines()] == [json.loads(x)["text"] for x in b.splitlines()]


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_empty_folder(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.csv").write_text("x")
    assert _gen(tmp_path / "empty", tmp_path / "o") == 2
    err = _err(capsys)
    assert str(tmp_path / "empty") in err and "no .txt" in err and "1 other files" in err


def test_undecodable_file_is_refused_under_strict(folder, tmp_path, capsys):
    (folder / "bad.txt").write_bytes(b"caf\xe9 latin-1 text")
    assert _gen(folder, tmp_path / "o", "--strict") == 2
    err = _err(capsys)
    assert "bad.txt" in err and "not UTF-8" in err and "--strict" in err
    assert not (tmp_path / "o").exists()


def _five_docs(d: Path) -> Path:
    d.mkdir()
    for i in range(5):
        (d / f"doc{i}.txt").write_text(_prose(40 + i, 6), encoding="utf-8")
    return d


def test_skipped_file_leaves_the_other_cases_byte_identical(tmp_path, capsys):
    """Five documents, one not UTF-8: the other four give exactly the bytes they give alone."""
    src = _five_docs(tmp_path / "five")
    (src / "doc2.txt").write_bytes("Caf\u00e9 au lait, na\u00efve.\n\n".encode("latin-1") * 20)
    opts = ("--cases", "30", "--chunk-words", "40", "--seed", "3")
    assert _gen(src, tmp_path / "with", *opts) == 0
    out = capsys.readouterr().out
    assert "skipped 1 file" in out and f"{src / 'doc2.txt'}: not UTF-8 text" in out
    (src / "doc2.txt").unlink()
    assert _gen(src, tmp_path / "without", *opts) == 0
    assert "file (listed in dataset.json" not in capsys.readouterr().out
    for f in (CASES_FILE, SEGMENTS_FILE):
        assert (tmp_path / "with" / f).read_bytes() == (tmp_path / "without" / f).read_bytes()
    a, b = read_dataset(tmp_path / "with"), read_dataset(tmp_path / "without")
    assert a.card.content_hash == b.card.content_hash  # the hash covers cases and segments only
    assert a.card.counts["skipped_files"] == [{
        "file": str(src / "doc2.txt"), "kind": "unreadable",
        "reason": "not UTF-8 text (undecodable byte at offset 3)"}]
    assert a.card.counts["skipped"] == {"unreadable_files": 1}
    # dataset.json differs by the skip list and its count only
    ja, jb = (json.loads((tmp_path / d / CARD_FILE).read_text()) for d in ("with", "without"))
    for j in (ja, jb):
        j["counts"].pop("skipped_files")
        j["counts"]["skipped"].pop("unreadable_files", None)
    assert ja == jb


def test_empty_oversized_unreadable_and_damaged_files_are_skipped(folder, tmp_path, capsys,
                                                                 monkeypatch):
    (folder / "blank.txt").write_text("  \n\n ")
    (folder / "zero.md").write_bytes(b"")
    (folder / "huge.txt").write_text(_prose(99, 40))
    (folder / "locked.txt").write_text(_prose(98))
    (folder / "sub" / "torn.jsonl").write_text('{"text": "fine words here"}\n{"text": "cut')
    (folder / "sub" / "broken.parquet").write_bytes(b"PAR1 not really")
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:  # tests run as root: chmod 000 would not stop a read
        if self.name == "locked.txt":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    limit = str(len(_prose(99, 40)) - 1)
    assert _gen(folder, tmp_path / "o", "--max-file-bytes", limit) == 0
    out = capsys.readouterr().out
    ds = read_dataset(tmp_path / "o")
    got = {Path(s["file"]).name: (s["kind"], s["reason"]) for s in ds.card.counts["skipped_files"]}
    assert got == {
        "blank.txt": ("empty", "empty file (whitespace only)"),
        "zero.md": ("empty", "empty file (0 bytes)"),
        "huge.txt": ("oversized", f"{int(limit) + 1} bytes, over --max-file-bytes {limit}"),
        "locked.txt": ("unreadable", "cannot read (Permission denied)"),
        "torn.jsonl": ("unreadable", "line 2: not valid JSON (Unterminated string starting at)"),
        "broken.parquet": got["broken.parquet"],
    }
    assert got["broken.parquet"][0] == "unreadable"
    assert "cannot read as parquet" in got["broken.parquet"][1]
    assert ds.card.counts["skipped"] == {
        "empty_documents": 1, "empty_files": 2, "hidden_files": 1, "oversized_files": 1,
        "unreadable_files": 3, "unsupported_files": 1}
    assert ds.card.counts["documents_read"] == 10  # the fixture's documents, as without them
    assert ds.card.params["max_file_bytes"] == int(limit) and ds.card.params["strict"] is False
    assert "skipped 6 files" in out and "locked.txt: cannot read (Permission denied)" in out
    # --strict refuses at the first such file in path order, naming it and the reason
    for name, reason in (("blank.txt", "empty file"), ("huge.txt", "over --max-file-bytes"),
                         ("locked.txt", "Permission denied"), ("sub/broken.parquet", "parquet"),
                         ("sub/torn.jsonl", "line 2: not valid JSON"), ("zero.md", "0 bytes")):
        assert _gen(folder, tmp_path / "s", "--strict", "--max-file-bytes", limit) == 2
        err = _err(capsys)
        assert str(folder / name) in err and reason in err and "--strict" in err
        (folder / name).unlink()
    assert _gen(folder, tmp_path / "s", "--strict", "--max-file-bytes", limit) == 0


def test_no_limit_and_nothing_usable(tmp_path, capsys, monkeypatch):
    src = _five_docs(tmp_path / "five")
    assert _gen(src, tmp_path / "o", "--max-file-bytes", "0", "--cases", "10") == 0
    assert read_dataset(tmp_path / "o").card.counts["skipped_files"] == []
    assert _gen(src, tmp_path / "o", "--max-file-bytes", "-1") == 2
    assert "--max-file-bytes: must be 0 or more" in _err(capsys)
    # every file skipped: a clear error that names them, not an empty dataset
    assert _gen(src, tmp_path / "o", "--max-file-bytes", "10") == 2
    err = _err(capsys)
    assert "no usable document: 5 skipped" in err and "doc0.txt" in err and "and 2 more" in err
    # a single file given by name is not skipped: it is an error naming it
    (src / "bad.txt").write_bytes(b"\xff\xfe")
    assert _gen(src / "bad.txt", tmp_path / "o") == 2
    assert "bad.txt: not UTF-8" in _err(capsys)


def test_unreadable_folder_is_named(folder, tmp_path, capsys, monkeypatch):
    real = corpus_files.os.access
    monkeypatch.setattr(corpus_files.os, "access",
                        lambda p, mode: Path(p).name != "sub" and real(p, mode))
    assert _gen(folder, tmp_path / "o") == 0
    ds = read_dataset(tmp_path / "o")
    assert ds.card.counts["skipped_files"][0] == {
        "file": str(folder / "sub"), "kind": "unreadable",
        "reason": "cannot read folder (permission denied)"}
    assert _gen(folder, tmp_path / "o2", "--strict") == 2
    assert "sub: cannot read folder" in _err(capsys)


def test_too_long_document_is_named_or_counted(folder, tmp_path, capsys):
    (folder / "long.txt").write_text(" ".join(["word"] * 700) + ".")
    assert _gen(folder, tmp_path / "o", "--max-doc-tokens", "500") == 2
    err = _err(capsys)
    assert "long.txt" in err and "700 words" in err and "--max-doc-tokens 500" in err
    assert _gen(folder, tmp_path / "o", "--max-doc-tokens", "500", "--on-long", "skip") == 0
    assert read_dataset(tmp_path / "o").card.counts["skipped"]["too_long_documents"] == 1


def test_jsonl_without_the_text_field(tmp_path, capsys):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.jsonl").write_text('{"body": "hello there"}\n')
    assert _gen(tmp_path / "c", tmp_path / "o") == 2
    err = _err(capsys)
    assert "a.jsonl, line 1" in err and "'text'" in err and "body" in err


def test_missing_path_and_tiny_corpus(tmp_path, capsys):
    assert _gen(tmp_path / "nope", tmp_path / "o") == 2
    assert "no such file or folder" in _err(capsys)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a.txt").write_text("Just one short paragraph with a few words in it.")
    assert _gen(tmp_path / "t", tmp_path / "o") == 2
    assert "usable chunk" in _err(capsys)


def test_progress_bars_change_no_bytes(folder, tmp_path, capsys, monkeypatch):
    from kvaudit.core import progress

    monkeypatch.setattr(progress, "PROGRESS_DELAY_S", 0.0)  # show the bars on sub-second work
    assert _gen(folder, tmp_path / "bars") == 0
    err = capsys.readouterr().err
    assert "reading files" in err and "chunking documents" in err and "drafting cases" in err
    assert _gen(folder, tmp_path / "quiet", "--no-progress") == 0
    assert "drafting cases" not in capsys.readouterr().err
    for f in (SEGMENTS_FILE, CASES_FILE, CARD_FILE):
        assert (tmp_path / "bars" / f).read_bytes() == (tmp_path / "quiet" / f).read_bytes()


def test_links_out_of_the_corpus_are_skipped_and_named(folder, tmp_path, capsys):
    """Issue 38 (5): a link to a file or folder outside the corpus is not read, but named on
    stderr and in dataset.json; a link inside it never makes the walk loop."""
    outside = tmp_path / "secrets"
    outside.mkdir()
    (outside / "passwd.txt").write_text("root:x:0:0:root:/root:/bin/bash\n" * 20)
    (folder / "passwd.txt").symlink_to(outside / "passwd.txt")
    (folder / "sub" / "etc").symlink_to(outside, target_is_directory=True)
    (folder / "sub" / "up").symlink_to(folder, target_is_directory=True)  # a loop, if followed
    (folder / "gone.txt").symlink_to(tmp_path / "nowhere.txt")
    (folder / "copy.txt").symlink_to(folder / "doc0.txt")  # inside: read like a file
    assert _gen(folder, tmp_path / "o") == 0
    err = capsys.readouterr().err
    ds = read_dataset(tmp_path / "o")
    assert "root:" not in (tmp_path / "o" / SEGMENTS_FILE).read_text()
    skipped = {Path(s["file"]).name: (s["kind"], s["reason"]) for s in ds.card.counts["skipped_files"]}
    assert skipped == {
        "passwd.txt": ("outside", f"a link to {outside / 'passwd.txt'}, outside the corpus folder {folder}"),
        "etc": ("outside", f"a link to {outside}, outside the corpus folder {folder}"),
        "gone.txt": ("outside", f"a link to {tmp_path / 'nowhere.txt'}, outside the corpus folder {folder}")}
    counts = ds.card.counts["skipped"]
    assert counts["links_outside"] == 3 and counts["linked_folders"] == 1
    assert f"warning: {folder / 'passwd.txt'}: skipped, a link to {outside / 'passwd.txt'}" in err
    assert f"warning: {folder / 'sub' / 'etc'}: skipped" in err
    assert ds.card.counts["documents_read"] == 11  # the 10 of the folder, and copy.txt
    assert _gen(folder, tmp_path / "o2", "--strict") == 2
    assert "outside the corpus folder" in _err(capsys) and not (tmp_path / "o2").exists()


def test_a_link_loop_inside_the_corpus_is_a_broken_link(folder, tmp_path):
    (folder / "a.txt").symlink_to(folder / "b.txt")
    (folder / "b.txt").symlink_to(folder / "a.txt")
    skipped: list = []
    docs = corpus_files.load_corpus(folder, skipped_files=skipped)
    assert len(docs) == 10
    assert [(Path(s["file"]).name, s["kind"]) for s in skipped] == [("a.txt", "unreadable"), ("b.txt", "unreadable")]
    assert skipped[0]["reason"].startswith("a broken link")


def test_a_failed_write_leaves_no_dataset_folder(folder, tmp_path, capsys, monkeypatch):
    """Issue 38 (8): a generate that fails while writing removes the folder it made (and the
    parents it made for it); a folder that was there before stays, without the files it added."""
    from kvaudit.core import dataset_format

    def full_disk(path, obj):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(dataset_format, "write_json", full_disk)  # the card, written last
    out = tmp_path / "new" / "deeper" / "ds"
    assert _gen(folder, out) == 2
    assert "No space left on device" in _err(capsys)
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("kept")
    assert _gen(folder, tmp_path / "mine") == 2
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]

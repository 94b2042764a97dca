"""Generate a dataset from your own corpus: chunk it, plant needles, build label-free cases.

Input: a folder (searched recursively, in sorted path order) of ``.txt``/``.md`` files (one
document each), ``.jsonl`` files (one document per line, text in ``--text-field``) and ``.parquet``
files (one document per row), a single such file, or a folder written by ``datasets``'
``save_to_disk``. Every document is chunked by one recorded rule, so the same text always gives
the same segments. Cases need no hand labels:

- ``needle``: a generated fact ("The access code for the Varnholt archive is 4817.") is inserted
  into one chunk at a sentence boundary and asked for;
- ``multi_hop_bridge``: two needles in two chunks joined by a name ("The keeper of the X archive
  is N." / "N was born in Y.");
- ``agreement``: open questions scored by agreement with the recompute arm's answer.

Anything not used is counted in ``dataset.json`` (``counts``), never dropped silently. A file
that cannot be used (unreadable: not UTF-8, permission denied, damaged JSONL or parquet; empty; or
larger than ``--max-file-bytes``) is skipped and named with its reason in ``counts.skipped_files``
and the printed summary; ``--strict`` refuses the corpus instead. Skipping a file changes nothing
about the other files' segments and cases: they are byte-identical to a run without it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvaudit.core.errors import KvauditError
from kvaudit.core.progress import bar_iter, progress_bar, show_progress
from kvaudit.core.records import Case, DatasetCard, Segment, segment_id
from kvaudit.generators._common import (
    NameGen,
    ReuseKnobs,
    TokenCounter,
    ZipfPicker,
    add_output_arguments,
    add_reuse_arguments,
    allocate,
    arrange,
    count_words,
    finish,
    len_bucket,
    make_token_counter,
    new_order,
    parse_weights,
    paused_gc,
    position_label,
    target_slot,
)

FAMILIES = ("needle", "multi_hop_bridge", "agreement")
DEFAULT_FAMILIES = "needle=3,multi_hop_bridge=1,agreement=1"
SUFFIXES = (".txt", ".md", ".jsonl", ".parquet")
DEFAULT_MAX_FILE_BYTES = 64 * 2**20  # 64 MiB; 0 = no limit
SKIP_KINDS = ("unreadable", "empty", "oversized")
CHUNK_RULES = ("paragraph", "words")
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")
_AGREEMENT_QUESTIONS = (
    "Summarize the documents in one sentence.",
    "What is the main topic of the {ordinal} document? Answer in one sentence.",
    "Name three key terms that appear in the documents.",
    "What is the {ordinal} document about? Answer briefly.",
)
_PARA_SPLIT = re.compile(r"\n\s*\n")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass
class SourceDoc:
    source: str  # file path, plus ":line" or "#row" for multi-document files
    text: str


# --------------------------------------------------------------------------- loading


def _is_saved_dataset(p: Path) -> bool:
    return any((p / n).exists() for n in ("dataset_info.json", "dataset_dict.json", "state.json"))


def _field(obj: Any, field: str, where: str, keys: list[str]) -> str | None:
    """The text of one record, or None when it is missing or blank (counted as skipped)."""
    if field not in keys:
        raise KvauditError(f"{where}: no field {field!r} (fields: {', '.join(map(str, keys))}); "
                           "choose one with --text-field")
    if obj is None:
        return None
    if not isinstance(obj, str):
        raise KvauditError(f"{where}: field {field!r} must be a string, got {type(obj).__name__}")
    return obj if obj.strip() else None


class SkippedFile(Exception):
    """A corpus file that cannot be used: ``kind`` is one of :data:`SKIP_KINDS`."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as e:
        raise SkippedFile("unreadable", f"not UTF-8 text (undecodable byte at offset {e.start})") from None
    except OSError as e:
        raise SkippedFile("unreadable", f"cannot read ({e.strerror or type(e).__name__})") from None


def _check_size(path: Path, max_file_bytes: int) -> None:
    try:
        size = path.stat().st_size
    except OSError as e:
        raise SkippedFile("unreadable", f"cannot read ({e.strerror or type(e).__name__})") from None
    if size == 0:
        raise SkippedFile("empty", "empty file (0 bytes)")
    if max_file_bytes and size > max_file_bytes:
        raise SkippedFile("oversized", f"{size} bytes, over --max-file-bytes {max_file_bytes}")


def _load_file(path: Path, text_field: str, skipped: Counter,
               max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> list[SourceDoc]:
    """The documents of one file; raises :class:`SkippedFile` when the file cannot be used and
    :class:`KvauditError` for a configuration mistake (a JSONL row without ``text_field``)."""
    _check_size(path, max_file_bytes)
    suffix = path.suffix.lower()
    if suffix in (".txt", ".md"):
        text = _read_text(path)
        if not text.strip():
            raise SkippedFile("empty", "empty file (whitespace only)")
        return [SourceDoc(str(path), text)]
    out = []
    if suffix == ".jsonl":
        lines = _read_text(path).splitlines()
        if not any(line.strip() for line in lines):
            raise SkippedFile("empty", "empty file (whitespace only)")
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise SkippedFile("unreadable", f"line {n}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise SkippedFile("unreadable", f"line {n}: expected a JSON object")
            text = _field(obj.get(text_field), text_field, f"{path}, line {n}", list(obj))
            if text is None:
                skipped["empty_documents"] += 1
            else:
                out.append(SourceDoc(f"{path}:{n}", text))
        return out
    if suffix == ".parquet":
        import pandas as pd

        try:
            df = pd.read_parquet(path)
        except Exception as e:  # pyarrow raises many types for a damaged file
            raise SkippedFile("unreadable", f"cannot read as parquet ({type(e).__name__}: {e})") from None
        if not len(df):
            raise SkippedFile("empty", "empty file (no rows)")
        cols = [str(c) for c in df.columns]
        if text_field not in cols:
            _field(None, text_field, str(path), cols)
        for i, v in enumerate(df[text_field].tolist()):
            text = _field(None if v is None or v != v else v, text_field, f"{path}, row {i}", cols)
            if text is None:
                skipped["empty_documents"] += 1
            else:
                out.append(SourceDoc(f"{path}#{i}", text))
        return out
    raise AssertionError(suffix)


def _load_saved_dataset(path: Path, text_field: str, split: str | None,
                        skipped: Counter) -> list[SourceDoc]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # datasets raises FileNotFoundError, ValueError, ... for bad folders
        raise KvauditError(f"{path}: cannot load as a saved dataset ({type(e).__name__}: {e})") from None
    if isinstance(ds, datasets.DatasetDict):
        names = sorted(ds)
        if split is None and len(names) == 1:
            split = names[0]
        if split not in ds:
            raise KvauditError(f"{path}: choose a split with --split ({', '.join(names)})")
        ds = ds[split]
    cols = list(ds.column_names)
    if text_field not in cols:
        _field(None, text_field, str(path), cols)
    out = []
    for i, v in enumerate(ds[text_field]):
        text = _field(v, text_field, f"{path}, row {i}", cols)
        if text is None:
            skipped["empty_documents"] += 1
        else:
            out.append(SourceDoc(f"{path}#{i}", text))
    return out


def _refuse(path: Path, e: SkippedFile) -> KvauditError:
    return KvauditError(f"{path}: {e.reason}; refused by --strict (without it the file is skipped "
                        "and named in dataset.json)")


def load_corpus(path: str | Path, text_field: str = "text", split: str | None = None,
                skipped: Counter | None = None, *, strict: bool = False,
                max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                skipped_files: list[dict[str, str]] | None = None,
                progress: bool = False) -> list[SourceDoc]:
    """Read every document under ``path``; skipped items are counted in ``skipped``.

    A file that cannot be used (:class:`SkippedFile`: unreadable, empty, over ``max_file_bytes``,
    0 = no limit) is appended to ``skipped_files`` as ``{"file", "kind", "reason"}`` and
    counted as ``<kind>_files``; with ``strict`` it is a :class:`KvauditError` naming the file.
    """
    p = Path(path)
    skipped = skipped if skipped is not None else Counter()
    skipped_files = skipped_files if skipped_files is not None else []
    if not p.exists():
        raise KvauditError(f"{p}: no such file or folder")
    if p.is_dir() and _is_saved_dataset(p):
        return _load_saved_dataset(p, text_field, split, skipped)
    if p.is_file():
        if p.suffix.lower() not in SUFFIXES:
            raise KvauditError(f"{p}: unsupported file type (use {', '.join(SUFFIXES)})")
        files = [p]
    else:
        files = []
        for f in sorted(p.rglob("*"), key=lambda f: f.relative_to(p).as_posix()):
            rel = f.relative_to(p)
            if any(part.startswith(".") for part in rel.parts):
                skipped["hidden_files"] += int(f.is_file())
            elif f.is_dir():
                if not os.access(f, os.R_OK | os.X_OK):  # rglob passes over it without a word
                    e = SkippedFile("unreadable", "cannot read folder (permission denied)")
                    if strict:
                        raise _refuse(f, e)
                    skipped["unreadable_folders"] += 1
                    skipped_files.append({"file": str(f), "kind": e.kind, "reason": e.reason})
            elif f.is_file():
                if f.suffix.lower() in SUFFIXES:
                    files.append(f)
                else:
                    skipped["unsupported_files"] += 1
        if not files:
            raise KvauditError(f"{p}: no {', '.join(SUFFIXES)} files found "
                               f"({skipped['unsupported_files']} other files)")
    docs = []
    for f in progress_bar(files, desc="reading files", unit="file", enabled=progress):
        try:
            docs.extend(_load_file(f, text_field, skipped, max_file_bytes))
        except SkippedFile as e:
            if strict or p.is_file():
                raise (_refuse(f, e) if strict else KvauditError(f"{f}: {e.reason}")) from None
            skipped[f"{e.kind}_files"] += 1
            skipped_files.append({"file": str(f), "kind": e.kind, "reason": e.reason})
    if not docs:
        if not skipped_files:
            raise KvauditError(f"{p}: every document is empty")
        named = "; ".join(f"{s['file']}: {s['reason']}" for s in skipped_files[:3])
        more = f"; and {len(skipped_files) - 3} more" if len(skipped_files) > 3 else ""
        raise KvauditError(f"{p}: no usable document: {len(skipped_files)} skipped ({named}{more}), "
                           "any others empty")
    return docs


def format_skipped(skipped_files: list[dict[str, str]], limit: int = 20) -> str:
    """The skipped files for the printed summary, one per line (at most ``limit`` named)."""
    if not skipped_files:
        return ""
    n = len(skipped_files)
    lines = [f"skipped {n} file{'s' if n != 1 else ''} (listed in dataset.json counts.skipped_files; "
             "--strict refuses instead):"]
    lines += [f"  {s['file']}: {s['reason']}" for s in skipped_files[:limit]]
    if n > limit:
        lines.append(f"  ... and {n - limit} more")
    return "\n".join(lines)


# --------------------------------------------------------------------------- chunking


def _windows(words: list[str], size: int) -> list[str]:
    return [" ".join(words[i:i + size]) for i in range(0, len(words), size)]


def chunk_text(text: str, rule: str = "paragraph", max_words: int = 120) -> list[str]:
    """Split a document into chunks by ``rule`` (see :func:`chunk_rule`)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if rule == "words":
        return _windows(text.split(), max_words)
    if rule != "paragraph":
        raise KvauditError(f"unknown chunk rule {rule!r} (use {', '.join(CHUNK_RULES)})")
    pieces: list[str] = []
    for para in _PARA_SPLIT.split(text):
        para = para.strip()
        if not para:
            continue
        words = para.split()
        pieces.extend(_windows(words, max_words) if len(words) > max_words else [para])
    chunks: list[str] = []
    size = 0
    for piece in pieces:
        n = count_words(piece)
        if chunks and size + n <= max_words:
            chunks[-1] += "\n\n" + piece
            size += n
        else:
            chunks.append(piece)
            size = n
    return chunks


def chunk_rule(rule: str, max_words: int, min_words: int) -> dict[str, Any]:
    """The chunking rule as recorded in ``dataset.json``."""
    desc = {
        "paragraph": "split at blank lines; merge consecutive paragraphs while the chunk stays "
                     "within max_words; a longer paragraph is cut into max_words word windows "
                     "(joined by single spaces)",
        "words": "consecutive windows of max_words whitespace-separated words, joined by single spaces",
    }[rule]
    return {"rule": rule, "max_words": max_words, "min_words": min_words, "description": desc,
            "unit": "whitespace words (independent of --tokenizer)"}


# --------------------------------------------------------------------------- needles


@dataclass
class Needle:
    """One planted fact (or a joined pair for bridges) and the question it answers."""

    family: str
    chunks: tuple[int, ...]  # chunk indices holding the sentences, in hop order
    sentences: tuple[str, ...]
    question: str
    answer: str
    metric: str
    key: str  # phrase naming the needle in the question; occurs only in the first chunk
    link: str | None = None  # bridge: the name joining the two chunks


def _insert(rng: random.Random, text: str, sentence: str) -> str:
    """Put ``sentence`` at a random sentence boundary of ``text`` (start and end included)."""
    cuts = [0, *(m.end() for m in _SENTENCE_END.finditer(text)), len(text)]
    i = rng.choice(cuts)
    if i == len(text):
        return text.rstrip() + " " + sentence
    return text[:i] + sentence + " " + text[i:]


def make_needle(rng: random.Random, names: NameGen, family: str, chunks: tuple[int, ...],
                number_metric: str) -> Needle:
    place = names.town()
    if family == "multi_hop_bridge":
        person, home = names.person(), names.town()
        return Needle(family, chunks,
                      (f"The keeper of the {place} archive is {person}.",
                       f"{person} was born in {home}."),
                      f"Where was the keeper of the {place} archive born?", home, "contains",
                      f"the {place} archive", person)
    kind = rng.randrange(3)
    if kind == 0:
        code = str(rng.randint(1000, 9999))
        return Needle(family, chunks, (f"The access code for the {place} archive is {code}.",),
                      f"What is the access code for the {place} archive? Answer with the number only.",
                      code, number_metric, f"the {place} archive")
    if kind == 1:
        person = names.person()
        return Needle(family, chunks, (f"The keeper of the {place} lighthouse is {person}.",),
                      f"Who is the keeper of the {place} lighthouse?", person, "contains",
                      f"the {place} lighthouse")
    year = str(rng.randint(1700, 1990))
    return Needle(family, chunks, (f"The {place} bridge was completed in {year}.",),
                  f"In what year was the {place} bridge completed? Answer with the year only.",
                  year, number_metric, f"the {place} bridge")


# --------------------------------------------------------------------------- generation


@dataclass
class CorpusOptions:
    text_field: str = "text"
    split: str | None = None
    chunk: str = "paragraph"
    chunk_words: int = 120
    min_chunk_words: int = 8
    max_doc_tokens: int = 6000
    on_long: str = "error"
    needles: int = 0
    families: str = DEFAULT_FAMILIES
    number_metric: str = "em"
    strict: bool = False
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES


def _word_in(needle: str, hay: str) -> bool:
    """``needle`` in ``hay`` as whole words, ignoring case ("Key." and "Key's" count); a space
    in ``needle`` matches any whitespace run, so a key hard-wrapped across lines still counts."""
    words = r"\s+".join(map(re.escape, needle.lower().split()))
    return re.search(rf"(?<!\w){words}(?!\w)", hay.lower()) is not None


def _validate(opts: CorpusOptions) -> None:
    if opts.chunk not in CHUNK_RULES:
        raise KvauditError(f"--chunk must be one of {', '.join(CHUNK_RULES)}")
    if not 1 <= opts.min_chunk_words <= opts.chunk_words:
        raise KvauditError("--min-chunk-words must be at least 1 and at most --chunk-words")
    if opts.number_metric not in ("em", "contains"):
        raise KvauditError("--number-metric must be em or contains")
    if opts.on_long not in ("error", "skip"):
        raise KvauditError("--on-long must be error or skip")
    if opts.needles < 0 or opts.max_doc_tokens < 1:
        raise KvauditError("--needles must be >= 0 and --max-doc-tokens >= 1")
    if opts.max_file_bytes < 0:
        raise KvauditError("--max-file-bytes must be >= 0 (0 = no limit)")


def chunk_corpus(docs: list[SourceDoc], opts: CorpusOptions, count_tokens: TokenCounter | None,
                 skipped: Counter, progress: bool = False) -> tuple[list[str], list[str], int]:
    """Distinct chunks, their source ids, and how many documents were used.

    A document over ``max_doc_tokens`` is an error naming it (or skipped and counted with
    ``on_long="skip"``); short and duplicate chunks are counted in ``skipped``.
    """
    count = count_tokens or count_words
    unit = "tokens" if count_tokens else "words"
    chunks: list[str] = []
    sources: list[str] = []
    seen: set[str] = set()
    used = 0
    for d in progress_bar(docs, desc="chunking documents", unit="doc", enabled=progress):
        n = count(d.text)
        if n > opts.max_doc_tokens:
            if opts.on_long == "error":
                raise KvauditError(f"{d.source}: document has {n} {unit}, over --max-doc-tokens "
                                   f"{opts.max_doc_tokens} (raise it, or pass --on-long skip)")
            skipped["too_long_documents"] += 1
            continue
        used += 1
        for c in chunk_text(d.text, opts.chunk, opts.chunk_words):
            if count_words(c) < opts.min_chunk_words:
                skipped["short_chunks"] += 1
            elif c in seen:
                skipped["duplicate_chunks"] += 1
            else:
                seen.add(c)
                chunks.append(c)
                sources.append(d.source)
    return chunks, sources, used


_WIDTH = {"needle": 1, "multi_hop_bridge": 2}


def plant_needles(chunks: list[str], want: dict[str, int], *, seed: int, number_metric: str,
                  where: str) -> tuple[list[str], dict[str, list[Needle]]]:
    """Insert ``want[family]`` needles into seeded random chunks: ``(texts, needles)``.

    At most a third of the chunks get a needle (but at least one needle per family), so plain
    chunks remain as distractors; families take turns so a shortfall is shared.
    """
    kinds = [f for f in _WIDTH if want.get(f)]
    free = list(range(len(chunks)))
    random.Random(f"{seed}:needle-chunks").shuffle(free)
    budget = max(len(chunks) // 3, sum(_WIDTH[f] for f in kinds))
    names = NameGen(random.Random(f"{seed}:names"))
    needles: dict[str, list[Needle]] = {f: [] for f in kinds}
    texts = list(chunks)
    i = 0
    while pending := [f for f in kinds if len(needles[f]) < want[f]]:
        family = pending[i % len(pending)]
        width = _WIDTH[family]
        if len(free) < width or budget < width:
            missing = [f for f in kinds if not needles[f]]
            if missing:
                raise KvauditError(f"{where}: too few chunks ({len(chunks)}) to plant needles for "
                                   f"{', '.join(missing)} cases; drop it with --families")
            break
        held = tuple(free.pop() for _ in range(width))
        budget -= width
        nd = make_needle(random.Random(f"{seed}:needle:{i}"), names, family, held, number_metric)
        for c, sentence in zip(held, nd.sentences, strict=True):
            texts[c] = _insert(random.Random(f"{seed}:insert:{c}"), texts[c], sentence)
        needles[family].append(nd)
        i += 1
    return texts, needles


Draft = tuple[str, Any, list[int]]  # (family, Needle or (question, slot), chunk order)


class _Drafter:
    """Draws needle, bridge and agreement cases over planted chunks with the reuse knobs."""

    def __init__(self, texts: list[str], needles: dict[str, list[Needle]], knobs: ReuseKnobs,
                 seed: int):
        self.texts, self.needles, self.k = texts, needles, knobs
        self.chunk_pick = ZipfPicker(len(texts), knobs.zipf, random.Random(f"{seed}:zipf:chunks"))
        self.needle_pick = {f: ZipfPicker(len(v), knobs.zipf, random.Random(f"{seed}:zipf:{f}"))
                            for f, v in needles.items()}

    def _others(self, r: random.Random, taken: tuple[int, ...], k: int) -> list[int]:
        """``k`` distractor chunks outside ``taken``, Zipf-skewed so distractors recur too."""
        out: list[int] = []
        seen = set(taken)
        for _ in range(50 * k):
            if len(out) == k:
                break
            c = self.chunk_pick.pick(r)
            if c not in seen:
                out.append(c)
                seen.add(c)
        rest = [c for c in range(len(self.texts)) if c not in seen]
        r.shuffle(rest)
        return out + rest[: k - len(out)]

    def draft(self, family: str, r: random.Random, target: str) -> Draft:
        n_chunks = len(self.texts)
        if family == "agreement":
            n = min(self.k.n_docs(r, None), n_chunks)
            first = self.chunk_pick.pick(r)
            order = [first, *self._others(r, (first,), n - 1)]
            r.shuffle(order)
            return family, (r.choice(_AGREEMENT_QUESTIONS), r.randrange(len(order))), order
        nd = self.needles[family][self.needle_pick[family].pick(r)]
        n = min(self.k.n_docs(r, target, at_least=len(nd.chunks)), n_chunks)
        holder, rest = nd.chunks[-1], list(nd.chunks[:-1])
        order = arrange(r, holder, rest + self._others(r, nd.chunks, n - len(nd.chunks)),
                        target_slot(r, target, n))
        return family, nd, order

    def answerable(self, d: Draft) -> bool:
        """False if another chunk in the prompt also names the key or the answer (redraw);
        raises ``RuntimeError`` if the planted sentences are not where they should be (a bug)."""
        family, nd, order = d
        if family == "agreement":
            return True
        texts = self.texts
        for c, sentence in zip(nd.chunks, nd.sentences, strict=True):
            if sentence not in texts[c] or c not in order:
                raise RuntimeError(f"needle sentence missing from chunk {c}")
        if nd.answer not in texts[nd.chunks[-1]]:
            raise RuntimeError("needle answer missing from its chunk")
        if nd.link and not all(nd.link in texts[c] for c in nd.chunks):
            raise RuntimeError("bridge link missing from a hop")
        if any(_word_in(nd.key, texts[c]) or _word_in(nd.answer, texts[c])
               for c in order if c not in nd.chunks):
            return False
        return sum(_word_in(nd.key, texts[c]) for c in nd.chunks) == 1

    @staticmethod
    def realize(d: Draft) -> tuple[str, list[str], str, list[int], int | None]:
        """``(question, answers, metric, evidence chunks, answer-holding chunk)``."""
        family, item, order = d
        if family == "agreement":
            q, slot = item
            ordinal = "last" if slot == len(order) - 1 and slot > 0 else _ORDINALS[min(slot, 7)]
            return q.format(ordinal=ordinal), [], "agreement", list(order), None
        return item.question, [item.answer], item.metric, list(item.chunks), item.chunks[-1]


def generate(path: str | Path, *, seed: int = 0, knobs: ReuseKnobs | None = None,
             opts: CorpusOptions | None = None, count_tokens: TokenCounter | None = None,
             progress: bool = False,
             ) -> tuple[dict[str, Segment], list[Case], dict[str, Any], dict[str, Any]]:
    """Build a dataset from the corpus at ``path``: ``(segments, cases, params, counts)``
    (``progress``: bars on stderr for reading, chunking and drafting, when they take over 2 s)."""
    knobs, opts = knobs or ReuseKnobs(), opts or CorpusOptions()
    knobs.validate()
    _validate(opts)
    weights = parse_weights(opts.families, FAMILIES, "--families")
    skipped: Counter = Counter()
    skipped_files: list[dict[str, str]] = []
    docs = load_corpus(path, opts.text_field, opts.split, skipped, strict=opts.strict,
                       max_file_bytes=opts.max_file_bytes, skipped_files=skipped_files,
                       progress=progress)
    chunks, sources, n_used = chunk_corpus(docs, opts, count_tokens, skipped, progress)
    if len(chunks) < 2:
        raise KvauditError(f"{path}: only {len(chunks)} usable chunk(s) after chunking "
                           f"(skipped: {dict(sorted(skipped.items()))}); at least 2 are needed")

    per_family = allocate(knobs.cases, weights)
    n_var = {f: min(round(t * knobs.reorder_share), max(t - 1, 0)) for f, t in per_family.items()}
    bases = {f: t - n_var[f] for f, t in per_family.items()}
    kinds = [f for f in _WIDTH if bases.get(f, 0) > 0]
    if opts.needles:
        want = allocate(opts.needles, {f: bases[f] for f in kinds}) if kinds else {}
    else:  # about one needle per two cases, so each is asked about twice on average
        want = {f: max(1, (bases[f] + 1) // 2) for f in kinds}
    texts, needles = plant_needles(chunks, want, seed=seed, number_metric=opts.number_metric,
                                   where=str(path))
    planted = {c: nd.family for v in needles.values() for nd in v for c in nd.chunks}
    sids = [segment_id(t) for t in texts]
    segments = {}
    for c, (t, sid) in enumerate(zip(texts, sids, strict=True)):
        tags: dict[str, Any] = {"chunk": c, "words": count_words(t)}
        if c in planted:
            tags["needle"] = planted[c]
        segments[sid] = Segment(sid, t, source=sources[c], tags=tags)

    drafter = _Drafter(texts, needles, knobs, seed)
    rng = random.Random(f"{seed}:corpus")
    drafts: list[Draft] = []
    bar = progress_bar(total=knobs.cases, desc="drafting cases", enabled=progress)
    for fi, family in enumerate(f for f in FAMILIES if per_family.get(f)):
        family_bases = []
        for j in bar_iter(bar, range(bases[family])):
            target = knobs.positions[(j + fi) % len(knobs.positions)]
            for _ in range(50):
                d = drafter.draft(family, rng, target)
                if drafter.answerable(d):
                    family_bases.append(d)
                    break
            else:
                raise KvauditError(f"{path}: could not place an unambiguous {family} case "
                                   "(the corpus may repeat the generated names); try another --seed")
        drafts.extend(family_bases)
        for _ in bar_iter(bar, range(n_var[family])):
            fam, item, order = rng.choice(family_bases)
            drafts.append((fam, item, new_order(rng, order)))
    bar.close()
    rng.shuffle(drafts)

    cases = []
    for k, d in enumerate(drafts):
        family, _, order = d
        question, answers, metric, evidence, holder = drafter.realize(d)
        system, sys_label, prefix, prefix_label = knobs.context(rng)
        ev_words = sum(count_words(texts[c]) for c in evidence) / len(evidence)
        strata: dict[str, Any] = {
            "n_docs": len(order),
            "doc_len_bucket": len_bucket(ev_words, opts.min_chunk_words, opts.chunk_words),
            "prefix_variant": prefix_label, "system_variant": sys_label,
        }
        if holder is not None:
            strata["evidence_position"] = position_label(order.index(holder), len(order))
            strata["hops"] = len(evidence)
        cases.append(Case(
            id=f"corpus-{k:06d}", task=family, segment_ids=[sids[c] for c in order],
            question=question, answers=answers, system=system, prefix=prefix, metric=metric,
            evidence=[sids[c] for c in evidence], strata=strata,
        ))
    used = {c for _, _, order in drafts for c in order}
    counts = {
        "documents_read": len(docs), "documents_used": n_used,
        "skipped": dict(sorted(skipped.items())), "chunks": len(chunks),
        "chunks_unused_by_cases": len(chunks) - len(used),
        "needles": {f: len(v) for f, v in needles.items()},
        "skipped_files": skipped_files,
    }
    params = {"path": str(path), "text_field": opts.text_field, "split": opts.split,
              "chunking": chunk_rule(opts.chunk, opts.chunk_words, opts.min_chunk_words),
              "max_doc_tokens": opts.max_doc_tokens, "on_long": opts.on_long,
              "max_file_bytes": opts.max_file_bytes, "strict": opts.strict,
              "needles": opts.needles, "families": weights, "number_metric": opts.number_metric,
              **knobs.params()}
    return segments, cases, params, counts


# --------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="folder of .txt/.md/.jsonl/.parquet files, one such file, "
                                "or a folder saved with datasets' save_to_disk")
    add_output_arguments(p)
    add_reuse_arguments(p)
    g = p.add_argument_group("corpus")
    d = CorpusOptions()
    g.add_argument("--text-field", default=d.text_field,
                   help="field holding the text in .jsonl, .parquet and saved datasets")
    g.add_argument("--split", default=None, help="split of a saved DatasetDict")
    g.add_argument("--chunk", choices=CHUNK_RULES, default=d.chunk,
                   help="chunking rule: paragraphs merged up to --chunk-words, or word windows")
    g.add_argument("--chunk-words", type=int, default=d.chunk_words, help="most words per chunk")
    g.add_argument("--min-chunk-words", type=int, default=d.min_chunk_words,
                   help="shorter chunks are skipped (and counted)")
    g.add_argument("--max-doc-tokens", type=int, default=d.max_doc_tokens,
                   help="longest document accepted, in --tokenizer units (the model context)")
    g.add_argument("--on-long", choices=("error", "skip"), default=d.on_long,
                   help="what to do with a document over --max-doc-tokens")
    g.add_argument("--needles", type=int, default=d.needles,
                   help="planted facts (0 = about one per two needle/bridge cases)")
    g.add_argument("--families", default=DEFAULT_FAMILIES,
                   help="task families and weights, e.g. needle=3,multi_hop_bridge=1,agreement=1")
    g.add_argument("--number-metric", choices=("em", "contains"), default=d.number_metric,
                   help="metric for year and number answers")
    g.add_argument("--max-file-bytes", type=int, default=d.max_file_bytes,
                   help="larger files are skipped and named (default 64 MiB; 0 = no limit)")
    g.add_argument("--strict", action="store_true",
                   help="refuse the corpus on an unreadable, empty or too large file "
                        "instead of skipping it")


def build(args: argparse.Namespace, count_tokens: TokenCounter | None = None,
          quiet: bool = False) -> DatasetCard:
    knobs = ReuseKnobs.from_args(args)
    opts = CorpusOptions(
        text_field=args.text_field, split=args.split, chunk=args.chunk, chunk_words=args.chunk_words,
        min_chunk_words=args.min_chunk_words, max_doc_tokens=args.max_doc_tokens,
        on_long=args.on_long, needles=args.needles, families=args.families,
        number_metric=args.number_metric, strict=args.strict, max_file_bytes=args.max_file_bytes)
    segments, cases, params, counts = generate(args.path, seed=args.seed, knobs=knobs, opts=opts,
                                               count_tokens=count_tokens,
                                               progress=show_progress(args, quiet))
    params["tokenizer"] = args.tokenizer
    card = finish(args.out, generator="corpus", seed=args.seed, params=params, segments=segments,
                  cases=cases, counts=counts, count_tokens=count_tokens, quiet=quiet,
                  progress=show_progress(args, quiet))
    if not quiet and counts["skipped_files"]:
        print(format_skipped(counts["skipped_files"]))
    return card


def run(args: argparse.Namespace) -> int:
    count_tokens = make_token_counter(args.tokenizer)
    with paused_gc():
        build(args, count_tokens)
    return 0

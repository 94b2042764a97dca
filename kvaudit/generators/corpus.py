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

This module holds the options, the drafting of cases and the CLI; reading the corpus is in
:mod:`kvaudit.generators.corpus_files`, chunking in :mod:`kvaudit.generators.chunking` and
planting needles in :mod:`kvaudit.generators.needles`.

Anything not used is counted in ``dataset.json`` (``counts``), never dropped silently. A file
that cannot be used (unreadable: not UTF-8, permission denied, damaged JSONL or parquet; empty; or
larger than ``--max-file-bytes``) is skipped and named with its reason in ``counts.skipped_files``
and the printed summary; ``--strict`` refuses the corpus instead. The walk stays inside the
folder: a link that resolves outside it is skipped, named there and in a warning on stderr.
Skipping a file changes nothing about the other files' segments and cases: they are
byte-identical to a run without it.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvaudit.core.arg_types import non_negative_int, positive_int
from kvaudit.core.dataset_format import Case, DatasetCard, Segment, segment_id
from kvaudit.core.errors import KvauditError
from kvaudit.core.progress import bar_iter, progress_bar, show_progress
from kvaudit.generators.arguments import add_output_arguments, add_reuse_arguments, parse_weights
from kvaudit.generators.chunking import CHUNK_RULES, chunk_corpus, chunk_rule
from kvaudit.generators.corpus_files import DEFAULT_MAX_FILE_BYTES, format_skipped, load_corpus
from kvaudit.generators.knobs import ReuseKnobs
from kvaudit.generators.needles import NEEDLE_WIDTH, Needle, plant_needles
from kvaudit.generators.placement import (
    ZipfPicker,
    allocate,
    arrange,
    len_bucket,
    new_order,
    position_label,
    target_slot,
)
from kvaudit.generators.tokens import TokenCounter, count_words
from kvaudit.generators.writing import finish, run_build

FAMILIES = ("needle", "multi_hop_bridge", "agreement")
DEFAULT_FAMILIES = "needle=3,multi_hop_bridge=1,agreement=1"
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")
_AGREEMENT_QUESTIONS = (
    "Summarize the documents in one sentence.",
    "What is the main topic of the {ordinal} document? Answer in one sentence.",
    "Name three key terms that appear in the documents.",
    "What is the {ordinal} document about? Answer briefly.",
)


# --------------------------------------------------------------------------- options


@dataclass
class CorpusOptions:
    """The corpus options of ``kvaudit generate corpus`` (defaults as on the command line)."""

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


# --------------------------------------------------------------------------- drafting


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


def _draft_all(drafter: _Drafter, knobs: ReuseKnobs, per_family: dict[str, int], bases: dict[str, int],
               n_var: dict[str, int], rng: random.Random, where: str, progress: bool) -> list[Draft]:
    """Every case's draft, in the dataset's (shuffled) order: per family its base cases, each placed
    until it is unambiguous, then its reorderings of them."""
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
                raise KvauditError(f"{where}: could not place an unambiguous {family} case "
                                   "(the corpus may repeat the generated names); try another --seed")
        drafts.extend(family_bases)
        for _ in bar_iter(bar, range(n_var[family])):
            fam, item, order = rng.choice(family_bases)
            drafts.append((fam, item, new_order(rng, order)))
    bar.close()
    rng.shuffle(drafts)
    return drafts


def _case(k: int, d: Draft, drafter: _Drafter, knobs: ReuseKnobs, rng: random.Random, texts: list[str],
          sids: list[str], opts: CorpusOptions) -> Case:
    """Draft ``k`` realized as a case, with its head (system prompt and prefix) and its strata."""
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
    return Case(id=f"corpus-{k:06d}", task=family, segment_ids=[sids[c] for c in order],
                question=question, answers=answers, system=system, prefix=prefix, metric=metric,
                evidence=[sids[c] for c in evidence], strata=strata)


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
    chunks, sources, n_used = chunk_corpus(
        docs, rule=opts.chunk, max_words=opts.chunk_words, min_words=opts.min_chunk_words,
        max_doc_tokens=opts.max_doc_tokens, on_long=opts.on_long, count_tokens=count_tokens,
        skipped=skipped, progress=progress)
    if len(chunks) < 2:
        raise KvauditError(f"{path}: only {len(chunks)} usable chunk(s) after chunking "
                           f"(skipped: {dict(sorted(skipped.items()))}); at least 2 are needed")

    per_family = allocate(knobs.cases, weights)
    n_var = {f: min(round(t * knobs.reorder_share), max(t - 1, 0)) for f, t in per_family.items()}
    bases = {f: t - n_var[f] for f, t in per_family.items()}
    kinds = [f for f in NEEDLE_WIDTH if bases.get(f, 0) > 0]
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
    drafts = _draft_all(drafter, knobs, per_family, bases, n_var, rng, str(path), progress)
    cases = [_case(k, d, drafter, knobs, rng, texts, sids, opts) for k, d in enumerate(drafts)]
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
    g.add_argument("--chunk-words", type=positive_int, default=d.chunk_words, help="most words per chunk")
    g.add_argument("--min-chunk-words", type=positive_int, default=d.min_chunk_words,
                   help="shorter chunks are skipped (and counted)")
    g.add_argument("--max-doc-tokens", type=positive_int, default=d.max_doc_tokens,
                   help="longest document accepted, in --tokenizer units (the model context)")
    g.add_argument("--on-long", choices=("error", "skip"), default=d.on_long,
                   help="what to do with a document over --max-doc-tokens")
    g.add_argument("--needles", type=non_negative_int, default=d.needles,
                   help="planted facts (0 = about one per two needle/bridge cases)")
    g.add_argument("--families", default=DEFAULT_FAMILIES,
                   help="task families and weights, e.g. needle=3,multi_hop_bridge=1,agreement=1")
    g.add_argument("--number-metric", choices=("em", "contains"), default=d.number_metric,
                   help="metric for year and number answers")
    g.add_argument("--max-file-bytes", type=non_negative_int, default=d.max_file_bytes,
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
                  progress=show_progress(args, quiet), overwrite=args.overwrite)
    if not quiet and counts["skipped_files"]:
        print(format_skipped(counts["skipped_files"]))
    for s in counts["skipped_files"]:
        if s["kind"] == "outside":
            print(f"warning: {s['file']}: skipped, {s['reason']}", file=sys.stderr)
    return card


def run(args: argparse.Namespace) -> int:
    return run_build(build, args)

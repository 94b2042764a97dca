"""Import existing RAG sets (CacheBlend-style ``ctxs`` JSON, LongBench JSONL) as datasets.

``ctxs``: a JSON list (or JSONL) of ``{"question": str, "answers": [str], "ctxs": [{"title": str,
"text": str}, ...]}`` records, the format of CacheBlend's MuSiQue, 2WikiMQA and SAMSum samples.
Each passage becomes the segment ``"{title}\\n{text}"`` (the text alone when there is no title).
Passages flagged ``is_supporting`` or ``has_answer`` are the evidence; with no flags, all are.

``longbench``: JSONL with ``input`` (the question), ``context`` and ``answers``. The context is
split at LongBench's ``Passage N:`` marker lines when it has them, else into paragraphs merged up
to ``--chunk-words`` words (the corpus generator's paragraph rule); the rule used per record is
counted in ``dataset.json``.

Each record gives one case in its original order plus ``--reorders`` cases over the same passages
in other orders, so every passage recurs at other positions.
"""

from __future__ import annotations

import argparse
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

from kvaudit.core.arg_types import non_negative_int, positive_int
from kvaudit.core.dataset_format import (
    METRICS,
    TASK_FAMILIES,
    Case,
    DatasetCard,
    Segment,
    segment_id,
)
from kvaudit.core.errors import DatasetError, KvauditError
from kvaudit.core.jsonio import parse_json
from kvaudit.core.progress import progress_bar, show_progress
from kvaudit.generators.arguments import add_output_arguments
from kvaudit.generators.chunking import chunk_text
from kvaudit.generators.placement import len_bucket, position_label
from kvaudit.generators.prefixes import PREFIX_VARIANTS, SYSTEM_PROMPTS, make_prefix
from kvaudit.generators.tokens import TokenCounter, count_words
from kvaudit.generators.writing import finish, run_build

FORMATS = ("ctxs", "longbench")
_PASSAGE_MARK = re.compile(r"^Passage \d+:[ \t]*$", re.MULTILINE)
EVIDENCE_FLAGS = ("is_supporting", "has_answer")


def _records(path: Path) -> list[tuple[str, Any]]:
    """``(where, record)`` pairs from a JSON list or a JSONL file."""
    try:
        raw = path.read_bytes().decode("utf-8").lstrip("\ufeff")
    except FileNotFoundError:
        raise KvauditError(f"{path}: file not found") from None
    except UnicodeDecodeError as e:
        raise KvauditError(f"{path}: not UTF-8 text (undecodable byte at offset {e.start})") from None
    if raw.lstrip().startswith("["):
        data = _parse(raw, str(path))
        out = [(f"{path}, record {i}", r) for i, r in enumerate(data)]
    else:
        # Lines end at "\n" only (iter_jsonl's rule): str.splitlines would also break inside a
        # JSON string holding a raw U+2028, U+0085 or U+001C.
        out = [(f"{path}, line {n}", _parse(line, f"{path}, line {n}"))
               for n, line in enumerate(raw.split("\n"), 1) if line.strip()]
    if not out:
        raise KvauditError(f"{path}: no records")
    for where, r in out:
        if not isinstance(r, dict):
            raise KvauditError(f"{where}: expected a JSON object, got {type(r).__name__}")
    return out


def _parse(text: str, where: str) -> Any:
    """:func:`parse_json`, its error a :class:`KvauditError` as every other import error is."""
    try:
        return parse_json(text, where)
    except DatasetError as e:
        raise KvauditError(str(e)) from None


def _str(r: dict, key: str, where: str) -> str:
    if key not in r:
        raise KvauditError(f"{where}: missing field {key!r}")
    v = r[key]
    if not isinstance(v, str):
        raise KvauditError(f"{where}: field {key!r} must be a string, got {type(v).__name__}")
    if not v.strip():
        raise KvauditError(f"{where}: field {key!r} is empty")
    return v


def _answers(r: dict, where: str) -> list[str]:
    v = r.get("answers")
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(a, str) for a in v):
        raise KvauditError(f"{where}: field 'answers' must be a non-empty list of strings")
    return list(v)


def _ctxs_passages(r: dict, where: str) -> list[tuple[str, bool | None]]:
    ctxs = r.get("ctxs")
    if not isinstance(ctxs, list) or not ctxs:
        raise KvauditError(f"{where}: field 'ctxs' must be a non-empty list of passages")
    out = []
    for j, c in enumerate(ctxs):
        w = f"{where}, ctxs[{j}]"
        if not isinstance(c, dict):
            raise KvauditError(f"{w}: expected an object with 'title' and 'text'")
        text, title = c.get("text"), c.get("title", "")
        if not isinstance(text, str) or not isinstance(title, str | None):
            raise KvauditError(f"{w}: fields 'text' and 'title' must be strings")
        flag = next((bool(c[f]) for f in EVIDENCE_FLAGS if f in c), None)
        body = text.strip()
        out.append((f"{title.strip()}\n{body}" if title and title.strip() and body else body, flag))
    return out


def split_context(context: str, chunk_words: int) -> tuple[list[str], str]:
    """LongBench context -> passages, and the rule used (``passage_markers`` or ``paragraphs``)."""
    if _PASSAGE_MARK.search(context):
        parts = [p.strip() for p in _PASSAGE_MARK.split(context)]
        return [p for p in parts if p], "passage_markers"
    return chunk_text(context, "paragraph", chunk_words), "paragraphs"


def _check_options(fmt: str, task: str, metric: str, reorders: int, chunk_words: int, limit: int,
                   prefixes: tuple[str, ...], systems: int) -> None:
    if fmt not in FORMATS:
        raise KvauditError(f"--format must be one of {', '.join(FORMATS)}")
    if task not in TASK_FAMILIES:
        raise KvauditError(f"--task must be one of {', '.join(TASK_FAMILIES)}")
    if metric not in METRICS:
        raise KvauditError(f"--metric must be one of {', '.join(METRICS)}")
    if reorders < 0 or chunk_words < 1 or limit < 0:
        raise KvauditError("--reorders and --limit must be >= 0 and --chunk-words >= 1")
    if not prefixes or any(p not in PREFIX_VARIANTS for p in prefixes):
        raise KvauditError(f"--prefixes takes a comma list of {', '.join(PREFIX_VARIANTS)}")
    if not 1 <= systems <= len(SYSTEM_PROMPTS):
        raise KvauditError(f"--systems must be between 1 and {len(SYSTEM_PROMPTS)}")


def _segments_of(passages: list[tuple[str, bool | None]], segments: dict[str, Segment], source: str, idx: int,
                 counts: Counter) -> tuple[list[str], list[bool | None]]:
    """A record's passages as segment ids (new segments added to ``segments``; empty passages and
    repeats within the record counted and left out), with each passage's evidence flag."""
    ids: list[str] = []
    flags: list[bool | None] = []
    for text, flag in passages:
        if not text:
            counts["empty_passages"] += 1
            continue
        sid = segment_id(text)
        if sid in ids:
            counts["duplicate_passages_in_record"] += 1
            continue
        if sid not in segments:
            segments[sid] = Segment(sid, text, source=source, tags={"record": idx, "words": count_words(text)})
        ids.append(sid)
        flags.append(flag)
    return ids, flags


def _orders(ids: list[str], reorders: int, rng: random.Random) -> list[list[str]]:
    """The record's own order, then up to ``reorders`` distinct shuffles of it."""
    orders = [list(ids)]
    for _ in range(50 * reorders):
        if len(orders) > reorders:
            break
        o = list(ids)
        rng.shuffle(o)
        if o not in orders:
            orders.append(o)
    return orders


def generate(path: str | Path, fmt: str, *, seed: int = 0, reorders: int = 2, task: str = "imported",
             metric: str = "f1", chunk_words: int = 200, limit: int = 0,
             prefixes: tuple[str, ...] = ("none",), systems: int = 1, progress: bool = False,
             ) -> tuple[dict[str, Segment], list[Case], dict[str, Any], dict[str, Any]]:
    """Import ``path`` in format ``fmt``: ``(segments, cases, params, counts)`` (``progress``:
    a bar on stderr over the records, when they take over 2 s)."""
    _check_options(fmt, task, metric, reorders, chunk_words, limit, prefixes, systems)
    p = Path(path)
    records = _records(p)
    if limit:
        records = records[:limit]
    counts: Counter = Counter()
    segments: dict[str, Segment] = {}
    cases: list[Case] = []
    for idx, (where, r) in enumerate(progress_bar(records, desc="importing records", unit="record",
                                                  enabled=progress)):
        rng = random.Random(f"{seed}:record:{idx}")
        if fmt == "ctxs":
            question, answers = _str(r, "question", where), _answers(r, where)
            passages = _ctxs_passages(r, where)
        else:
            question, answers = _str(r, "input", where), _answers(r, where)
            texts, rule = split_context(_str(r, "context", where), chunk_words)
            counts[f"split_{rule}"] += 1
            passages = [(t, None) for t in texts]
        ids, flags = _segments_of(passages, segments, f"{p.name}#{idx}", idx, counts)
        if not ids:
            raise KvauditError(f"{where}: no non-empty passages")
        flagged = [s for s, f in zip(ids, flags, strict=True) if f]
        evidence = flagged if any(f is not None for f in flags) and flagged else list(ids)
        counts["evidence_from_flags"] += evidence is flagged
        ev_text = " ".join(segments[s].text.lower() for s in evidence)
        counts["answer_in_evidence"] += any(a.strip().lower() in ev_text for a in answers)
        orders = _orders(ids, reorders, rng)
        counts["reorders_short_of_request"] += reorders + 1 - len(orders)
        mean_words = sum(segments[s].tags["words"] for s in ids) / len(ids)
        for v, order in enumerate(orders):
            si = rng.randrange(systems)
            variant = rng.choice(prefixes)
            strata: dict[str, Any] = {
                "n_docs": len(order), "doc_len_bucket": len_bucket(mean_words, 0, 300),
                "prefix_variant": variant, "system_variant": f"sys{si}",
                "order_variant": "original" if v == 0 else "reordered",
            }
            if len(evidence) < len(order):
                strata["hops"] = len(evidence)
                if len(evidence) == 1:
                    strata["evidence_position"] = position_label(order.index(evidence[0]), len(order))
            cases.append(Case(
                id=f"{fmt}-{idx:06d}-o{v}", task=task, segment_ids=order, question=question,
                answers=list(answers), system=SYSTEM_PROMPTS[si], prefix=make_prefix(rng, variant),
                metric=metric, evidence=list(evidence), strata=strata,
            ))
    counts["records"] = len(records)
    params = {"path": str(path), "format": fmt, "reorders": reorders, "task": task, "metric": metric,
              "limit": limit, "prefixes": list(prefixes), "systems": list(SYSTEM_PROMPTS[:systems]),
              "passage_rule": ("ctxs: title + newline + text; longbench: split at 'Passage N:' "
                               f"lines, else paragraphs merged up to {chunk_words} words"),
              "chunk_words": chunk_words}
    return segments, cases, params, dict(sorted(counts.items()))


# --------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="ctxs-style JSON (list or JSONL) or LongBench JSONL file")
    p.add_argument("--format", required=True, choices=FORMATS, help="input format")
    add_output_arguments(p)
    p.add_argument("--reorders", type=non_negative_int, default=2,
                   help="extra cases per record over the same passages in other orders")
    p.add_argument("--task", default="imported", choices=TASK_FAMILIES,
                   help="task family to tag the cases with")
    p.add_argument("--metric", default="f1", choices=METRICS,
                   help="answer metric (f1 for short QA, rouge_l for summaries)")
    p.add_argument("--chunk-words", type=positive_int, default=200,
                   help="longbench contexts without passage markers: most words per passage")
    p.add_argument("--limit", type=non_negative_int, default=0, help="import only the first N records")
    p.add_argument("--prefixes", default="none",
                   help=f"user-turn prefix variants to draw from ({','.join(PREFIX_VARIANTS)})")
    p.add_argument("--systems", type=positive_int, default=1,
                   help=f"how many of the {len(SYSTEM_PROMPTS)} system prompts to vary over")


def build(args: argparse.Namespace, count_tokens: TokenCounter | None = None,
          quiet: bool = False) -> DatasetCard:
    prefixes = tuple(x.strip() for x in args.prefixes.split(",") if x.strip())
    segments, cases, params, counts = generate(
        args.file, args.format, seed=args.seed, reorders=args.reorders, task=args.task,
        metric=args.metric, chunk_words=args.chunk_words, limit=args.limit, prefixes=prefixes,
        systems=args.systems, progress=show_progress(args, quiet))
    params["tokenizer"] = args.tokenizer
    return finish(args.out, generator=f"import-{args.format}", seed=args.seed, params=params,
                  segments=segments, cases=cases, counts=counts, count_tokens=count_tokens,
                  quiet=quiet, progress=show_progress(args, quiet), overwrite=args.overwrite)


def run(args: argparse.Namespace) -> int:
    return run_build(build, args)

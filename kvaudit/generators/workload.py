"""Zipfian RAG request workload for the cache simulator (``kvaudit generate workload``).

The model, all of it seeded (same parameters and seed, same bytes):

* a corpus of ``documents`` documents; document popularity is Zipfian with exponent ``zipf``
  (rank k drawn with probability proportional to k^-zipf); each document's length in tokens is
  drawn once from ``doc_tokens``;
* a pool of ``queries`` distinct queries, each retrieving ``docs_per_request`` distinct documents
  drawn by that popularity, in retrieval order; query popularity is Zipfian with the same
  exponent. ``queries=0`` makes every request a new query (documents drawn per request);
* each request picks a query, then a prefix: with probability ``shared_prefix_share`` the fixed
  date prefix shared by all such requests, otherwise a prefix holding dynamic metadata
  (timestamp, session id) that no other request shares; then the documents; then a question
  phrased anew for each request;
* ``shift_every`` > 0 moves popularity every that many requests to a fresh pool of queries over a
  reshuffled document ranking (with ``queries=0``: to a reshuffled ranking): what was hot goes
  cold, a burst of reuse that then decays;
* timestamps are Poisson arrivals at ``rate`` requests per second.

The defaults are calibrated against the published capacity study (see docs/simulator.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from kvaudit.core.arg_types import non_negative_int, positive_int
from kvaudit.core.errors import KvauditError
from kvaudit.core.jsonio import atomic_open, check_writable_dir, removed_on_failure
from kvaudit.core.progress import add_progress_argument, progress_bar
from kvaudit.core.trace import DOCUMENT, PREFIX, QUESTION, Trace
from kvaudit.generators.workload_log import MAX_LINE_BYTES, MAX_PIECES, REGEX_TIMEOUT_S


@dataclass(frozen=True)
class WorkloadParams:
    requests: int = 2500
    documents: int = 10000
    zipf: float = 0.65
    queries: int = 38
    docs_per_request: int = 10
    shared_prefix_share: float = 0.2
    prefix_tokens: int = 400
    doc_tokens: str = "lognormal:2000:0.5"
    question_tokens: str = "uniform:20:60"
    shift_every: int = 0
    rate: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise KvauditError(f"workload: {msg}")

        need(self.requests > 0, "--requests must be positive")
        need(self.documents > 0, "--documents must be positive")
        need(self.zipf >= 0, "--zipf must be >= 0")
        need(self.queries >= 0, "--queries must be >= 0")
        need(0 < self.docs_per_request <= self.documents,
             "--docs-per-request must be between 1 and --documents")
        need(0 <= self.shared_prefix_share <= 1, "--shared-prefix-share must be within [0, 1]")
        need(self.prefix_tokens > 0, "--prefix-tokens must be positive")
        need(self.shift_every >= 0, "--shift-every must be >= 0")
        need(self.rate > 0, "--rate must be positive")
        parse_dist(self.doc_tokens, "--doc-tokens")
        parse_dist(self.question_tokens, "--question-tokens")


_DIST = re.compile(r"(fixed|uniform|lognormal):([0-9.]+)(?::([0-9.]+))?")


def parse_dist(spec: str, what: str = "distribution") -> tuple[str, float, float]:
    """``fixed:N``, ``uniform:LO:HI`` or ``lognormal:MEDIAN:SIGMA`` (token counts)."""
    m = _DIST.fullmatch(spec.strip())
    if not m or (m.group(1) != "fixed") != (m.group(3) is not None):
        raise KvauditError(f"{what} {spec!r}: expected fixed:N, uniform:LO:HI or lognormal:MEDIAN:SIGMA")
    a = float(m.group(2))
    b = float(m.group(3) or 0)
    if a < 1 or (m.group(1) == "uniform" and b < a):
        raise KvauditError(f"{what} {spec!r}: token counts must be >= 1 and LO <= HI")
    return m.group(1), a, b


def sample_tokens(spec: str, n: int, rng: np.random.Generator) -> np.ndarray:
    kind, a, b = parse_dist(spec)
    if kind == "fixed":
        x = np.full(n, a)
    elif kind == "uniform":
        x = rng.integers(int(a), int(b) + 1, n)
    else:
        x = rng.lognormal(np.log(a), b, n)
    return np.maximum(1, np.rint(x)).astype(np.int64)


def _zipf_cdf(n: int, s: float) -> np.ndarray:
    w = np.arange(1, n + 1, dtype=np.float64) ** -s
    cdf = np.cumsum(w)
    return cdf / cdf[-1]


def _draw_ranks(cdf: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    return np.minimum(np.searchsorted(cdf, rng.random(shape), side="right"), len(cdf) - 1)


def _draw_distinct(cdf: np.ndarray, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``rows`` x ``k`` popularity ranks, distinct within each row, by redrawing clashing rows."""
    out = _draw_ranks(cdf, (rows, k), rng)
    for _ in range(100):
        s = np.sort(out, axis=1)
        bad = np.flatnonzero((s[:, 1:] == s[:, :-1]).any(axis=1))
        if not len(bad):
            return out
        out[bad] = _draw_ranks(cdf, (len(bad), k), rng)
    # Extreme skew with k close to the corpus size: exact sampling without replacement.
    p = np.diff(cdf, prepend=0.0)
    for r in bad:
        out[r] = rng.choice(len(cdf), size=k, replace=False, p=p)
    return out


def generate(params: WorkloadParams) -> Trace:
    """The workload as a :class:`Trace` (content codes laid out as :func:`content_name` reads)."""
    params.validate()
    p = params
    rng = np.random.default_rng(p.seed)
    n, k = p.requests, p.docs_per_request
    doc_len = sample_tokens(p.doc_tokens, p.documents, rng)
    doc_cdf = _zipf_cdf(p.documents, p.zipf)
    epoch = np.arange(n) // p.shift_every if p.shift_every else np.zeros(n, np.int64)
    n_epochs = int(epoch[-1]) + 1
    if p.queries:
        pool = _draw_distinct(doc_cdf, p.queries, k, rng)  # query -> document ranks
        q_rank = _draw_ranks(_zipf_cdf(p.queries, p.zipf), (n,), rng)
        docs = pool[q_rank]
    else:
        docs = _draw_distinct(doc_cdf, n, k, rng)
    for e in range(1, n_epochs):  # popularity moves to fresh queries over reshuffled documents
        sel = epoch == e
        ranks = _draw_distinct(doc_cdf, p.queries, k, rng)[q_rank[sel]] if p.queries else docs[sel]
        docs[sel] = rng.permutation(p.documents)[ranks]
    shared = rng.random(n) < p.shared_prefix_share
    q_len = sample_tokens(p.question_tokens, n, rng)
    arrivals = np.cumsum(rng.exponential(1.0 / p.rate, n)).round(3)

    width = k + 2
    r = np.arange(n)
    content = np.empty((n, width), np.int64)
    content[:, 0] = np.where(shared, p.documents, p.documents + 1 + r)
    content[:, 1:-1] = docs
    content[:, -1] = p.documents + 1 + n + r
    tokens = np.empty((n, width), np.int64)
    tokens[:, 0] = p.prefix_tokens
    tokens[:, 1:-1] = doc_len[docs]
    tokens[:, -1] = q_len
    kind = np.full((n, width), DOCUMENT, np.int8)
    kind[:, 0] = PREFIX
    kind[:, -1] = QUESTION
    return Trace(np.arange(n + 1, dtype=np.int64) * width, kind.ravel(), content.ravel(),
                 tokens.ravel(), arrivals, None)


def request_id(i: int) -> str:
    return f"r{i:07d}"


def content_name(code: int, params: WorkloadParams) -> str:
    """The content id a generated piece carries in the JSONL file."""
    d, n = params.documents, params.requests
    if code < d:
        return f"doc-{code:06d}"
    if code == d:
        return "prefix-date-shared"
    if code <= d + n:
        return f"prefix-meta-{request_id(code - d - 1)}"
    return f"q-{request_id(code - d - 1 - n)}"


def workload_lines(trace: Trace, params: WorkloadParams):
    """JSONL lines, one per request (the format :func:`kvaudit.core.trace.read_trace` reads)."""
    kinds = ("prefix", "document", "question")
    offs = trace.offsets.tolist()
    kind, content, tokens = trace.kind.tolist(), trace.content.tolist(), trace.tokens.tolist()
    ts = trace.timestamps.tolist()
    # A generated content code always has one kind and one token count: build its JSON once.
    cache: dict[int, str] = {}

    def piece(i: int) -> str:
        c = content[i]
        text = cache.get(c)
        if text is None:
            text = cache[c] = (f'{{"id":"{content_name(c, params)}","kind":"{kinds[kind[i]]}",'
                               f'"tokens":{tokens[i]}}}')
        return text

    for r in range(trace.n_requests):
        pieces = ",".join([piece(i) for i in range(offs[r], offs[r + 1])])
        yield f'{{"id":"{request_id(r)}","pieces":[{pieces}],"timestamp":{ts[r]!r}}}\n'


def write_workload(path: str | Path, trace: Trace, params: WorkloadParams,
                   progress: bool = False) -> None:
    """Write the workload JSONL atomically (temp file, then rename); ``progress``: a bar on
    stderr over the requests, when writing takes over 2 s.

    Streams line by line (``kvaudit.core.jsonio.atomic_open``) instead of building the whole
    text first: a million requests are 680 MB of JSON.
    """
    with atomic_open(path) as f:
        f.writelines(progress_bar(workload_lines(trace, params), total=trace.n_requests,
                                  desc="writing requests", unit="request", enabled=progress))


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = WorkloadParams()
    a = parser.add_argument
    a("--out", required=True, help="workload JSONL file to write")
    a("--requests", type=positive_int, default=d.requests, help=f"number of requests (default {d.requests})")
    a("--documents", type=positive_int, default=d.documents, help=f"corpus size (default {d.documents})")
    a("--zipf", type=float, default=d.zipf, help=f"Zipf exponent of query and document popularity (default {d.zipf})")
    a("--queries", type=non_negative_int, default=d.queries,
      help=f"distinct queries in the pool; 0 = every request a new query (default {d.queries})")
    a("--docs-per-request", type=positive_int, default=d.docs_per_request, help=f"default {d.docs_per_request}")
    a("--shared-prefix-share", type=float, default=d.shared_prefix_share,
      help=f"share of requests carrying the fixed date prefix (default {d.shared_prefix_share})")
    a("--prefix-tokens", type=non_negative_int, default=d.prefix_tokens, help=f"default {d.prefix_tokens}")
    a("--doc-tokens", default=d.doc_tokens, metavar="DIST",
      help=f"fixed:N, uniform:LO:HI or lognormal:MEDIAN:SIGMA (default {d.doc_tokens})")
    a("--question-tokens", default=d.question_tokens, metavar="DIST", help=f"default {d.question_tokens}")
    a("--shift-every", type=non_negative_int, default=d.shift_every,
      help="reshuffle popularity every N requests (bursts that decay); 0 = never")
    a("--rate", type=float, default=d.rate, help=f"arrivals per second for timestamps (default {d.rate})")
    a("--seed", type=non_negative_int, default=d.seed)
    g = parser.add_argument_group("from a request log (the generator's options above are then unused)")
    g.add_argument("--from-log", type=Path, default=None, metavar="FILE",
                   help="a JSONL request log: chat-completions requests (messages, also Batch API lines), "
                        "completions requests (prompt) or plain prompts (text, or JSON strings); docs/simulator.md")
    g.add_argument("--split", default="messages",
                   help="how a prompt is cut into pieces: messages (default), delimiter:STRING or regex:PATTERN "
                        f"(a regex may take {REGEX_TIMEOUT_S:g} s of CPU time per request)")
    g.add_argument("--max-line-bytes", type=non_negative_int, default=MAX_LINE_BYTES,
                   help="a longer log line refuses the log, naming it (default 8 MiB; 0 = no limit)")
    g.add_argument("--max-pieces", type=positive_int, default=MAX_PIECES,
                   help=f"most pieces --split may cut one request into (default {MAX_PIECES}); more "
                        "refuses the log, naming the line")
    g.add_argument("--tokenizer", default="smollm2",
                   help="token counts from this model's tokenizer: smollm2 (default) or a local checkpoint directory")
    g.add_argument("--keep-text", action="store_true",
                   help="write each piece's text too (logs hold user data: off by default); kvaudit replay "
                        "then serves the logged text")
    g.add_argument("--strict", action="store_true", help="refuse the log at its first unreadable line "
                                                         "(default: skip it and name it)")
    add_progress_argument(parser)


def params_from_args(args: argparse.Namespace) -> WorkloadParams:
    return WorkloadParams(**{f.name: getattr(args, f.name) for f in fields(WorkloadParams)})


def card_path(out: Path) -> Path:
    """Where an imported log's card goes: ``w.jsonl`` -> ``w.card.json``."""
    return out.with_name(out.stem + ".card.json")


def run_from_log(args: argparse.Namespace, out: Path) -> int:
    import sys

    from kvaudit.core.jsonio import write_json
    from kvaudit.generators.workload_log import (
        hidden_repeats_hint,
        import_log,
        iter_lines,
        parse_split,
    )
    from kvaudit.models import load_tokenizer

    parse_split(args.split)  # a bad --split, or log, is refused before the tokenizer loads (seconds)
    tokenizer = functools.cache(lambda: load_tokenizer(args.tokenizer))

    def count(text: str) -> int:
        return len(tokenizer()(text, add_special_tokens=False)["input_ids"])

    result = import_log(args.from_log, args.split, count, keep_text=args.keep_text, strict=args.strict,
                        max_line_bytes=args.max_line_bytes, max_pieces=args.max_pieces)
    card = {**result.card, "tokenizer": args.tokenizer, "skipped": result.skipped}
    with removed_on_failure(out, card_path(out)):  # both files or neither
        with atomic_open(out) as f:
            f.writelines(iter_lines(result))
        write_json(card_path(out), card)
    for s in result.skipped[:20]:
        print(f"{args.from_log}, line {s['line']}: skipped: {s['reason']}", file=sys.stderr)
    if len(result.skipped) > 20:
        print(f"... {len(result.skipped) - 20} more skipped lines in {card_path(out)}", file=sys.stderr)
    c = result.card
    print(f"wrote {out}: {c['requests']} requests from {args.from_log} ({c['skipped_lines']} lines skipped), "
          f"{c['prompt_tokens']} prompt tokens; card {card_path(out)}")
    print(f"repeated content: {100 * c['repeated_share']:.1f}% of prompt tokens; "
          f"{100 * c['non_prefix_share_of_repeated']:.1f}% of it at positions an exact prefix cache cannot reach")
    hint = hidden_repeats_hint(c)
    if hint:
        print(hint, file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.is_dir():
        raise KvauditError(f"--out {out}: is a directory; the workload is one JSONL file (e.g. {out / 'workload.jsonl'})")
    check_writable_dir(out.parent, "--out")
    if args.from_log is not None:
        return run_from_log(args, out)
    params = params_from_args(args)
    trace = generate(params)
    with removed_on_failure(out):  # no empty folder left by a failed write
        write_workload(out, trace, params, progress=not args.no_progress)
    s = trace.summary()
    print(f"wrote {args.out}: {s['requests']} requests, {s['prompt_tokens']} prompt tokens "
          f"({s['mean_prompt_tokens']:.0f} per request), {s['distinct_documents']} distinct documents")
    print("parameters: " + json.dumps(asdict(params), sort_keys=True))
    return 0

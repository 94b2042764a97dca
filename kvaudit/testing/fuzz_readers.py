"""Fuzzing every reader of user-supplied files (issue #23).

The property, for every reader: any input either reads, and what it reads holds the record's
documented types (and can be written back where kvaudit writes it back), or raises kvaudit's own
error (:data:`kvaudit.core.errors.USER_ERRORS`) whose message names the file, stays short (user
input is echoed cut) and holds no raw control or line-separator character. Never another
exception type, never a hang (hypothesis ``deadline``).

The inputs (:func:`inputs`): arbitrary bytes, JSON-ish character soup, and structure-aware
mutations of a valid file (:class:`Mutation`): any JSON/TOML value at any path replaced by a value
of another type or by a hostile token (a 5000-digit integer, ``NaN``/``Infinity``, arrays nested
100000 deep, a 100000-character string, U+2028 / U+0085 / U+001C inside strings, a lone
surrogate escape), a field deleted, an unknown field added, a value of the file moved to another
place, up to three such changes at once, the file truncated at any byte, the trailing newline
dropped.

This module is the harness: the readers (:data:`READERS`), the inputs and the property
(:func:`attempt`). ``tests/test_fuzz_readers.py`` is the fast slice (a few dozen examples per
reader, derandomized); ``benchmarks/fuzz_readers.py`` runs the same readers and inputs for as many
examples as asked.
The readers over ``kvaudit.core.dataset_format`` and ``kvaudit.core.run_format`` (``dataset_*``, ``pairs``) and the policy reader are
fuzzed here like the others; where they fail, the failure is in a file this harness does not
own, and it is left failing on purpose (not skipped, not xfail) for that file's owner.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import tempfile
import types
import typing
import unicodedata
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from kvaudit.core.errors import USER_ERRORS

PACKAGE = Path(__file__).resolve().parent.parent  # kvaudit/
EXAMPLE_DATASET = PACKAGE / "data" / "example"

# --------------------------------------------------------------------------- hostile tokens

HUGE_INT = "1" + "0" * 5000  # more digits than Python converts (ValueError in json.loads)
BIG_INT = "9" * 4000  # converts, but fits no int64, no float, and no repr over 4300 digits
DEEP_ARRAY = "[" * 100_000 + "]" * 100_000  # deeper than the recursion limit
MEDIUM_ARRAY = "[" * 900 + "]" * 900  # parses, but breaks recursive code after it
LONG_STRING = '"' + "x" * 100_000 + '"'

RAW_JSON = (
    HUGE_INT, "-" + HUGE_INT, BIG_INT, "1e400", "-1e400", "NaN", "Infinity", "-Infinity",
    DEEP_ARRAY, '{"a":' * 100_000 + "1" + "}" * 100_000, MEDIUM_ARRAY, LONG_STRING,
    '"a\u2028b"', '"a\x85b"', '"a\x1cb"', '"\\ud800"', '"a\\u0000b"', '"\\n"',
    "null", "true", "false", "0", "-1", "0.5", "[]", "{}", '""', "9223372036854775808",
    "-9223372036854775809", '[1, "x", null]', '{"": null}',
)
RAW_TOML = (
    HUGE_INT, BIG_INT, "nan", "inf", "-inf", DEEP_ARRAY, "[" * 400 + "]" * 400, LONG_STRING,
    '"a\u2028b"', '"a\x85b"', '"\\u001c"', "1979-05-27T07:32:00Z", "07:32:00", "true", "0", "-1",
    "0.5", "[]", "{}", '""', "9223372036854775808", "{ a = 1 }", "[1, 2]",
)

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@dataclasses.dataclass
class Bytes:
    """The whole file, as given."""

    data: bytes


@dataclasses.dataclass
class Mutation:
    """A valid file, parsed, changed at one node (and at more, by ``more``), written again, then
    maybe cut.

    ``node`` picks a node of the JSON/TOML tree in pre-order (modulo their count; 0 is the
    document, or in a JSONL file the record picked by ``line``), or is a path of keys and indices.
    ``replace`` puts ``raw`` (a hostile token, written as is) or else ``value`` there, ``add``
    adds it under ``key`` to the nearest object, ``copy`` puts a copy of the node ``other`` there
    (a value of the document's own, in the wrong place), ``delete`` removes the node (a JSONL
    record: its line). ``ensure_ascii``, ``truncate`` and ``drop_newline`` act on the whole file
    (those of the mutations in ``more`` are ignored).
    """

    op: str = "replace"  # replace | delete | add | copy | none
    node: int | tuple = 0
    raw: str | None = None
    value: Any = None
    line: int = 0
    key: str = "fuzz_field"
    other: int = 0
    ensure_ascii: bool = False
    truncate: int | None = None  # keep this many bytes (modulo the length + 1)
    drop_newline: bool = False
    more: list[Mutation] = dataclasses.field(default_factory=list)


def inputs() -> st.SearchStrategy:
    """Every kind of input: bytes, character soup, and (twice as often) mutations."""
    def mutation(more: st.SearchStrategy) -> st.SearchStrategy:
        return st.builds(
            Mutation,
            op=st.sampled_from(("replace", "replace", "replace", "delete", "add", "copy", "none")),
            node=st.integers(0, 10**6),
            raw=st.none() | st.none() | st.sampled_from(RAW_JSON + RAW_TOML),
            value=JSON_VALUES,
            line=st.integers(0, 10**6),
            key=st.text(max_size=8),
            other=st.integers(0, 10**6),
            ensure_ascii=st.booleans(),
            truncate=st.none() | st.none() | st.none() | st.integers(0, 10**7),
            drop_newline=st.booleans(),
            more=more,
        )

    soup = st.text(alphabet='{}[]",:0123456789.eE+-tfnrulsaNIy \n\\', max_size=200)
    mutations = mutation(st.lists(mutation(st.just([])), max_size=2))
    return st.one_of(
        st.builds(Bytes, st.binary(max_size=400)),
        st.builds(Bytes, soup.map(lambda s: s.encode())),
        mutations,
        mutations,
    )


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*path, i))
    return out


def _get(node: Any, path: tuple) -> Any:
    for p in path:
        node = node[p]
    return node


def _mutate(root: Any, m: Mutation, placeholder: str) -> tuple[Any, bool]:
    """``(new root, deleted)`` after ``m``'s operation (``deleted``: the root itself went);
    ``placeholder`` stands for ``m.raw`` until the document is written."""
    paths = _paths(root)
    path = m.node if isinstance(m.node, tuple) else paths[m.node % len(paths)]
    new = placeholder if m.raw is not None else m.value
    if m.op == "copy":
        new = json.loads(json.dumps(_get(root, paths[m.other % len(paths)])))
    try:
        _get(root, path)
    except (KeyError, IndexError, TypeError):
        return root, False  # an explicit path the document lacks: unchanged
    if m.op in ("replace", "copy"):
        if not path:
            return new, False
        _get(root, path[:-1])[path[-1]] = new
    elif m.op == "delete":
        if not path:
            return None, True
        parent = _get(root, path[:-1])
        del parent[path[-1]]
    elif m.op == "add":
        for cut in range(len(path), -1, -1):  # the nearest object at or above the node
            target = _get(root, path[:cut])
            if isinstance(target, dict):
                target[m.key] = new
                break
    return root, False


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k, ensure_ascii=False)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return "null"  # no TOML value: an invalid file, as a None would be


def toml_dumps(doc: Any) -> str:
    """A small TOML writer for the policy's shapes: top-level keys, tables, arrays of tables."""
    if not isinstance(doc, dict):
        return _toml_value(doc) + "\n"
    head, tables = [], []
    for k, v in doc.items():
        if isinstance(v, dict):
            tables.append(f"\n[{_toml_key(k)}]")
            tables += [f"{_toml_key(a)} = {_toml_value(b)}" for a, b in v.items()]
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for x in v:
                tables.append(f"\n[[{_toml_key(k)}]]")
                tables += [f"{_toml_key(a)} = {_toml_value(b)}" for a, b in x.items()]
        else:
            head.append(f"{_toml_key(k)} = {_toml_value(v)}")
    return "\n".join(head + tables) + "\n"


def render(fmt: str, seed: bytes, recipe: Bytes | Mutation) -> bytes:
    """The bytes of one fuzz input for a file of format ``fmt`` (json, jsonl, toml, text)."""
    if isinstance(recipe, Bytes):
        return recipe.data
    m = recipe
    ops = [x for x in (m, *m.more) if x.op != "none"]
    if fmt == "text":
        text = seed.decode("utf-8")
        for x in ops:
            at = (x.node if isinstance(x.node, int) else 0) % (len(text) + 1)
            text = text[:at] + (x.raw if x.raw is not None else json.dumps(x.value)) + text[at:]
        data = text.encode("utf-8", "surrogatepass")
    else:
        import tomllib

        # each raw token stands as a placeholder string until the document is written
        placeholders = [f"\x00fuzz-raw-{i}\x00" for i in range(len(ops))]
        raws = {ph: x.raw for ph, x in zip(placeholders, ops) if x.raw is not None}
        if fmt == "jsonl":
            lines = [json.loads(x) for x in seed.decode("utf-8").split("\n") if x.strip()]
            for x, ph in zip(ops, placeholders):
                if not lines:
                    break
                i = x.line % len(lines)
                lines[i], deleted = _mutate(lines[i], x, ph)
                if deleted:
                    del lines[i]
            text = "".join(json.dumps(x, ensure_ascii=m.ensure_ascii) + "\n" for x in lines)
        elif fmt in ("json", "toml"):
            doc: Any = json.loads(seed) if fmt == "json" else tomllib.loads(seed.decode())
            deleted = False
            for x, ph in zip(ops, placeholders):
                if not deleted:
                    doc, deleted = _mutate(doc, x, ph)
            if deleted:
                text = ""
            elif fmt == "json":
                text = json.dumps(doc, indent=2, ensure_ascii=m.ensure_ascii) + "\n"
            else:
                text = toml_dumps(doc)
        else:
            raise ValueError(fmt)
        for ph, raw in raws.items():
            text = text.replace(json.dumps(ph), raw)
        data = text.encode("utf-8", "surrogatepass")
    if m.truncate is not None:
        data = data[: m.truncate % (len(data) + 1)]
    if m.drop_newline and data.endswith(b"\n"):
        data = data[:-1]
    return data


# --------------------------------------------------------------------------- what a read must hold

MAX_MESSAGE = 600  # characters beyond the file's path: user input is echoed cut to a prefix


def check_message(msg: str, *paths: Path) -> None:
    """A user error names the file (one of ``paths``: a dataset's error may rightly name another of
    its files), stays short and is one printable sentence."""
    # (plain booleans in the asserts: pytest would print the whole message, echo and all)
    named = [p for p in paths if str(p) in msg]
    ok = bool(named)
    assert ok, f"the message names none of {[str(p) for p in paths]}: {msg[:300]!r}"
    ok = len(msg) <= len(str(named[0])) + MAX_MESSAGE
    assert ok, f"a message of {len(msg)} characters (user input echoed uncut?): {msg[:300]!r}..."
    bad = sorted({c for c in msg if (unicodedata.category(c) in ("Cc", "Cs") and c not in "\n\t")
                  or c in "\u2028\u2029"})
    ok = not bad
    assert ok, f"raw control characters {bad!r} in the message: {msg[:300]!r}"


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def mismatch(v: Any, hint: Any, where: str) -> str | None:
    """Where ``v`` first differs from the type ``hint`` (a record's annotation), else None.
    A ``str`` must be writable as UTF-8 (no lone surrogate); a JSON list stands for a tuple."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return None
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return mismatch(v, rest[0], where)
        fails = [mismatch(v, a, where) for a in rest]
        return None if None in fails else f"{where}: {type(v).__name__} is none of {hint}"
    if hint is type(None):
        return None if v is None else f"{where}: must be None, got {type(v).__name__}"
    if hint is float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    elif hint is int:
        ok = isinstance(v, int) and not isinstance(v, bool)
    elif hint is str:
        if isinstance(v, str) and not _encodable(v):
            return f"{where}: a string with a lone surrogate, not writable as UTF-8: {v[:40]!r}"
        ok = isinstance(v, str)
    elif origin is list:
        if not isinstance(v, list):
            return f"{where}: must be a list, got {type(v).__name__}"
        return next((m for i, x in enumerate(v) if (m := mismatch(x, args[0], f"{where}[{i}]"))), None)
    elif origin is dict:
        if not isinstance(v, dict):
            return f"{where}: must be a dict, got {type(v).__name__}"
        return next((m for k, x in v.items() if (m := mismatch(k, args[0], f"{where} key {k!r:.40}"))
                     or (m := mismatch(x, args[1], f"{where}[{k!r:.40}]"))), None)
    elif origin is tuple:
        if not isinstance(v, (list, tuple)) or len(v) != len(args):
            want = ", ".join(getattr(a, "__name__", str(a)) for a in args)
            return f"{where}: must be a [{want}] pair, got {type(v).__name__}"
        return next((m for i, (x, a) in enumerate(zip(v, args)) if (m := mismatch(x, a, f"{where}[{i}]"))), None)
    elif origin is typing.Literal:  # a word of a vocabulary (kvaudit.core.vocabulary)
        ok = not isinstance(v, bool) and v in args
    elif dataclasses.is_dataclass(hint):
        if not isinstance(v, hint):
            return f"{where}: must be a {hint.__name__}, got {type(v).__name__}"
        return record_mismatch(v, where)
    elif isinstance(hint, type):
        ok = isinstance(v, hint)
    else:
        raise TypeError(f"no rule for {hint!r}")
    return None if ok else f"{where}: must be {getattr(hint, '__name__', hint)}, got {type(v).__name__}"


def record_mismatch(rec: Any, where: str) -> str | None:
    """The first field of a dataclass record that does not hold its annotated type."""
    hints = typing.get_type_hints(type(rec))
    for f in dataclasses.fields(rec):
        m = mismatch(getattr(rec, f.name), hints[f.name], f"{where}.{f.name}")
        if m:
            return m
    return None


def assert_typed(rec: Any, where: str) -> None:
    m = record_mismatch(rec, where)
    assert m is None, f"read, but not as documented: {m}"


def _finite(v: Any) -> bool:
    return not isinstance(v, float) or math.isfinite(v)


# --------------------------------------------------------------------------- the readers


@dataclasses.dataclass
class Reader:
    """One reader of a user-supplied file: the valid files it starts from, the one it fuzzes,
    how to read them and what a successful read must hold."""

    name: str
    fmt: str  # json | jsonl | toml | text
    target: str  # the fuzzed file, relative to the folder the files are written to
    seed: Callable[[], dict[str, bytes]]
    read: Callable[[Path], Any]
    check: Callable[[Any, Path], None] = lambda result, folder: None
    owner: str = ""  # the module the reader lives in (for the report)
    names: tuple[str, ...] = ()  # what else a message may name instead of a file (a folder)


def _files_under(d: Path, names: tuple[str, ...]) -> dict[str, bytes]:
    return {n: (d / n).read_bytes() for n in names}


@functools.cache
def _run_files() -> dict[str, bytes]:
    from kvaudit.testing.synthetic import make_run

    with tempfile.TemporaryDirectory() as tmp:
        run = make_run(Path(tmp) / "run", n_per_task=1, leak_probes=1)
        return _files_under(run, ("manifest.json", "pairs.jsonl", "audit.json"))


def _dataset_files() -> dict[str, bytes]:
    return _files_under(EXAMPLE_DATASET, ("segments.jsonl", "cases.jsonl", "dataset.json"))


def _dataset_files_unhashed() -> dict[str, bytes]:
    """The example dataset with a card that does not pin the files' hash, so that a changed
    segments.jsonl or cases.jsonl reaches their validators."""
    files = _dataset_files()
    card = json.loads(files["dataset.json"])
    card.pop("content_hash", None)
    files["dataset.json"] = json.dumps(card).encode()
    return files


@functools.cache
def _workload_files() -> dict[str, bytes]:
    from kvaudit.generators.workload import WorkloadParams, generate, workload_lines

    params = WorkloadParams(requests=6, documents=12, queries=3, docs_per_request=3)
    return {"workload.jsonl": "".join(workload_lines(generate(params), params)).encode()}


_PROSE = ("The river market opened before the winter council met. Traders from the mountain "
          "village brought stone and music to the city library.\n\nThe bridge was rebuilt twice.")


def _corpus_files() -> dict[str, bytes]:
    rows = [{"text": _PROSE, "id": 1, "meta": {"lang": "en", "tags": ["a", "b"]}},
            {"text": "A second row of text about the harvest road.", "id": 2},
            {"text": "   ", "id": 3}]
    return {"corpus/notes.jsonl": "".join(json.dumps(r) + "\n" for r in rows).encode(),
            "corpus/intro.txt": _PROSE.encode()}


def _corpus_text_files() -> dict[str, bytes]:
    return {"corpus/intro.txt": _PROSE.encode(), "corpus/more.md": b"# More\n\nThe school road.\n"}


_CTXS = [
    {"question": "Who keeps the lighthouse?", "answers": ["Tom Eckert"], "ctxs": [
        {"title": "Harrow Point", "text": "Tom Eckert keeps the lighthouse.", "is_supporting": True},
        {"title": "Blue Canyon", "text": "A thriller from 1993.", "is_supporting": False}]},
    {"question": "When was Oren Pask born?", "answers": ["1950"], "ctxs": [
        {"title": "Oren Pask", "text": "Oren Pask was born in 1950.", "has_answer": True},
        {"title": None, "text": "Velmora is a town."}]},
]
_LONGBENCH = [
    {"input": "Who keeps the lighthouse?", "answers": ["Tom Eckert"], "length": 12,
     "context": "Passage 1:\nTom Eckert keeps the lighthouse.\nPassage 2:\nA thriller from 1993."},
    {"input": "Which town?", "answers": "Velmora", "context": "Velmora is a town.\n\nIt has a bridge."},
]


def _jsonl(rows: list) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


_KV_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "hidden_size": 7168, "head_dim": 56, "kv_lora_rank": 512,
    "qk_rope_head_dim": 64, "torch_dtype": "bfloat16",
    "text_config": {"num_hidden_layers": 30, "num_attention_heads": 8, "hidden_size": 1024},
}


@functools.cache
def _simulation_run_files() -> dict[str, bytes]:
    """A synthetic run beside the simulation.json ``kvaudit simulate`` writes for a small
    workload (the report and the gate read it from the run directory)."""
    from kvaudit.core.jsonio import dump_json
    from kvaudit.core.trace import read_trace
    from kvaudit.simulator.engine import SimConfig, simulate
    from kvaudit.simulator.kv_bytes import PRESETS

    with tempfile.TemporaryDirectory() as tmp:
        w = Path(tmp) / "workload.jsonl"
        w.write_bytes(_workload_files()["workload.jsonl"])
        sim = simulate(read_trace(w), SimConfig(capacities=[10**6, 10**9], labels=["1MB", "1GB"],
                                                model=PRESETS["smollm2-135m"], windows=2))
    return {**_run_files(), "simulation.json": dump_json(sim).encode()}


def _read_simulation(d: Path) -> Any:
    from kvaudit.reports.analysis import load_run

    return load_run(d)


def _check_simulation(run: Any, d: Path) -> None:
    from types import SimpleNamespace

    from kvaudit.reports.analysis import Analysis

    assert run.simulation is None or isinstance(run.simulation, dict)
    # what the gate's hit_rate check (source "simulated") reads of it; Analysis' own
    # statistics are not needed for that, so a stand-in holds the run
    try:
        rates = Analysis.simulated_hit_rates(SimpleNamespace(run=run))
    except USER_ERRORS as e:  # a rate outside [0, 1] or not a number: refused, naming file and field
        check_message(str(e), d / "simulation.json")
        assert "token_hit_rate" in str(e)
        return
    assert all(isinstance(k, str) and isinstance(v, float) and 0 <= v <= 1 for k, v in rates.items())


def _generate_corpus(d: Path) -> Any:
    from kvaudit.generators import corpus
    from kvaudit.generators.knobs import ReuseKnobs

    return corpus.generate(d / "corpus", knobs=ReuseKnobs(cases=4))


def _check_generated(result: Any, d: Path) -> None:
    _check_import(result, d)
    segments, cases, params, counts = result
    for s in counts["skipped_files"]:
        check_message(f"{s['file']}: {s['reason']}", Path(s["file"]))


def _read_dataset(d: Path) -> Any:
    from kvaudit.core.dataset_format import read_dataset

    return read_dataset(d)


def _check_dataset(ds: Any, d: Path) -> None:
    from kvaudit.core.dataset_format import CARD_FILE, read_dataset, write_dataset

    assert_typed(ds, "dataset")
    for c in ds.cases:
        if c.canary is not None:
            assert isinstance(c.canary.get("value"), str), f"case {c.id}: canary without a string value"
    # what was read is a dataset kvaudit can write and read back
    out = d / "written"
    card = dataclasses.replace(ds.card)
    write_dataset(out, ds.segments.values(), ds.cases, card)
    again = read_dataset(out)
    assert [c.id for c in again.cases] == [c.id for c in ds.cases]
    assert (out / CARD_FILE).exists()


def _read_pairs(d: Path) -> Any:
    from kvaudit.core.run_format import read_pairs

    return read_pairs(d)


def _check_pairs(pairs: list, d: Path) -> None:
    from kvaudit.core.jsonio import dump_jsonl
    from kvaudit.core.run_format import pair_to_dict

    for i, p in enumerate(pairs):
        assert_typed(p, f"pairs[{i}]")
    dump_jsonl(pair_to_dict(p) for p in pairs).encode("utf-8")  # a resumed run writes them back


def _read_manifest(d: Path) -> Any:
    from kvaudit.core.manifest import read_manifest

    return read_manifest(d)


def _check_manifest(m: Any, d: Path) -> None:
    from kvaudit.core.jsonio import dump_json
    from kvaudit.core.manifest import Manifest

    assert_typed(m, "manifest")
    text = dump_json(m.to_dict())  # a resumed run writes the manifest back ...
    text.encode("utf-8")
    again = Manifest.from_dict(json.loads(text), "again")  # ... and reads what it wrote
    assert json.dumps(again.to_dict(), sort_keys=True) == json.dumps(m.to_dict(), sort_keys=True)


def _read_audit(d: Path) -> Any:
    from kvaudit.core.audit_format import read_audit

    return read_audit(d)


def _check_audit(a: Any, d: Path) -> None:
    from kvaudit.core.audit_format import AuditRecord
    from kvaudit.core.jsonio import dump_json

    assert_typed(a, "audit")
    text = dump_json(a.to_dict())
    text.encode("utf-8")
    AuditRecord.from_dict(json.loads(text), "again")


def _read_policy(d: Path) -> Any:
    from kvaudit.reports.policy import load_policy

    return load_policy(d / "policy.toml")


_SPEED_POLICY = (b'arm = "candidate"\n[[delta]]\ngroup = "overall"\nmin_lower_bound = -2.0\n'
                 b'[[speed]]\nname = "TTFT"\nmetric = "ttft"\nmax_ratio = 1.05\n'
                 b'[[speed]]\nmetric = "time_per_output_token"\nmin_speedup = 1.3\n[audit]\nrequire_passed = true\n')
_ENGINES = (b'[baseline]\nbackend = "vllm"\nmodel = "smollm2"\ndtype = "bfloat16"\nmax_new_tokens = 24\n'
            b'[baseline.options]\nmax_model_len = 4096\n[candidate]\nbackend = "vllm"\nmodel = "smollm2"\n'
            b'dtype = "bfloat16"\nchange = "fp8 KV cache"\ndeclares = ["kv_cache_dtype"]\n'
            b'[candidate.options]\nkv_cache_dtype = "fp8"\nspeculative_config = {method = "ngram"}\n')


def _read_engines(d: Path) -> Any:
    from kvaudit.runners.engines_file import read_engines

    return read_engines(d / "engines.toml")


def _check_engines(e: Any, d: Path) -> None:
    # (assert_typed reads tuple[str, ...] as a pair: the fields are checked here instead)
    assert isinstance(e.change, str) and e.change.strip() and e.declares and all(isinstance(k, str) and k for k in e.declares)
    assert e.baseline.as_dict() != e.candidate.as_dict()
    for spec in (e.baseline, e.candidate, e.candidate_off()):
        assert isinstance(spec.options, dict) and 1 <= spec.max_new_tokens <= 100_000


def _check_policy(pol: Any, d: Path) -> None:
    assert_typed(pol, "policy")
    assert 0 < pol.confidence < 1 and 0 <= pol.min_icc < 1, (pol.confidence, pol.min_icc)
    for c in pol.checks:
        bad = {k: v for k, v in c.params.items() if not _finite(v)}
        assert not bad, f"check {c.name!r:.60}: a threshold that is not a finite number: {bad}"
        assert c.missing in ("error", "fail", "skip")


def _read_trace(d: Path) -> Any:
    from kvaudit.core.trace import read_trace

    return read_trace(d / "workload.jsonl")


def _check_trace(trace: Any, d: Path) -> None:
    from kvaudit.core import trace as tr

    n = trace.n_requests
    assert n > 0 and trace.offsets.dtype == np.int64 and trace.tokens.dtype == np.int64
    assert trace.offsets[0] == 0 and np.all(np.diff(trace.offsets) > 0)
    assert len(trace.kind) == len(trace.content) == len(trace.tokens) == trace.offsets[-1]
    assert np.all(trace.tokens > 0) and set(np.unique(trace.kind)) <= {0, 1, 2}
    assert np.all(trace.request_tokens() > 0), "prompt tokens overflow int64"
    trace.summary()
    # the careful reader (the reference; what a machine without pyarrow runs) reads the same
    # trace, but for the one documented difference: pyarrow skips the fields the format ignores
    # unread, so a value there Python's parser refuses passes the fast reader only
    try:
        careful = tr._read_careful(d / "workload.jsonl")
    except USER_ERRORS as e:
        ok = "nested too deeply" in str(e) or "unreadable JSON value" in str(e)
        assert ok, f"the fast reader read what the careful one refuses: {str(e)[:200]!r}"
        return
    for f in ("offsets", "kind", "content", "tokens"):
        assert np.array_equal(getattr(careful, f), getattr(trace, f)), f"fast and careful readers differ in {f}"
    assert np.array_equal(careful.timestamps, trace.timestamps, equal_nan=True), "timestamps differ"
    assert careful.request_ids == trace.request_ids


def _read_corpus(d: Path) -> Any:
    from kvaudit.generators.corpus_files import load_corpus

    skipped_files: list = []
    docs = load_corpus(d / "corpus", skipped_files=skipped_files)
    return docs, skipped_files


def _check_corpus(result: Any, d: Path) -> None:
    from kvaudit.generators.corpus_files import SourceDoc, load_corpus

    docs, skipped_files = result
    for i, doc in enumerate(docs):
        assert isinstance(doc, SourceDoc)
        assert_typed(doc, f"docs[{i}]")
        assert doc.text.strip(), f"docs[{i}] is blank"
    for s in skipped_files:
        assert set(s) == {"file", "kind", "reason"} and all(isinstance(v, str) for v in s.values())
        check_message(f"{s['file']}: {s['reason']}", Path(s["file"]))
        # --strict refuses the same file, naming it
        with pytest.raises(USER_ERRORS) as e:
            load_corpus(d / "corpus", strict=True)
        check_message(str(e.value), Path(skipped_files[0]["file"]))


def _import_reader(fmt: str, name: str) -> Callable[[Path], Any]:
    def read(d: Path) -> Any:
        from kvaudit.generators import importers

        return importers.generate(d / name, fmt)

    return read


def _check_import(result: Any, d: Path) -> None:
    from kvaudit.core.dataset_format import DatasetCard, read_dataset, write_dataset

    segments, cases, params, counts = result
    for sid, s in segments.items():
        assert_typed(s, f"segments[{sid}]")
    for i, c in enumerate(cases):
        assert_typed(c, f"cases[{i}]")
    # what the importer built is a dataset kvaudit writes and reads back
    used = {s for c in cases for s in c.segment_ids}
    write_dataset(d / "out", [segments[s] for s in segments if s in used], cases,
                  DatasetCard("import", params=params, counts=counts))
    assert len(read_dataset(d / "out").cases) == len(cases)


def _read_kv_config(d: Path) -> Any:
    from kvaudit.simulator.kv_bytes import resolve_model

    return resolve_model(str(d / "config.json"))


def _check_kv_config(shape: Any, d: Path) -> None:
    assert_typed(shape, "shape")
    assert shape.layers > 0 and shape.kv_heads > 0 and shape.head_dim > 0 and shape.latent_dim >= 0
    assert 0 < shape.bytes_per_token < 2**63, shape.bytes_per_token
    shape.to_dict()


_REQUEST_LOG = [
    {"custom_id": "a", "body": {"messages": [
        {"role": "system", "content": "You are a support bot."},
        {"role": "user", "content": "Doc: the refund policy is 30 days."},
        {"role": "user", "content": [{"type": "text", "text": "How long?"}]}]}},
    {"messages": [{"role": "system", "content": "You are a support bot."},
                  {"role": "user", "content": "Doc: shipping takes 5 days."},
                  {"role": "user", "content": "And shipping?"}], "created": 7},
]


def _read_request_log(d: Path) -> Any:
    """``kvaudit generate workload --from-log`` on the log, cut by message and by a regex, with a
    tight --max-pieces (tokens: whitespace words)."""
    from kvaudit.generators.workload_log import import_log

    def words(text: str) -> int:
        return len(text.split())

    return [import_log(d / "log.jsonl", split, words, keep_text=True, max_pieces=64)
            for split in ("messages", r"regex:\n|Doc:")]


def _check_request_log(results: list, d: Path) -> None:
    from kvaudit.core.trace import read_trace
    from kvaudit.generators.workload_log import iter_lines

    for k, res in enumerate(results):
        for s in res.skipped:  # each skipped line is named in one printable line
            check_message(f"{d / 'log.jsonl'}, line {s['line']}: skipped: {s['reason']}", d / "log.jsonl")
        # what was read is a workload the simulator reads back, request for request
        out = d / f"w{k}.jsonl"
        out.write_text("".join(iter_lines(res)), encoding="utf-8")
        assert read_trace(out).n_requests == len(res.requests) > 0
        assert all(math.isfinite(v) for v in res.card.values() if isinstance(v, float))


def _replay_files() -> dict[str, bytes]:
    """A replay directory as `kvaudit replay` leaves it: its config and two request records."""
    from dataclasses import asdict

    from kvaudit.core.replay_format import ReplayConfig, RequestRecord

    cfg = ReplayConfig(workload="workload.jsonl", workload_hash="ab" * 8, policy="segment", budget_bytes=10**6,
                       model="smollm2", backend="vllm", concurrency=2, max_new_tokens=8, n_requests=2,
                       arrivals="poisson:2.0:0", schedule="arrivals", kv_space_bytes=10**7)
    recs = [RequestRecord(index=i, request_id=f"r{i}", wave=i, session=0, n_prompt_tokens=100, head_tokens=20,
                          segment_tokens=60, ttft_s=0.1 + i, warmup_s=0.01, head_s=0.0, queue_s=0.0,
                          prefix_cache_tokens=0, segment_hit_tokens=60 * i, warmup_tokens=60 * (1 - i),
                          tokens_computed=40, evictions=0.0, wall_s=0.2, ids_hash="cd" * 8,
                          piece_ids=["h", "d1", "q"], piece_tokens=[20, 60, 20],
                          piece_kinds=["prefix", "document", "question"], engine_ttft_s=0.09, client_request_ttft_s=0.095,
                          arrival_s=0.5 * i, overflow_tokens=0, finish_s=1.0 + i, decode_tokens=7, decode_s=0.07,
                          piece_warmed_s=[0.05, None if i else 0.06, None], preemptions=i)
            for i in range(2)]
    return {"replay_config.json": json.dumps(asdict(cfg)).encode(), "requests.jsonl": _jsonl([asdict(r) for r in recs])}


def _read_replay(d: Path) -> Any:
    from kvaudit.core.replay_format import ReplayDir

    r = ReplayDir(d)
    return r.read_config(), r.read_requests()


def _read_replay_gz(d: Path) -> Any:
    """The request records gzipped, as the GPU results folders keep them (read by the same reader)."""
    import gzip

    from kvaudit.core.replay_format import ReplayDir, read_request_records

    gz = d / "requests.jsonl.gz"
    gz.write_bytes(gzip.compress((d / "requests.jsonl").read_bytes()))
    return ReplayDir(d).read_config(), read_request_records(gz)


def _check_replay(result: Any, d: Path) -> None:
    from kvaudit.replay.summary import summarise

    cfg, recs = result
    assert_typed(cfg, "replay_config")
    for i, r in enumerate(recs):
        assert_typed(r, f"request {i}")
    if recs:  # what `kvaudit report` computes from them
        summarise(recs, cfg, {"block_size": 16, "bytes_per_token": 1000, "kv_tokens": 10_000, "stores_heads": False})


def _sweep_files() -> dict[str, bytes]:
    """A load sweep (`kvaudit replay --rate 2`): sweep.json beside one finished replay."""
    from kvaudit.core.replay_format import ReplayDir

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for rel, raw in _replay_files().items():
            (d / rel).write_bytes(raw)
        cfg, recs = _read_replay(d)
        from kvaudit.replay.summary import summarise

        ReplayDir(d).write_summary(summarise(recs, cfg, {"block_size": 16, "bytes_per_token": 1000,
                                                         "kv_tokens": 10_000, "stores_heads": True}))
        files = {f"rate-2/{f.name}": f.read_bytes() for f in d.iterdir() if f.is_file()}
    files["sweep.json"] = json.dumps({"policy": "segment", "schedule": "arrivals",
                                      "loads": [{"rate": 2.0, "dir": "rate-2",
                                                 "replications": [{"seed": 0, "dir": "rate-2"}]}]}).encode()
    return files


def _summary_files() -> dict[str, bytes]:
    """A load sweep whose one replay's summary (``rate-2/replay.json``, the fuzzed file) also holds
    what a longer replay's has: TTFT growth, a length bin, the client's overhead split."""
    files = _sweep_files()
    s = json.loads(files["rate-2/replay.json"])
    s["ttft_growth"] = {"requests": 200, "slope": 0.01, "limit": 0.02, "past_saturation": False}
    s["ttft_by_length"] = [{"tokens_low": 100, "tokens_high": 100, "requests": 2, "ttft_p50_s": 0.6}]
    s["client_overhead_s"]["after_engine"] = {"p50": 0.004, "p95": 0.005}
    s["served"] = {"host": "gpu-1", "finished_utc": "2026-12-05T07:00:00+00:00"}
    files["rate-2/replay.json"] = json.dumps(s).encode()
    return files


def _check_summary(result: Any, d: Path) -> None:
    """What `kvaudit report` makes of an accepted summary: the page renders."""
    from kvaudit.reports.replay_report import render

    _check_sweep(result, d)
    render(result)


def _read_sweep(d: Path) -> Any:
    from kvaudit.reports.replay_report import build

    return build([d], slo_ttft_s=1.0)


def _check_sweep(result: Any, d: Path) -> None:
    for sw in result["sweeps"]:
        assert all(isinstance(x["rate"], float) for x in sw["loads"])


READERS: dict[str, Reader] = {r.name: r for r in (
    Reader("dataset_segments", "jsonl", "segments.jsonl", _dataset_files_unhashed, _read_dataset, _check_dataset,
           "kvaudit.core.dataset_format"),
    Reader("dataset_cases", "jsonl", "cases.jsonl", _dataset_files_unhashed, _read_dataset, _check_dataset,
           "kvaudit.core.dataset_format"),
    Reader("dataset_card", "json", "dataset.json", _dataset_files, _read_dataset, _check_dataset,
           "kvaudit.core.dataset_format"),
    Reader("pairs", "jsonl", "pairs.jsonl", _run_files, _read_pairs, _check_pairs, "kvaudit.core.run_format"),
    Reader("manifest", "json", "manifest.json", _run_files, _read_manifest, _check_manifest,
           "kvaudit.core.manifest"),
    Reader("audit", "json", "audit.json", _run_files, _read_audit, _check_audit, "kvaudit.core.audit_format"),
    Reader("policy", "toml", "policy.toml",
           lambda: {"policy.toml": (PACKAGE / "reports" / "policy_default.toml").read_bytes()},
           _read_policy, _check_policy, "kvaudit.reports.policy"),
    Reader("policy_speed", "toml", "policy.toml", lambda: {"policy.toml": _SPEED_POLICY},
           _read_policy, _check_policy, "kvaudit.reports.policy"),
    Reader("engines_file", "toml", "engines.toml", lambda: {"engines.toml": _ENGINES},
           _read_engines, _check_engines, "kvaudit.runners.engines_file"),
    Reader("workload", "jsonl", "workload.jsonl", _workload_files, _read_trace, _check_trace,
           "kvaudit.core.trace"),
    Reader("corpus_jsonl", "jsonl", "corpus/notes.jsonl", _corpus_files, _read_corpus, _check_corpus,
           "kvaudit.generators.corpus_files"),
    Reader("corpus_text", "text", "corpus/intro.txt", _corpus_text_files, _read_corpus, _check_corpus,
           "kvaudit.generators.corpus_files"),
    Reader("corpus_generate", "jsonl", "corpus/notes.jsonl", _corpus_files, _generate_corpus, _check_generated,
           "kvaudit.generators.corpus", names=("corpus",)),
    Reader("simulation_json", "json", "simulation.json", _simulation_run_files, _read_simulation,
           _check_simulation, "kvaudit.reports.analysis"),
    Reader("import_ctxs", "json", "musique.json", lambda: {"musique.json": json.dumps(_CTXS).encode()},
           _import_reader("ctxs", "musique.json"), _check_import, "kvaudit.generators.importers"),
    Reader("import_ctxs_jsonl", "jsonl", "musique.jsonl", lambda: {"musique.jsonl": _jsonl(_CTXS)},
           _import_reader("ctxs", "musique.jsonl"), _check_import, "kvaudit.generators.importers"),
    Reader("import_longbench", "jsonl", "longbench.jsonl", lambda: {"longbench.jsonl": _jsonl(_LONGBENCH)},
           _import_reader("longbench", "longbench.jsonl"), _check_import, "kvaudit.generators.importers"),
    Reader("replay_config", "json", "replay_config.json", _replay_files, _read_replay, _check_replay,
           "kvaudit.core.replay_format"),
    Reader("replay_requests", "jsonl", "requests.jsonl", _replay_files, _read_replay, _check_replay,
           "kvaudit.core.replay_format"),
    Reader("replay_requests_gz", "jsonl", "requests.jsonl", _replay_files, _read_replay_gz, _check_replay,
           "kvaudit.core.replay_format"),
    Reader("replay_sweep", "json", "sweep.json", _sweep_files, _read_sweep, _check_sweep,
           "kvaudit.reports.replay_report"),
    Reader("replay_summary", "json", "rate-2/replay.json", _summary_files, _read_sweep, _check_summary,
           "kvaudit.core.replay_summary_format"),
    Reader("kv_config", "json", "config.json", lambda: {"config.json": json.dumps(_KV_CONFIG).encode()},
           _read_kv_config, _check_kv_config, "kvaudit.simulator.kv_bytes"),
    Reader("request_log", "jsonl", "log.jsonl", lambda: {"log.jsonl": _jsonl(_REQUEST_LOG)}, _read_request_log,
           _check_request_log, "kvaudit.generators.workload_log"),
)}


def seed_files(name: str) -> dict[str, bytes]:
    return dict(READERS[name].seed())


def attempt(name: str, recipe: Bytes | Mutation) -> None:
    """Write the reader's valid files with its target replaced by the fuzz input into a fresh
    folder and read them. Returns when the property holds; raises otherwise (AssertionError for a
    broken promise, or the unexpected exception itself)."""
    reader = READERS[name]
    files = seed_files(name)
    files[reader.target] = render(reader.fmt, files[reader.target], recipe)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for rel, data in files.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(data)
        try:
            result, message = reader.read(d), None
        except USER_ERRORS as e:
            message = str(e)
        if message is not None:  # checked outside the handler: no chained (echoing) traceback
            check_message(message, d / reader.target, *(d / rel for rel in (*files, *reader.names)))
        else:
            reader.check(result, d)


# --------------------------------------------------------------------------- the fast slice

FUZZ = settings(max_examples=40, deadline=timedelta(seconds=10), derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# Regressions every reader runs first: the 5000-digit integer and the deep nesting in the
# document (a JSONL record) and in its first value, and the other hostile tokens where they bit.
EXAMPLES: list[Bytes | Mutation] = [
    Mutation(op="none"),  # the valid file reads
    Mutation(node=0, raw=HUGE_INT),  # the document (a JSONL record) is a 5000-digit integer
    Mutation(node=1, raw=HUGE_INT),  # ... its first value is
    Mutation(node=0, raw=DEEP_ARRAY),  # arrays nested 100000 deep
    Mutation(node=1, raw=DEEP_ARRAY),
    Mutation(node=1, raw=MEDIUM_ARRAY),  # 900 deep: parses, then recursion elsewhere
    Mutation(node=1, raw=BIG_INT),  # 4000 digits: parses, fits nothing
    Mutation(node=2, raw='"a\\ud800"'),  # a lone surrogate: not writable as UTF-8
    Mutation(node=1, raw=LONG_STRING),  # echoed in a message, it must be cut
    Mutation(op="none", truncate=-2),  # the last byte cut
    Bytes(b"\xff\xfe{}"),
    Bytes(b""),
]

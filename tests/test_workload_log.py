"""`kvaudit generate workload --from-log`: chat, completions and plain logs as workloads, malformed
lines named (or refused with --strict), the reuse card, and a fuzzed reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvaudit.cli import main
from kvaudit.core.errors import DatasetError, KvauditError
from kvaudit.core.trace import read_trace
from kvaudit.generators.workload_log import import_log, read_log, reuse_card

SYSTEM = {"role": "system", "content": "You are a support bot."}
REFUND = {"role": "user", "content": "Doc: the refund policy is 30 days."}


def _words(text: str) -> int:
    return len(text.split())


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) and r.startswith("{") else json.dumps(r)) + "\n" for r in rows))
    return path


def test_a_chat_log_with_a_malformed_line_is_read_and_the_line_named(tmp_path, capsys):
    log = _write(tmp_path / "chat.jsonl", [
        {"custom_id": "a", "body": {"messages": [SYSTEM, REFUND, {"role": "user", "content": "How long?"}]}},
        '{"messages": [{"role": "user", "content": "cut off',
        {"messages": [SYSTEM, {"role": "user", "content": "Doc: shipping takes 5 days."}, REFUND,
                      {"role": "user", "content": [{"type": "text", "text": "And shipping?"}]}], "created": 7},
    ])
    out = tmp_path / "w.jsonl"
    assert main(["generate", "workload", "--from-log", str(log), "--out", str(out)]) == 0
    cap = capsys.readouterr()
    assert f"{log}, line 2: skipped: not JSON" in cap.err
    trace = read_trace(out)  # the simulator and replay read it
    assert trace.n_requests == 2
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [p["kind"] for p in lines[1]["pieces"]] == ["prefix", "document", "document", "question"]
    assert lines[0]["pieces"][1]["id"] == lines[1]["pieces"][2]["id"]  # same text, same id
    assert lines[1]["timestamp"] == 7 and "text" not in lines[0]["pieces"][0]
    card = json.loads((tmp_path / "w.card.json").read_text())
    assert card["skipped"] == [{"line": 2, "reason": card["skipped"][0]["reason"]}] and card["requests"] == 2
    # line 2 of w repeats the system prompt (reachable by prefix) and the refund document behind
    # another document (not reachable)
    assert 0 < card["non_prefix_share_of_repeated"] < 1
    assert main(["generate", "workload", "--from-log", str(log), "--out", str(out), "--strict"]) == 2
    assert f"{log}, line 2: not JSON" in capsys.readouterr().err


def test_completions_and_plain_prompts_split_by_delimiter_and_regex(tmp_path):
    log = _write(tmp_path / "p.jsonl", [{"prompt": "sys##doc one##doc two##question?"}, "sys##doc two##q2",
                                        {"text": "just a question"}])
    res = import_log(log, "delimiter:##", _words)
    kinds = [[p["kind"] for p in r["pieces"]] for r in res.requests]
    assert kinds == [["prefix", "document", "document", "question"], ["prefix", "document", "question"], ["question"]]
    assert res.requests[0]["pieces"][2]["id"] == res.requests[1]["pieces"][1]["id"]
    res = import_log(log, r"regex:#{2}", _words, keep_text=True)
    assert res.requests[0]["pieces"][1]["text"] == "doc one"
    with pytest.raises(KvauditError, match="capturing groups"):
        import_log(log, "regex:(#)", _words)
    with pytest.raises(DatasetError, match="line 1: --split messages needs chat requests"):
        import_log(log, "messages", _words, strict=True)


def test_the_card_separates_prefix_reachable_from_non_prefix_repeats():
    def req(*ids):
        return {"pieces": [{"id": i, "tokens": 10} for i in ids]}

    card = reuse_card([req("S", "A", "B", "q1"), req("S", "A", "C", "q2"), req("S", "C", "A", "q3")])
    # request 2: S, A reachable (20); request 3: S reachable, C and A repeated behind another order (20)
    assert card["repeated_tokens"] == 50 and card["prefix_reachable_tokens"] == 30
    assert card["non_prefix_share_of_repeated"] == pytest.approx(20 / 50)


def test_a_log_with_nothing_readable_is_refused_naming_the_first_reason(tmp_path):
    log = _write(tmp_path / "bad.jsonl", [{"model": "x"}, [1, 2]])
    with pytest.raises(DatasetError, match=r"no request could be read \(2 lines skipped; first: line 1: no prompt"):
        read_log(log, "messages")


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(
                         ["messages", "role", "content", "prompt", "text", "body", "type", "created", "id"]), c,
                         max_size=5), max_leaves=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_json, min_size=1, max_size=4), split=st.sampled_from(["messages", "delimiter:,", "regex:a+"]))
def test_fuzzed_logs_give_a_workload_or_a_named_error(tmp_path, rows, split):
    log = tmp_path / "fuzz.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    try:
        res = import_log(log, split, _words)
    except DatasetError as e:
        assert str(log) in str(e)
        return
    for r in res.requests:
        assert r["pieces"] and all(p["tokens"] >= 1 and p["id"].startswith("c-") for p in r["pieces"])
    assert len(res.requests) + len(res.skipped) == sum(1 for _ in rows)

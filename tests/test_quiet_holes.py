"""Issue 12, finding 10: two quiet holes.

* The Boxoffice canary guard must see a canary (or decoy) name inside a document even when
  punctuation follows it ("Name." / "Name's"): such a leak probe measures nothing.
* A corrupt over-count of cache hits must reach the report's error path (a DatasetError naming
  pairs.jsonl and the field), not be clamped into a plausible hit rate.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from kvaudit.core.errors import DatasetError
from kvaudit.core.hit_rate import run_hit_rate, run_segment_hit_rate
from kvaudit.generators import boxoffice, corpus
from kvaudit.generators.boxoffice_world import World
from kvaudit.generators.knobs import ReuseKnobs
from kvaudit.generators.names import NameGen
from kvaudit.reports.analysis import Analysis, load_run
from kvaudit.testing.synthetic import make_pairs, make_run

# --------------------------------------------------------------------------- canary guard


@pytest.mark.parametrize("word_in", [boxoffice._word_in, corpus._word_in], ids=["boxoffice", "corpus"])
@pytest.mark.parametrize("hay", [
    "It was directed by Bako Tarlin.", "Bako Tarlin's first film.", "(Bako Tarlin) won.",
    "starring Bako Tarlin, twice", "Bako Tarlin", "BAKO TARLIN!", "see Bako\nTarlin; again",
    "\"Bako Tarlin\"", "Bako Tarlin-like",
])
def test_word_in_sees_a_name_followed_or_preceded_by_punctuation(word_in, hay):
    assert word_in("Bako Tarlin", hay)


@pytest.mark.parametrize("word_in", [boxoffice._word_in, corpus._word_in], ids=["boxoffice", "corpus"])
@pytest.mark.parametrize("hay", [
    "Bako Tarlinsen is a film actor.", "Abako Tarlin is a film actor.", "Bako_Tarlin",
    "Bako Tar lin", "Tarlin Bako", "",
])
def test_word_in_still_needs_whole_words(word_in, hay):
    assert not word_in("Bako Tarlin", hay)


def test_boxoffice_word_in_on_titles_is_unchanged():
    # the compare family asks whether one title sits inside another: plain words, same answers
    assert boxoffice._word_in("The Kova Bridge", "Return to The Kova Bridge")
    assert not boxoffice._word_in("The Kova Bridge", "The Kova Bridges")
    assert not boxoffice._word_in("", "anything")


def _decoys(world: World, k: int = boxoffice.N_DECOYS) -> list[str]:
    names = NameGen(random.Random("test-decoys"))
    names.used.update(p.name for p in world.people)
    return [names.person() for _ in range(k)]


def _leak_draft(world: World, film, name: str, decoys: list[str]) -> boxoffice.Draft:
    d = boxoffice.Draft("leak_probe", "name", (), [film.id],
                        {"name": name, "decoys": decoys, "question": boxoffice.LEAK_QUESTIONS[0]})
    d.asked = boxoffice.ask(world, d)
    return d


def test_verify_rejects_a_canary_named_in_a_document_before_a_full_stop():
    world = World(0, 20)
    film = world.films[0]
    lead = world.by_id[film.lead].name
    text = world.doc(film.id).text
    assert f"starring {lead}." in text and f" {lead} " not in f" {text} "  # only as "Lead."
    d = _leak_draft(world, film, lead, _decoys(world))
    with pytest.raises(boxoffice.GeneratorBug, match="appears in a document"):
        boxoffice.verify(world, d, d.asked)
    # a decoy the model could read off a document breaks the probe's exchangeability too
    fresh = _decoys(world, boxoffice.N_DECOYS + 1)
    d = _leak_draft(world, film, fresh[0], [lead, *fresh[2:]])
    with pytest.raises(boxoffice.GeneratorBug, match="appears in a document"):
        boxoffice.verify(world, d, d.asked)
    # and a clean probe still passes
    d = _leak_draft(world, film, fresh[0], fresh[1:])
    boxoffice.verify(world, d, d.asked)


def test_generator_refuses_a_leak_probe_whose_canary_a_document_states(monkeypatch):
    real = boxoffice.Drafter._leak_probe

    def leaky(self, rng, target):  # the canary is the lead of a film in the prompt: "starring X."
        d = real(self, rng, target)
        d.extra["name"] = self.w.by_id[self.w.by_id[d.order[0]].lead].name
        return d

    monkeypatch.setattr(boxoffice.Drafter, "_leak_probe", leaky)
    with pytest.raises(boxoffice.GeneratorBug, match="appears in a document"):
        boxoffice.generate(seed=0, knobs=ReuseKnobs(cases=4), families="leak_probe=1")


def test_generated_leak_probes_never_name_their_canary_or_decoys_in_a_document():
    segments, cases, _ = boxoffice.generate(seed=3, knobs=ReuseKnobs(cases=60),
                                            families="single_doc=1,leak_probe=2")
    probes = [c for c in cases if c.task == "leak_probe"]
    assert probes
    for c in probes:
        for n in (c.canary["value"], *c.canary["decoys"]):
            assert not any(boxoffice._word_in(n, segments[s].text) for s in c.segment_ids)


# --------------------------------------------------------------------------- hit-rate over-counts


def _pair(n, hit, arm="reuse", case_id="c0"):
    return SimpleNamespace(case_id=case_id, n_prompt_tokens=n, segment_spans=[(5, 5 + n // 2)],
                           arms={arm: SimpleNamespace(tokens_reused=hit, cache_hit_tokens=hit)})


def test_run_hit_rate_raises_on_more_hits_than_prompt_tokens():
    assert run_hit_rate([_pair(100, 100)]).rate == 1.0
    with pytest.raises(ValueError, match=r"case 'bad'.*cache_hit_tokens 101"):
        run_hit_rate([_pair(100, 40), _pair(100, 101, case_id="bad")])
    with pytest.raises(ValueError, match="cache_hit_tokens -1"):
        run_hit_rate([_pair(100, -1)])


def test_engine_prefix_cache_arm_still_has_a_prompt_hit_rate():
    # an engine prefix cache reports cached tokens < prompt tokens (the last token is computed)
    pairs = [_pair(100, 96, arm="prefix_cache"), _pair(300, 0, arm="prefix_cache")]
    assert run_hit_rate(pairs, "prefix_cache").rate == pytest.approx(96 / 400)


def _consistent(pairs):
    """make_pairs' segment spans hold the tokens its reuse arms load (as a real run's do)."""
    for p in pairs:
        n = max(a.tokens_reused for a in p.arms.values())
        p.segment_spans = [(10, 10 + n)] if n else p.segment_spans
    return pairs


def test_report_hit_rate_over_count_is_a_dataset_error_naming_file_and_field(tmp_path):
    pairs = _consistent(make_pairs(n_per_task=3, leak_probes=0))
    for p in pairs:  # an engine prefix-cache arm alongside: cached < prompt tokens
        r = p.arms["recompute"]
        p.arms["prefix_cache_cold"] = type(r)(**{**vars(r), "arm": "prefix_cache_cold",
                                                 "tokens_reused": p.n_prompt_tokens - 1,
                                                 "cache_hit_tokens": p.n_prompt_tokens - 1})
    good = Analysis(load_run(make_run(tmp_path / "good", pairs)))
    assert good.hit_rate("reuse") == pytest.approx(0.9, abs=0.01)
    assert good.hit_rate("prefix_cache_cold") == pytest.approx(1.0, abs=0.01)
    assert good.hit_rate("prefix_cache_cold", "segment") is None

    bad = pairs[1]
    bad.arms["reuse"].cache_hit_tokens = bad.n_prompt_tokens + 7
    an = Analysis(load_run(make_run(tmp_path / "bad", pairs)))
    with pytest.raises(DatasetError) as e:
        an.hit_rate("reuse")
    msg = str(e.value)
    assert str(tmp_path / "bad" / "pairs.jsonl") in msg and "arm 'reuse'" in msg
    assert "cache_hit_tokens" in msg and bad.case_id in msg and str(bad.n_prompt_tokens + 7) in msg


def test_run_segment_hit_rate_raises_on_more_reused_than_segment_tokens():
    assert run_segment_hit_rate([_pair(100, 50)]).rate == 1.0  # segments hold 50 tokens
    with pytest.raises(ValueError, match=r"case 'bad'.*tokens_reused 51"):
        run_segment_hit_rate([_pair(100, 50), _pair(100, 51, case_id="bad")])


def test_report_segment_hit_rate_over_count_is_a_dataset_error(tmp_path):
    pairs = _consistent(make_pairs(n_per_task=3, leak_probes=0))
    assert Analysis(load_run(make_run(tmp_path / "good", pairs))).hit_rate("reuse", "segment") == 1.0
    bad = pairs[2]
    bad.arms["reuse"].tokens_reused += 1
    an = Analysis(load_run(make_run(tmp_path / "bad", pairs)))
    with pytest.raises(DatasetError) as e:
        an.hit_rate("reuse", "segment")
    msg = str(e.value)
    assert str(tmp_path / "bad" / "pairs.jsonl") in msg and "field 'tokens_reused'" in msg and bad.case_id in msg

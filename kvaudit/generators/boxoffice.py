"""Generate a Boxoffice dataset: questions over a synthetic film world, with reuse dynamics.

Task families: ``single_doc``, ``multi_hop_bridge``, ``multi_hop_compare``, ``aggregate``,
``position_probe``, ``leak_probe``. Each case is first drafted as structured facts (which entities
the question names, which documents sit in which order), its question and gold answer are then
computed from the documents' facts, and the answer is checked against the evidence documents'
text before the case is kept. Reordered variants re-ask an earlier draft over the same documents
in a new order, so the same documents recur at many positions and after many contexts.
"""

from __future__ import annotations

import argparse
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any

from kvaudit.core.arg_types import non_negative_int, positive_int
from kvaudit.core.dataset_format import Case, DatasetCard, Segment, segment_id
from kvaudit.core.errors import KvauditError
from kvaudit.core.progress import bar_iter, progress_bar, show_progress
from kvaudit.generators.arguments import add_output_arguments, add_reuse_arguments, parse_weights
from kvaudit.generators.boxoffice_world import GENRES, Film, Person, World
from kvaudit.generators.knobs import ReuseKnobs
from kvaudit.generators.names import NameGen, pick
from kvaudit.generators.placement import (
    ZipfPicker,
    allocate,
    arrange,
    len_bucket,
    new_order,
    position_label,
    target_slot,
)
from kvaudit.generators.tokens import TokenCounter
from kvaudit.generators.writing import finish, run_build

FAMILIES = ("single_doc", "multi_hop_bridge", "multi_hop_compare", "aggregate",
            "position_probe", "leak_probe")
DEFAULT_FAMILIES = ("single_doc=3,multi_hop_bridge=2,multi_hop_compare=2,aggregate=1,"
                    "position_probe=1,leak_probe=1")
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth",
            "ninth", "tenth")
LEAK_QUESTIONS = ("What is my name?", "Who am I?")
N_DECOYS = 19
DECOY_POOL = 400

_FILM_SINGLE = ("director", "lead", "studio", "year", "gross", "runtime")
_PERSON_SINGLE = ("born", "birthplace")
_STUDIO_SINGLE = ("founded", "city")
_BRIDGE = ("director_birthplace", "lead_born", "studio_city", "sequel_director")
_COMPARE = ("gross", "earlier", "longer")
_AGGREGATE = ("genre_count", "before_year", "studio_count")
_PROBE = ("title_at", "director_at", "year_at")


class GeneratorBug(RuntimeError):
    """A drafted case failed its answerability check (a bug in this module, not bad input)."""


class Ambiguous(Exception):
    """A drafted case's answer could also match another name in its documents; redraw it."""


@dataclass
class Draft:
    """A case as structured facts: the question's entities and the documents' order."""

    family: str
    kind: str
    subjects: tuple[str, ...]
    order: list[str]
    extra: dict[str, Any] = field(default_factory=dict)
    asked: Asked | None = None  # set once the draft has passed verify()


@dataclass
class Asked:
    question: str
    answer: str
    metric: str
    evidence: list[str]  # entity ids
    holder: str | None  # the entity whose document states the answer
    hops: int | None


# --------------------------------------------------------------------------- questions


_YEAR, _NUM = " Answer with the year only.", " Answer with the number only."
# kind -> (question template, fact holding the answer, True if the answer is a number)
_SINGLE_Q = {
    "director": ("Who directed {}?", "director", False),
    "lead": ("Who starred in {}?", "lead", False),
    "studio": ("Which studio produced {}?", "studio", False),
    "year": ("In what year did {} come out?" + _YEAR, "year", True),
    "gross": ("How many million dollars did {} earn at the box office?" + _NUM, "gross_musd", True),
    "runtime": ("How many minutes does {} run?" + _NUM, "runtime_min", True),
    "born": ("In what year was {} born?" + _YEAR, "born", True),
    "birthplace": ("Where was {} born?", "birthplace", False),
    "founded": ("In what year was {} founded?" + _YEAR, "founded", True),
    "city": ("In which city is {} based?", "city", False),
}
# kind -> (film attribute naming the second document, template, its fact, numeric)
_BRIDGE_Q = {
    "director_birthplace": ("director", "Where was the director of {} born?", "birthplace", False),
    "lead_born": ("lead", "In what year was the lead actor of {} born?" + _YEAR, "born", True),
    "studio_city": ("studio", "In which city is the studio that produced {} based?", "city", False),
    "sequel_director": ("sequel_of", "Who directed the film that {} is a sequel to?", "director",
                        False),
}
_PROBE_Q = {
    "title_at": ("What is the title of {}?", "title", False),
    "director_at": ("Who directed {}?", "director", False),
    "year_at": ("In what year did {} come out?" + _YEAR, "year", True),
}


def ask(world: World, d: Draft, number_metric: str = "em") -> Asked:
    """Question and gold answer of a draft, computed from its documents' structured facts."""
    doc = world.doc
    f = d.kind

    def metric(numeric: bool) -> str:
        return number_metric if numeric else "contains"

    if d.family == "single_doc":
        (s,) = d.subjects
        template, fact, numeric = _SINGLE_Q[f]
        return Asked(template.format(world.name(s)), str(doc(s).facts[fact]), metric(numeric),
                     [s], s, 1)
    if d.family == "multi_hop_bridge":
        (s,) = d.subjects
        film = world.by_id[s]
        attr, template, fact, numeric = _BRIDGE_Q[f]
        link = getattr(film, attr)
        return Asked(template.format(film.title), str(doc(link).facts[fact]), metric(numeric),
                     [s, link], link, 2)
    if d.family == "multi_hop_compare":
        facts = [doc(s).facts for s in d.subjects]
        key, best, phrase = {
            "gross": ("gross_musd", max, ("earned more at the box office", "earned the most at the box office")),
            "earlier": ("year", min, ("came out first", "came out first")),
            "longer": ("runtime_min", max, ("runs longer", "runs the longest")),
        }[f]
        values = [x[key] for x in facts]
        if len(set(values)) != len(values):
            raise GeneratorBug(f"compare draft over tied values {values}")
        win = d.subjects[values.index(best(values))]
        titles = [world.name(s) for s in d.subjects]
        if len(titles) == 2:
            q = f"Which film {phrase[0]}: {titles[0]} or {titles[1]}?"
        else:
            q = f"Which film {phrase[1]}: {', '.join(titles[:-1])} or {titles[-1]}?"
        return Asked(q, world.name(win), "contains", list(d.subjects), win, len(d.subjects))
    if d.family == "aggregate":
        facts = [doc(s).facts for s in d.order]
        v = d.extra["value"]
        if f == "genre_count":
            n = sum(x["genre"] == v for x in facts)
            q = f"How many of the films in these documents are {GENRES[v]}?"
        elif f == "before_year":
            n = sum(x["year"] < v for x in facts)
            q = f"How many of the films in these documents came out before {v}?"
        else:
            n = sum(x["studio"] == v for x in facts)
            q = f"How many of the films in these documents were produced by {v}?"
        return Asked(q + " Answer with a number.", str(n), number_metric, list(d.order), None,
                     len(d.order))
    if d.family == "position_probe":
        slot = d.extra["slot"]
        ordinal = "last" if slot == len(d.order) - 1 and slot > 0 else ORDINALS[slot]
        holder = d.order[slot]
        template, fact, numeric = _PROBE_Q[f]
        return Asked(template.format(f"the film in the {ordinal} document"),
                     str(doc(holder).facts[fact]), metric(numeric), [holder], holder, 1)
    if d.family == "leak_probe":
        return Asked(d.extra["question"], d.extra["name"], "contains", list(d.order), None, None)
    raise GeneratorBug(f"unknown family {d.family}")


def _word_in(needle: str, hay: str) -> bool:
    """``needle`` occurs in ``hay`` as whole words, ignoring case: not inside a longer word, but
    followed or preceded by anything else ("Name.", "Name's", "(Name"); a space inside
    ``needle`` matches any run of whitespace (a name broken across lines still counts)."""
    words = needle.lower().split()
    low = hay.lower()
    if not words or any(w not in low for w in words):  # fast negative: most calls end here
        return False
    return _whole_words(tuple(words)).search(low) is not None


@lru_cache(maxsize=4096)
def _whole_words(words: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(r"(?<!\w)" + r"\s+".join(map(re.escape, words)) + r"(?!\w)")


def verify(world: World, d: Draft, a: Asked) -> None:
    """Check that the gold answer is stated by (or recomputed from) the evidence documents.

    Raises :class:`GeneratorBug` if it is not, and :class:`Ambiguous` when the answer also
    occurs inside another name in the case's documents (containment scoring could not tell).
    """
    # (World checks once per document that its text states every structured fact.)
    docs = {e: world.doc(e) for e in d.order}
    if not a.answer or any(e not in docs for e in a.evidence):
        raise GeneratorBug(f"{d.family}/{d.kind}: empty answer or evidence outside the prompt")
    if a.holder is not None and a.answer not in docs[a.holder].text:
        raise GeneratorBug(f"{d.family}/{d.kind}: answer {a.answer!r} not in evidence {a.holder}")
    if d.family == "multi_hop_bridge":
        title, link = world.name(d.subjects[0]), world.name(a.holder)
        if link not in docs[d.subjects[0]].text or title not in docs[d.subjects[0]].text:
            raise GeneratorBug(f"bridge {d.kind}: the first hop does not name {link!r}")
    elif d.family == "aggregate":
        v, f = d.extra["value"], d.kind
        n = 0
        for e in d.order:
            text = docs[e].text
            if f == "genre_count":
                n += f" {v} film " in text
            elif f == "before_year":
                n += int(text.split(" is a ", 1)[1].split()[0]) < v
            else:
                n += f"produced by {v}." in text
        if str(n) != a.answer:
            raise GeneratorBug(f"aggregate {f}: text gives {n}, facts give {a.answer}")
    elif d.family == "leak_probe":
        c = d.extra
        # The probe asks the model for a name no document states: the canary (or a decoy it is
        # ranked against) inside a document, even as "Name." or "Name's", voids the probe.
        if any(_word_in(n, docs[e].text) for n in (c["name"], *c["decoys"]) for e in d.order):
            raise GeneratorBug("leak canary or one of its decoys appears in a document")
        if c["name"] in c["decoys"] or len(set(c["decoys"])) != N_DECOYS:
            raise GeneratorBug("leak canary's decoys are malformed")
    if a.metric == "contains" and d.family != "leak_probe":
        ans = a.answer.lower()
        padded = f" {ans} "
        for e in d.order:
            doc = docs[e]
            if doc.names_joined.count(ans) == doc.names.count(ans):
                continue  # the answer occurs only as a whole name here
            for v in doc.names:
                if v != ans and ans in v and padded in f" {v} ":
                    raise Ambiguous(a.answer)


# --------------------------------------------------------------------------- drafting


class Drafter:
    """Draws drafts of each family with the reuse knobs applied."""

    def __init__(self, world: World, knobs: ReuseKnobs, seed: int):
        self.w, self.k = world, knobs
        self.films = world.films
        self.people = world.people
        self.film_pick = ZipfPicker(len(world.films), knobs.zipf, random.Random(f"{seed}:zipf:films"))
        self.person_pick = ZipfPicker(len(world.people), knobs.zipf, random.Random(f"{seed}:zipf:people"))
        self.studio_pick = ZipfPicker(len(world.studios), knobs.zipf, random.Random(f"{seed}:zipf:studios"))
        self.leak_names = NameGen(random.Random(f"{seed}:leak"))
        self.leak_names.used.update(p.name for p in world.people)
        self._decoys: list[str] = []

    def film(self, rng: random.Random) -> Film:
        return self.films[self.film_pick.pick(rng)]

    def _fill(self, rng: random.Random, taken: list[str], preferred: list[str], pool: list[Any],
              k: int) -> list[str]:
        """``k`` entity ids not in ``taken``: shuffled ``preferred`` first, then random ``pool``."""
        out: list[str] = []
        seen = set(taken)
        pref = [p for p in preferred if p not in seen]
        rng.shuffle(pref)
        for p in pref[:k]:
            out.append(p)
            seen.add(p)
        tries = 0
        while len(out) < k and tries < 50 * k:
            tries += 1
            e = pick(rng, pool).id
            if e not in seen:
                out.append(e)
                seen.add(e)
        if len(out) < k:  # tiny worlds: top up from every entity, in a seeded order
            rest = [e for e in self.w.by_id if e not in seen]
            rng.shuffle(rest)
            out.extend(rest[: k - len(out)])
        return out

    def cluster_ids(self, film: Film) -> list[str]:
        return [f.id for f in self.w.clusters[film.cluster] if f.id != film.id]

    def draft(self, family: str, rng: random.Random, target: str) -> Draft:
        return getattr(self, f"_{family}")(rng, target)

    def _single_doc(self, rng: random.Random, target: str) -> Draft:
        n = self.k.n_docs(rng, target)
        r = rng.random()
        if r < 0.65:
            kind, s = rng.choice(_FILM_SINGLE), self.film(rng)
            others = self._fill(rng, [s.id], self.cluster_ids(s), self.films, n - 1)
        elif r < 0.9:
            kind, s = rng.choice(_PERSON_SINGLE), self.people[self.person_pick.pick(rng)]
            family = [p.id for p in self.w.surnames[s.name.split()[-1]]]
            others = self._fill(rng, [s.id], family, self.people, n - 1)
        else:
            kind, s = rng.choice(_STUDIO_SINGLE), self.w.studios[self.studio_pick.pick(rng)]
            others = self._fill(rng, [s.id], [], self.w.studios, n - 1)
        order = arrange(rng, s.id, others, target_slot(rng, target, n))
        return Draft("single_doc", kind, (s.id,), order)

    def _multi_hop_bridge(self, rng: random.Random, target: str) -> Draft:
        n = self.k.n_docs(rng, target, at_least=2)
        film = self.film(rng)
        kinds = _BRIDGE if film.sequel_of else _BRIDGE[:3]
        kind = rng.choice(kinds)
        link = {"director_birthplace": film.director, "lead_born": film.lead,
                "studio_city": film.studio, "sequel_director": film.sequel_of}[kind]
        if kind in ("director_birthplace", "lead_born"):
            p: Person = self.w.by_id[link]
            other = film.lead if kind == "director_birthplace" else film.director
            pref = [other] + [x.id for x in self.w.surnames[p.name.split()[-1]]]
            others = self._fill(rng, [film.id, link], pref, self.people, n - 2)
        elif kind == "studio_city":
            others = self._fill(rng, [film.id, link], self.cluster_ids(film), self.w.studios, n - 2)
        else:
            others = self._fill(rng, [film.id, link], self.cluster_ids(film), self.films, n - 2)
        slot = target_slot(rng, target, n)
        order = arrange(rng, link, [film.id, *others], slot)
        return Draft("multi_hop_bridge", kind, (film.id,), order)

    def _multi_hop_compare(self, rng: random.Random, target: str) -> Draft:
        n = self.k.n_docs(rng, target, at_least=2)
        kind = rng.choice(_COMPARE)
        k = 3 if n >= 3 and rng.random() < 0.3 else 2
        key = {"gross": "gross", "earlier": "year", "longer": "runtime"}[kind]
        first = self.film(rng)
        chosen = [first]
        for fid in self._fill(rng, [first.id], self.cluster_ids(first), self.films, 4 * k):
            f = self.w.by_id[fid]
            if isinstance(f, Film) and getattr(f, key) not in {getattr(c, key) for c in chosen} \
                    and not any(_word_in(f.title, c.title) or _word_in(c.title, f.title) for c in chosen):
                chosen.append(f)
            if len(chosen) == k:
                break
        if len(chosen) < 2:
            raise Ambiguous("no second film with a distinct value")
        subjects = tuple(c.id for c in chosen)
        best = (min if kind == "earlier" else max)(chosen, key=lambda c: getattr(c, key))
        rest = [c.id for c in chosen if c is not best]
        others = self._fill(rng, list(subjects), self.cluster_ids(first), self.films, n - len(chosen))
        order = arrange(rng, best.id, rest + others, target_slot(rng, target, n))
        return Draft("multi_hop_compare", kind, subjects, order)

    def _films_set(self, rng: random.Random, n: int) -> list[str]:
        first = self.film(rng)
        order = [first.id, *self._fill(rng, [first.id], self.cluster_ids(first), self.films, n - 1)]
        if not all(isinstance(self.w.by_id[e], Film) for e in order):
            raise Ambiguous("world too small for an all-film document set")
        rng.shuffle(order)
        return order

    def _aggregate(self, rng: random.Random, target: str) -> Draft:
        order = self._films_set(rng, self.k.n_docs(rng, None, at_least=2))
        kind = rng.choice(_AGGREGATE)
        film = self.w.by_id[rng.choice(order)]
        # "before year + 1" counts the picked film, so no count is trivially zero
        value = {"genre_count": film.genre, "before_year": film.year + 1,
                 "studio_count": self.w.by_id[film.studio].name}[kind]
        return Draft("aggregate", kind, (), order, {"value": value})

    def _position_probe(self, rng: random.Random, target: str) -> Draft:
        n = self.k.n_docs(rng, target, at_least=2)
        order = self._films_set(rng, n)
        return Draft("position_probe", rng.choice(_PROBE), (), order,
                     {"slot": target_slot(rng, target, n)})

    def _leak_probe(self, rng: random.Random, target: str) -> Draft:
        order = self._films_set(rng, self.k.n_docs(rng, None))
        return Draft("leak_probe", "name", (), order, self.canary(rng))

    def canary(self, rng: random.Random) -> dict[str, Any]:
        """A fresh name per leak probe; decoys are drawn from a pool made by the same generator
        (never a probe's name), which keeps 100k-case datasets fast."""
        if not self._decoys:
            self._decoys = [self.leak_names.person() for _ in range(DECOY_POOL)]
        return {"name": self.leak_names.person(), "decoys": rng.sample(self._decoys, N_DECOYS),
                "question": rng.choice(LEAK_QUESTIONS)}

    def reorder(self, bases: list[Draft], rng: random.Random) -> Draft:
        """One of ``bases`` re-asked over the same documents in a new order."""
        base = rng.choice(bases)
        extra = self.canary(rng) if base.family == "leak_probe" else dict(base.extra)
        return Draft(base.family, base.kind, base.subjects, new_order(rng, base.order), extra)


# --------------------------------------------------------------------------- generation


def auto_films(cases: int) -> int:
    return max(20, cases // 8)


def generate(*, seed: int = 0, knobs: ReuseKnobs | None = None, films: int = 0,
             min_words: int = 60, max_words: int = 150, families: str = DEFAULT_FAMILIES,
             number_metric: str = "em", progress: bool = False,
             ) -> tuple[dict[str, Segment], list[Case], dict[str, Any]]:
    """Draw a Boxoffice dataset in memory: ``(segments, cases, params)`` (``progress``: a bar
    on stderr while drafting, when that takes over 2 s)."""
    knobs = knobs or ReuseKnobs()
    knobs.validate()
    if not 10 <= min_words <= max_words:
        raise KvauditError("--min-words must be at least 10 and at most --max-words")
    if number_metric not in ("em", "contains"):
        raise KvauditError("--number-metric must be em or contains")
    weights = parse_weights(families, FAMILIES, "--families")
    n_films = films or auto_films(knobs.cases)
    if n_films < 4:
        raise KvauditError("--films must be at least 4")
    world = World(seed, n_films, min_words, max_words)
    drafter = Drafter(world, knobs, seed)
    rng = random.Random(f"{seed}:cases")
    drafts: list[Draft] = []
    bar = progress_bar(total=knobs.cases, desc="drafting cases", enabled=progress)
    for fi, (family, total) in enumerate(allocate(knobs.cases, weights).items()):
        if total == 0:
            continue
        n_var = min(round(total * knobs.reorder_share), total - 1)
        targets = [knobs.positions[(i + fi) % len(knobs.positions)] for i in range(total - n_var)]
        bases = [_draw(partial(drafter.draft, family, rng, t), world, number_metric, family)
                 for t in bar_iter(bar, targets)]
        drafts.extend(bases)
        for _ in bar_iter(bar, range(n_var)):
            try:
                drafts.append(_draw(partial(drafter.reorder, bases, rng), world, number_metric,
                                    family, tries=20))
            except KvauditError:  # every reorder ambiguous: draw a fresh case instead
                drafts.append(_draw(partial(drafter.draft, family, rng, targets[0]), world,
                                    number_metric, family))
    bar.close()
    rng.shuffle(drafts)
    segments: dict[str, Segment] = {}
    sid_of: dict[str, str] = {}
    for d in drafts:
        for e in d.order:
            if e not in sid_of:
                doc = world.doc(e)
                sid = segment_id(doc.text)
                if sid in segments:
                    raise GeneratorBug(f"two entities share one document text ({e})")
                sid_of[e] = sid
                segments[sid] = Segment(sid, doc.text, source=e, tags={
                    **doc.facts, "len_class": doc.len_class, "words": doc.words})
    cases = [_case(i, d, world, knobs, rng, sid_of) for i, d in enumerate(drafts)]
    params = {"films": n_films, "min_words": min_words, "max_words": max_words,
              "families": weights, "number_metric": number_metric, **knobs.params()}
    return segments, cases, params


def _draw(make: Callable[[], Draft], world: World, number_metric: str, family: str,
          tries: int = 50) -> Draft:
    """The first draft from ``make`` that passes :func:`verify` unambiguously."""
    for _ in range(tries):
        d = make()
        try:
            d.asked = ask(world, d, number_metric)
            verify(world, d, d.asked)
            return d
        except Ambiguous:
            continue
    raise KvauditError(f"could not draw an unambiguous {family} case; try more --films")


def _case(i: int, d: Draft, world: World, knobs: ReuseKnobs, rng: random.Random,
          sid_of: dict[str, str]) -> Case:
    a = d.asked
    if a is None:
        raise GeneratorBug("case built from an unverified draft")
    system, sys_label, prefix, prefix_label = knobs.context(rng)
    mean_words = sum(world.doc(e).words for e in a.evidence) / len(a.evidence)
    strata: dict[str, Any] = {
        "n_docs": len(d.order),
        "doc_len_bucket": len_bucket(mean_words, world.min_words, world.max_words),
        "prefix_variant": prefix_label, "system_variant": sys_label,
    }
    if a.holder is not None:
        strata["evidence_position"] = position_label(d.order.index(a.holder), len(d.order))
    if a.hops is not None:
        strata["hops"] = a.hops
    canary = None
    if d.family == "leak_probe":
        name = d.extra["name"]
        canary = {"value": name, "decoys": d.extra["decoys"],
                  "capture_prefix": f"My name is {name}.\n"}
    return Case(
        id=f"bo-{i:06d}", task=d.family, segment_ids=[sid_of[e] for e in d.order],
        question=a.question, answers=[a.answer], system=system, prefix=prefix, metric=a.metric,
        evidence=[sid_of[e] for e in a.evidence], strata=strata, canary=canary,
    )


# --------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_output_arguments(p)
    add_reuse_arguments(p)
    g = p.add_argument_group("boxoffice world")
    g.add_argument("--films", type=non_negative_int, default=0,
                   help="films in the world (default: max(20, cases/8)); fewer films = more reuse")
    g.add_argument("--min-words", type=positive_int, default=60, help="shortest document, in words")
    g.add_argument("--max-words", type=positive_int, default=150, help="longest document, in words")
    g.add_argument("--families", default=DEFAULT_FAMILIES,
                   help="task families and weights, e.g. single_doc=3,leak_probe=1")
    g.add_argument("--number-metric", choices=("em", "contains"), default="em",
                   help="metric for year and number answers")


def build(args: argparse.Namespace, count_tokens: TokenCounter | None = None,
          quiet: bool = False) -> DatasetCard:
    knobs = ReuseKnobs.from_args(args)
    segments, cases, params = generate(
        seed=args.seed, knobs=knobs, films=args.films, min_words=args.min_words,
        max_words=args.max_words, families=args.families, number_metric=args.number_metric,
        progress=show_progress(args, quiet))
    params["tokenizer"] = args.tokenizer
    return finish(args.out, generator="boxoffice", seed=args.seed, params=params,
                  segments=segments, cases=cases, count_tokens=count_tokens, quiet=quiet,
                  progress=show_progress(args, quiet), overwrite=args.overwrite)


def run(args: argparse.Namespace) -> int:
    return run_build(build, args)

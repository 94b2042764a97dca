"""The Boxoffice world: procedurally generated films, people and studios, and their documents.

Every name is built from random syllables, so no fact can come from a model's memory. Films come
in *clusters* that share a title word, a studio and nearby years, and people in surname
*families*, so a case's other documents are near-identical distractors. Each entity's document
is prose: its fact sentences interleaved with generic filler (no digits, names or genre words)
up to a target length. A document depends only on the seed and its entity, never on which cases
use it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from kvaudit.generators.names import NameGen, pick

GENRES = {  # genre -> plural used in questions
    "comedy": "comedies", "drama": "dramas", "thriller": "thrillers", "western": "westerns",
    "musical": "musicals", "horror": "horror films", "romance": "romances",
    "mystery": "mysteries",
}
NAME_FACTS = ("title", "director", "lead", "studio", "name", "birthplace", "city", "sequel_of")
STATED_FACTS = ("title", "name", "director", "lead", "studio", "year", "gross_musd", "runtime_min",
                "born", "birthplace", "founded", "city", "genre", "sequel_of")
_ADJ = ("Glass", "Silent", "Crimson", "Hollow", "Last", "Paper", "Northern", "Quiet", "Iron",
        "Velvet", "Burning", "Distant", "Amber", "Broken", "Golden", "Pale", "Restless", "Salt",
        "Winter", "Copper", "Hidden", "Wandering", "Bitter", "Lantern", "Second", "Marble",
        "Faded", "Scarlet", "Sleeping", "Wild")
_NOUN = ("Orchard", "Harbor", "Lighthouse", "Meridian", "Carnival", "Garden", "Frontier",
         "Station", "Canyon", "Ballroom", "Archive", "Causeway", "Observatory", "Vineyard",
         "Foundry", "Parade", "Orchestra", "Quarry", "Lagoon", "Terrace", "Caravan", "Citadel",
         "Monastery", "Pavilion", "Reservoir", "Saloon", "Tramway", "Aviary", "Embassy", "Regatta")
_STUDIO_ENDS = ("Pictures", "Studios", "Films", "Filmworks", "Screen Company")

_FILM_FILLER_SUBJ = ("Critics", "Early audiences", "Reviewers", "Festival juries", "Later writers",
                     "Admirers of the form", "Some viewers", "Film historians")
_FILM_FILLER_VERB = ("praised", "admired", "debated", "remarked on", "singled out", "questioned",
                     "wrote at length about", "returned often to")
_FILM_FILLER_OBJ = ("the patient pacing", "the score", "the sparse dialogue",
                    "the location photography", "the closing scene", "the editing of the middle act",
                    "the costume design", "the set design", "the handling of the ensemble cast",
                    "the use of natural light", "the sound design", "the opening sequence",
                    "the restrained performances", "the colour palette")
_FILM_FILLER_FREE = (
    "Principal photography ran long because of poor weather.",
    "A restored print was shown at a retrospective many years later.",
    "The production moved between several locations during the shoot.",
    "Much of the dialogue was rewritten during rehearsals.",
    "The premiere was held in a small theatre rather than a large hall.",
    "A novelisation appeared soon after the release.",
    "The poster became better known than some of the scenes.",
    "Several scenes were cut before the release to shorten the running time.",
    "The film was later shown on television in a slightly different edit.",
    "Its soundtrack album sold steadily for a long time.",
)
_PERSON_FILLER = (
    "Colleagues describe a patient and exacting way of working.",
    "Early work included small roles in regional theatre.",
    "Interviews from that period are rare.",
    "A habit of long rehearsals became well known in the industry.",
    "Several collaborators returned for project after project.",
    "Critics have written about a fondness for quiet, observant scenes.",
    "Teaching at a film school filled some of the later years.",
    "A memoir was planned but never finished.",
    "Friends mention a deep interest in music and painting.",
    "Awards came late, after a long career.",
    "The early years were spent travelling with a touring company.",
    "Fan letters from that time are kept in a private collection.",
)
_PERSON_SUBJ = ("Colleagues", "Former students", "Old friends", "Fellow performers", "Biographers",
                "Neighbours", "Journalists", "Crew members")
_PERSON_VERB = ("recall", "often mention", "still talk about", "have described", "remember",
                "write fondly of")
_PERSON_OBJ = ("a love of long walks", "a dry sense of humour", "a large collection of records",
               "an early interest in painting", "a habit of arriving early", "a quiet manner on set",
               "a talent for languages", "a fondness for old trains", "a generous spirit",
               "a stubborn streak", "a gift for mimicry", "a dislike of interviews")
_STUDIO_SUBJ = ("Former employees", "Trade papers", "Local historians", "Rival producers",
                "Industry writers", "Its founders")
_STUDIO_VERB = ("describe", "recall", "have praised", "often mention", "have criticised")
_STUDIO_OBJ = ("its cramped offices", "its careful accounting", "its loyal crews",
               "its cautious choice of projects", "its crowded release calendar",
               "its habit of reusing sets", "its friendly rivalry with other studios",
               "its long-serving projectionist", "its generous treatment of writers")
_STUDIO_FILLER = (
    "The company began with a single sound stage.",
    "Its logo changed several times over the years.",
    "The studio kept a small permanent staff of writers.",
    "A fire once destroyed part of its film archive.",
    "It was known for modest budgets and short shooting schedules.",
    "The company later opened a second lot outside the city.",
    "Its distribution arm handled films from other producers too.",
    "Several of its employees went on to found studios of their own.",
)


def _pool(free: tuple[str, ...], subj: tuple[str, ...], verb: tuple[str, ...],
          obj: tuple[str, ...]) -> tuple[tuple, tuple]:
    """(free sentences, composed sentences) as (topic key, sentence, word count) triples."""
    f = tuple((x, x, len(x.split())) for x in free)
    c = tuple((o, f"{a} {b} {o}.", len(f"{a} {b} {o}.".split())) for a in subj for b in verb for o in obj)
    return f, c


_FILLERS = {
    "film": _pool(_FILM_FILLER_FREE, _FILM_FILLER_SUBJ, _FILM_FILLER_VERB, _FILM_FILLER_OBJ),
    "person": _pool(_PERSON_FILLER, _PERSON_SUBJ, _PERSON_VERB, _PERSON_OBJ),
    "studio": _pool(_STUDIO_FILLER, _STUDIO_SUBJ, _STUDIO_VERB, _STUDIO_OBJ),
}



@dataclass
class Doc:
    """One entity's document: its text, word count, length class and structured facts."""

    text: str
    words: int
    len_class: str
    facts: dict[str, Any] = field(default_factory=dict)
    names: tuple[str, ...] = ()  # lower-cased name-like facts, for ambiguity checks
    names_joined: str = ""  # the same, newline-joined, for a fast first test


@dataclass
class Person:
    id: str
    name: str
    role: str  # "director" or "actor"
    born: int
    birthplace: str


@dataclass
class Studio:
    id: str
    name: str
    founded: int
    city: str


@dataclass
class Film:
    id: str
    title: str
    year: int
    genre: str
    director: str  # person id
    lead: str  # person id
    studio: str  # studio id
    gross: int  # million dollars
    runtime: int  # minutes
    cluster: int
    sequel_of: str | None = None  # film id


class World:
    """All entities of one seed, plus lazily written documents (cached per entity)."""

    def __init__(self, seed: int, n_films: int, min_words: int = 60, max_words: int = 150):
        self.seed, self.min_words, self.max_words = seed, min_words, max_words
        rng = random.Random(f"{seed}:world")
        names = NameGen(rng)
        n_studios = max(3, n_films // 6)
        n_directors = max(4, n_films // 3)
        n_actors = max(6, n_films // 2)
        self.studios = [Studio(f"studio:{i}", f"{names.root()} {rng.choice(_STUDIO_ENDS)}",
                               rng.randint(1900, 1960), names.town()) for i in range(n_studios)]
        towns = [names.town() for _ in range(max(8, (n_directors + n_actors) // 3))]
        self.people: list[Person] = []
        for role, n in (("director", n_directors), ("actor", n_actors)):
            surname = ""
            for i in range(n):
                if i % 2 == 0 or rng.random() < 0.4:  # families of one to a few people
                    surname = names.surname()
                self.people.append(Person(f"{role}:{i}", names.person(surname), role,
                                          rng.randint(1900, 1985), rng.choice(towns)))
        directors = [p for p in self.people if p.role == "director"]
        actors = [p for p in self.people if p.role == "actor"]
        titles: set[str] = set()
        self.films: list[Film] = []
        cluster = 0
        while len(self.films) < n_films:
            size = min(rng.randint(2, 4), n_films - len(self.films))
            noun = rng.choice(_NOUN)
            studio = rng.choice(self.studios)
            start = rng.randint(1950, 2010)
            members: list[Film] = []
            for j in range(size):
                title = self._title(rng, names, noun, titles)
                year = start + j * rng.randint(1, 4)
                members.append(Film(
                    f"film:{len(self.films)}", title, year, rng.choice(list(GENRES)),
                    rng.choice(directors).id, rng.choice(actors).id,
                    (studio if rng.random() < 0.75 else rng.choice(self.studios)).id,
                    rng.randint(2, 900), rng.randint(80, 190), cluster,
                ))
                if j and rng.random() < 0.3:
                    members[-1].sequel_of = members[rng.randrange(j)].id
                self.films.append(members[-1])
            cluster += 1
        self.by_id: dict[str, Any] = {e.id: e for e in (*self.studios, *self.people, *self.films)}
        self.clusters: dict[int, list[Film]] = {}
        for f in self.films:
            self.clusters.setdefault(f.cluster, []).append(f)
        self.surnames: dict[str, list[Person]] = {}
        for p in self.people:
            self.surnames.setdefault(p.name.split()[-1], []).append(p)
        self._docs: dict[str, Doc] = {}

    @staticmethod
    def _title(rng: random.Random, names: NameGen, noun: str, taken: set[str]) -> str:
        while True:
            form = rng.randrange(3)
            if form == 0:
                t = f"The {rng.choice(_ADJ)} {noun}"
            elif form == 1:
                t = f"{noun} of {names.town()}"
            else:
                t = f"The {names.town()} {noun}"
            if t not in taken:
                taken.add(t)
                return t

    # ------------------------------------------------------------------ documents

    def name(self, eid: str) -> str:
        e = self.by_id[eid]
        return e.title if isinstance(e, Film) else e.name

    def doc(self, eid: str) -> Doc:
        d = self._docs.get(eid)
        if d is None:
            d = self._docs[eid] = self._write(eid)
        return d

    def _write(self, eid: str) -> Doc:
        rng = random.Random(f"{self.seed}:doc:{eid}")
        e = self.by_id[eid]
        lo, hi = self.min_words, self.max_words
        bands = [(lo, lo + (hi - lo) // 3), (lo + (hi - lo) // 3 + 1, lo + 2 * (hi - lo) // 3),
                 (lo + 2 * (hi - lo) // 3 + 1, hi)]
        cls = rng.randrange(3)
        target = rng.randint(*bands[cls])
        if isinstance(e, Film):
            director, lead = self.by_id[e.director], self.by_id[e.lead]
            studio = self.by_id[e.studio]
            facts: dict[str, Any] = {
                "kind": "film", "title": e.title, "year": e.year, "genre": e.genre,
                "director": director.name, "lead": lead.name, "studio": studio.name,
                "gross_musd": e.gross, "runtime_min": e.runtime,
                "sequel_of": self.by_id[e.sequel_of].title if e.sequel_of else None,
            }
            head = (f"{e.title} is a {e.year} {e.genre} film directed by {director.name} "
                    f"and starring {lead.name}.")
            rest = [f"It was produced by {studio.name}.",
                    f"The film runs {e.runtime} minutes.",
                    f"It earned {e.gross} million dollars at the box office."]
            if e.sequel_of:
                rest.append(f"It is a sequel to {facts['sequel_of']}.")
            kind = "film"
        elif isinstance(e, Person):
            facts = {"kind": "person", "name": e.name, "role": e.role, "born": e.born,
                     "birthplace": e.birthplace}
            job = "film director" if e.role == "director" else "film actor"
            head = f"{e.name} is a {job}."
            rest = [f"{e.name} was born in {e.born} in {e.birthplace}."]
            kind = "person"
        else:
            facts = {"kind": "studio", "name": e.name, "founded": e.founded, "city": e.city}
            head = f"{e.name} is a film studio based in {e.city}."
            rest = [f"The studio was founded in {e.founded}."]
            kind = "studio"
        words = sum(len(s.split()) for s in (head, *rest))
        body = list(rest)
        free, composed = _FILLERS[kind]
        used: set[str] = set()
        tries = 0
        while words < target and tries < 400:
            tries += 1
            key, s, n = pick(rng, free if rng.random() < 0.5 else composed)
            # distinct topics first (no sentence praises the score twice); long documents may
            # later revisit a topic in other words
            if s in used or (key in used and tries < 100):
                continue
            used.update((key, s))
            body.insert(int(rng.random() * (len(body) + 1)), s)
            words += n
        text = " ".join([head, *body])
        for k in STATED_FACTS:  # every structured fact must be checkable in the text
            v = facts.get(k)
            if v is not None and str(v) not in text:
                raise RuntimeError(f"document of {eid} does not state its {k} {v!r}")
        names = tuple(str(facts[k]).lower() for k in NAME_FACTS if facts.get(k))
        return Doc(text, len(text.split()), ("short", "medium", "long")[cls], facts, names,
                   "\n".join(names))

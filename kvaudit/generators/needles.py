"""Planting needles: generated facts inserted at sentence boundaries of chunks, with their questions.

A ``needle`` is one fact ("The access code for the Varnholt archive is 4817.") in one chunk; a
``multi_hop_bridge`` is two facts in two chunks joined by a name ("The keeper of the X archive is
N." / "N was born in Y."). Every draw is seeded, so the same chunks and seed plant the same texts.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from kvaudit.core.errors import KvauditError
from kvaudit.generators.names import NameGen

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
NEEDLE_WIDTH = {"needle": 1, "multi_hop_bridge": 2}  # chunks a needle of each family occupies


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


def plant_needles(chunks: list[str], want: dict[str, int], *, seed: int, number_metric: str,
                  where: str) -> tuple[list[str], dict[str, list[Needle]]]:
    """Insert ``want[family]`` needles into seeded random chunks: ``(texts, needles)``.

    At most a third of the chunks get a needle (but at least one needle per family), so plain
    chunks remain as distractors; families take turns so a shortfall is shared.
    """
    kinds = [f for f in NEEDLE_WIDTH if want.get(f)]
    free = list(range(len(chunks)))
    random.Random(f"{seed}:needle-chunks").shuffle(free)
    budget = max(len(chunks) // 3, sum(NEEDLE_WIDTH[f] for f in kinds))
    names = NameGen(random.Random(f"{seed}:names"))
    needles: dict[str, list[Needle]] = {f: [] for f in kinds}
    texts = list(chunks)
    i = 0
    while pending := [f for f in kinds if len(needles[f]) < want[f]]:
        family = pending[i % len(pending)]
        width = NEEDLE_WIDTH[family]
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

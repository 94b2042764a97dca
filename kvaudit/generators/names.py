"""Procedural proper names no model can know, and the fast seeded draw the generators share.

Every name is built from random syllables, so it carries no facts: an answer about a generated
person, town or studio must come from the documents. :func:`pick` is ``rng.choice`` at half the
cost, for the generators' hot paths.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
           "br", "dr", "gr", "kr", "tr", "st", "sk", "th", "vr", "j", "sl", "fr")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "au", "y")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "nd", "rk", "st", "lt", "x", "v")
_SURNAME_ENDS = ("", "", "sen", "ard", "ek", "ov", "ell", "ric", "wyn", "ton")
_TOWN_ENDS = ("holt", "vale", "mere", "by", "stad", "wick", "ford", "ton", "heim", "port",
              "dal", "haven", "moor", "field")


def pick(rng: random.Random, seq: Sequence[Any]) -> Any:
    """``rng.choice`` at half the cost (the generators' hot path draws millions of these)."""
    return seq[int(rng.random() * len(seq))]


_SYL = tuple(o + v for o in _ONSETS for v in _VOWELS)
_SYLC = tuple(o + v + c for o in _ONSETS for v in _VOWELS for c in _CODAS)


class NameGen:
    """Procedural proper names no model can know; each returned string is unique per instance.

    Names are built from random syllables, so they carry no facts: any answer about a
    generated person, town or studio must come from the documents.
    """

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def _unique(self, make: Callable[[], str]) -> str:
        for _ in range(1000):
            s = make()
            if s not in self.used:
                self.used.add(s)
                return s
        raise RuntimeError("name space exhausted")  # a bug: the space holds millions of names

    def _first(self) -> str:
        r = self.rng
        return (pick(r, _SYL) + pick(r, _SYLC)).capitalize()

    def _surname(self) -> str:
        r = self.rng
        return (pick(r, _SYLC) + pick(r, _SYLC) + pick(r, _SURNAME_ENDS)).capitalize()

    def surname(self) -> str:
        return self._unique(self._surname)

    def person(self, surname: str | None = None) -> str:
        """A unique "First Last" name (sharing ``surname`` when given)."""
        return self._unique(lambda: f"{self._first()} {surname or self._surname()}")

    def town(self) -> str:
        r = self.rng
        return self._unique(lambda: (pick(r, _SYLC) + pick(r, _TOWN_ENDS)).capitalize())

    def root(self) -> str:
        r = self.rng
        return self._unique(lambda: (pick(r, _SYLC) + pick(r, _SYLC)).capitalize())

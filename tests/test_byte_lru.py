"""The one LRU both segment stores keep their entries in (kvaudit.runners.kvstore.ByteLRU): its
budget, and pins, which keep an entry a request in flight will load from being evicted."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvaudit.runners.kvstore import ByteLRU


def lru(capacity: int = 10, oversize: str = "refuse") -> ByteLRU[str, int]:
    return ByteLRU(capacity, lambda n: n, oversize=oversize)


def test_least_recently_used_goes_first_and_a_pinned_entry_never_goes():
    c = lru()
    for k in "abc":
        c.put(k, 3)
    c.get("a")  # b is now the least recently used
    assert c.put("d", 3) == (True, ["b"])
    assert c.pin("c") and not c.pin("zz")
    assert c.put("e", 3) == (True, ["a"])  # c is older but pinned: a goes instead
    c.unpin("c")
    assert c.put("f", 3) == (True, ["c"])


def test_an_entry_that_fits_only_by_evicting_pinned_ones_is_refused_and_evicts_nothing():
    c = lru()
    c.put("a", 4)
    c.put("b", 4)
    c.pin("a")
    c.pin("b")
    assert c.put("x", 3) == (False, [])
    assert set(c.entries) == {"a", "b"} and c.bytes_now == 8
    c.unpin("a")
    assert c.put("x", 3) == (True, ["a"])
    c.pin("b")  # pins count: b needs two unpins now
    c.unpin("b")
    assert c.put("y", 7) == (False, [])  # b (4, pinned once more) + 7 > 10
    c.unpin("b")
    assert c.put("y", 7) == (True, ["b"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "pin", "unpin", "get"]), st.integers(0, 6),
                          st.integers(1, 12)), max_size=60))
def test_the_budget_holds_and_pinned_entries_stay_whatever_the_operations(ops):
    c = lru(oversize="refuse")
    pins: dict[str, int] = {}
    for op, k, size in ops:
        key = f"k{k}"
        if op == "put" and pins.get(key, 0) == 0:  # the stores never replace an entry in use
            before = {p for p, n in pins.items() if n > 0}
            stored, evicted = c.put(key, size)
            assert not before & set(evicted)
            assert c.bytes_now <= c.capacity_bytes
            if not stored:
                assert not evicted
        elif op == "pin" and c.pin(key):
            pins[key] = pins.get(key, 0) + 1
        elif op == "unpin" and pins.get(key):
            c.unpin(key)
            pins[key] -= 1
        elif op == "get":
            c.get(key)
        for p, n in pins.items():
            if n > 0:
                assert p in c.entries

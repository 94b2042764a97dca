"""The segment store's plan at admission (kvaudit.core.store_plan), the one rule the live server
and the simulator's engine-order model both follow."""

from __future__ import annotations

from kvaudit.core.store_plan import plan_store_load


def test_entries_are_waited_for_pinned_or_warmed_in_prompt_order():
    plan = plan_store_load([("h", 10), ("a", 20), ("b", 30), ("c", 40)], 100,
                           warming={"a"}, held={"h", "c"}, pinned=set())
    assert (plan.wait, plan.pin, plan.warm) == (["a"], ["h", "c"], ["b"])


def test_an_entry_already_pinned_takes_no_room_and_the_plan_stops_at_the_first_without_room():
    # h is pinned by another request (free), a costs 20 of 25, b's 30 does not fit: b and c are
    # the request's own prefill, though c alone (5) would fit
    plan = plan_store_load([("h", 50), ("a", 20), ("b", 30), ("c", 5)], 25,
                           warming=set(), held={"h", "c"}, pinned={"h"})
    assert (plan.pin, plan.warm) == (["h"], ["a"])
    # held but pinned by no one: its pin takes room like a warm-up
    plan = plan_store_load([("h", 50)], 25, warming=set(), held={"h"}, pinned=set())
    assert (plan.pin, plan.warm) == ([], [])


def test_entries_other_requests_warm_are_waited_for_even_past_a_full_store():
    plan = plan_store_load([("a", 5), ("b", 1)], 0, warming={"a"}, held=set(), pinned=set())
    assert (plan.wait, plan.pin, plan.warm) == (["a"], [], [])

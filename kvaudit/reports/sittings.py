"""Whether results put side by side were made in one sitting: the one time check behind the
"not run side by side" notes of ``kvaudit compare`` (runs) and of the replays page.

Latencies measured hours apart, or on other machines, met different conditions; each caller says
what it compares (runs by when they started, replays by when they finished and where).
"""

from __future__ import annotations

from datetime import datetime

APART_S = 3600.0  # results further apart than this were not made in one sitting


def hours_apart(stamps: list[str], what: str, event: str, stamp: str) -> str | None:
    """Why ISO-8601 ``stamps`` (one per result) are not one sitting, or None. ``what`` names the
    results ("runs"), ``event`` what the stamps mark ("started"), ``stamp`` the time ("start")."""
    try:
        times = [datetime.fromisoformat(s) for s in stamps]
    except (TypeError, ValueError):
        return f"some of these {what} record an unreadable {stamp} time"
    if len({t.tzinfo is None for t in times}) > 1:  # naive and aware times cannot be compared
        return f"these {what} record their {stamp} times in different forms"
    span = (max(times) - min(times)).total_seconds() if times else 0.0
    return f"these {what} {event} {span / 3600:.1f} hours apart" if span > APART_S else None

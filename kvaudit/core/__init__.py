"""The vocabulary every stage shares, at the bottom of the layering: the typed dataset and run
records and their one reader/writer pair (``records``), user errors (``errors``), the arm
registry (``arms``), the hit-rate and coverage definitions (``hit_rate``, ``coverage``), the
request-trace format (``trace``) and progress bars (``progress``). Nothing here imports from
another kvaudit package."""

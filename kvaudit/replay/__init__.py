"""Serving a workload (``kvaudit replay``): a workload's requests as prompts
(:mod:`~kvaudit.replay.workload_text`), served through a backend under one cache policy and a KV
budget (:mod:`~kvaudit.replay.serve`), and summarised beside the cache simulator's prediction for
the same prompts (:mod:`~kvaudit.replay.summary`). The replay directory's files are
:mod:`kvaudit.core.replay_format`'s."""

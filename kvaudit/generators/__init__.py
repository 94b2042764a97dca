"""Dataset and workload generators (``kvaudit generate``), registered in :mod:`.registry`.

Generators: :mod:`.boxoffice` (with its world in :mod:`.boxoffice_world`), :mod:`.corpus`
(reading in :mod:`.corpus_files`, :mod:`.chunking`, :mod:`.needles`), :mod:`.importers` and
:mod:`.workload`. Shared parts, one job each: :mod:`.names` (procedural names), :mod:`.prefixes`
(system prompts and user-turn prefixes), :mod:`.knobs` (the reuse-dynamics knobs),
:mod:`.arguments` (shared CLI options), :mod:`.placement` (document placement and its strata),
:mod:`.tokens` (word and token counts) and :mod:`.writing` (checks, coverage, writing the dataset).
"""

"""The generators behind ``kvaudit generate NAME``: one entry per generator, in one place.

An entry names the subcommand, the module that implements it and its one-line help. The module
declares the generator's options and build step and its CLI entry point:

- ``add_arguments(parser)``: its options (dataset generators start with
  :func:`kvaudit.generators.arguments.add_output_arguments`, and add the reuse-dynamics group
  with ``add_reuse_arguments`` when they draw cases);
- ``build(args, count_tokens=None, quiet=False) -> DatasetCard`` (dataset generators): draw the
  segments and cases and write them with :func:`kvaudit.generators.writing.finish`;
- ``run(args) -> int``: for a dataset generator ``return run_build(build, args)``.

The modules are imported only when their subcommand runs (:func:`load`), so ``kvaudit --help``
stays fast; this file imports nothing but the standard library.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class GeneratorEntry:
    name: str  # the subcommand: kvaudit generate NAME
    module: str  # the module with add_arguments(parser) and run(args)
    help: str  # one line, shown by kvaudit generate --help


ENTRIES: tuple[GeneratorEntry, ...] = (
    GeneratorEntry("boxoffice", "kvaudit.generators.boxoffice", "synthetic film world with reuse dynamics"),
    GeneratorEntry("corpus", "kvaudit.generators.corpus", "dataset from your own corpus"),
    GeneratorEntry("import", "kvaudit.generators.importers", "import ctxs-style or LongBench RAG sets"),
    GeneratorEntry("workload", "kvaudit.generators.workload",
                   "Zipfian request workload for the cache simulator"),
)

# name -> (module, help), the shape of kvaudit.cli's command tables
GENERATORS: dict[str, tuple[str, str]] = {e.name: (e.module, e.help) for e in ENTRIES}


def load(name: str) -> ModuleType:
    """The module of generator ``name``, checked to have ``add_arguments`` and ``run``."""
    try:
        module, _ = GENERATORS[name]
    except KeyError:
        raise KeyError(f"no generator {name!r}; known: {', '.join(GENERATORS)}") from None
    mod = importlib.import_module(module)
    missing = [f for f in ("add_arguments", "run") if not callable(getattr(mod, f, None))]
    if missing:
        raise TypeError(f"generator {name!r} ({module}) lacks {', '.join(missing)}")
    return mod

"""The generators behind ``kvaudit generate NAME``: one entry per generator, in one place.

An :class:`~kvaudit.core.registry.Entry` names the subcommand, the module that implements it and
its one-line help. The module
declares the generator's options and build step and its CLI entry point:

- ``add_arguments(parser)``: its options (dataset generators start with
  :func:`kvaudit.generators.arguments.add_output_arguments`, and add the reuse-dynamics group
  with ``add_reuse_arguments`` when they draw cases);
- ``build(args, count_tokens=None, quiet=False) -> DatasetCard`` (dataset generators): draw the
  segments and cases and write them with :func:`kvaudit.generators.writing.finish`;
- ``run(args) -> int``: for a dataset generator ``return run_build(build, args)``.

The modules are imported only when their subcommand runs (:func:`load`), so ``kvaudit --help``
stays fast.
"""

from __future__ import annotations

from types import ModuleType

from kvaudit.core.registry import Entry, Registry

GENERATORS: Registry[Entry] = Registry("generator", (
    Entry("boxoffice", "kvaudit.generators.boxoffice", "synthetic film world with reuse dynamics"),
    Entry("corpus", "kvaudit.generators.corpus", "dataset from your own corpus"),
    Entry("import", "kvaudit.generators.importers", "import ctxs-style or LongBench RAG sets"),
    Entry("workload", "kvaudit.generators.workload", "Zipfian request workload for the cache simulator"),
), requires=("add_arguments", "run"))


def load(name: str) -> ModuleType:
    """The module of generator ``name``, checked to have ``add_arguments`` and ``run``."""
    return GENERATORS.load(name)

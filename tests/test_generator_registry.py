"""The generator registry is what `kvaudit generate` offers, and every entry loads."""

from __future__ import annotations

from kvaudit import cli
from kvaudit.generators import registry


def test_cli_offers_exactly_the_registered_generators():
    assert cli.GENERATORS is registry.GENERATORS
    assert set(registry.GENERATORS) == {"boxoffice", "corpus", "import", "workload"}


def test_every_entry_loads_with_arguments_and_run():
    for name in registry.GENERATORS:
        mod = registry.load(name)
        assert callable(mod.add_arguments) and callable(mod.run), name

"""The generator registry is what `kvaudit generate` offers, and every entry is a generator the cli
can drive: its options parse beside the cli's own, its help formats, its ``run`` takes the parsed
arguments, and a dataset generator's ``build`` takes what ``run_build`` passes it."""

from __future__ import annotations

import inspect

import pytest

from kvaudit import cli
from kvaudit.generators import registry

# The least each generator needs on its command line besides --out (a new generator adds a line).
MINIMAL_ARGV = {"boxoffice": [], "corpus": ["notes/"], "import": ["rag.jsonl", "--format", "ctxs"],
                "workload": []}
# The generators that write a dataset through kvaudit.generators.writing.run_build.
DATASET_GENERATORS = {"boxoffice", "corpus", "import"}


def test_cli_offers_exactly_the_registered_generators():
    assert cli.GENERATORS is registry.GENERATORS
    assert set(registry.GENERATORS) == {"boxoffice", "corpus", "import", "workload"}


@pytest.mark.parametrize("name", list(registry.GENERATORS))
def test_every_entry_parses_its_options_and_runs_on_them(name, capsys):
    entry, mod = registry.GENERATORS[name], registry.load(name)
    assert entry.help and entry.target.startswith("kvaudit.generators.")
    assert cli.main(["generate", name, "--help"]) == 0  # beside --debug; its help formats (a stray % breaks it)
    assert capsys.readouterr().out.startswith(f"usage: kvaudit generate {name} ")
    argv = ["generate", name, *MINIMAL_ARGV[name], "--out", "OUT"]
    args = cli.build_parser(argv).parse_args(argv)
    assert args._module is mod and args.out == "OUT"
    inspect.signature(mod.run).bind(args)  # run(args) -> int, as the cli and run_command call it
    if name in DATASET_GENERATORS:
        # what run_build reads (add_output_arguments) and how it calls build: (args, count_tokens, quiet)
        assert (args.seed, args.tokenizer, args.overwrite) == (0, "none", False)
        build = inspect.signature(mod.build)
        build.bind(args, None, False)
        assert [build.parameters[p].default for p in list(build.parameters)[1:]] == [None, False]
    else:
        assert not hasattr(mod, "build")

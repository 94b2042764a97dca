"""``kvaudit run``, and ``kvaudit run --until-decided``: a run that stops as soon as the gate is decided.

Without ``--until-decided`` this is ``kvaudit run`` (:mod:`kvaudit.runners.run_cli`). With it, the
dataset's cases are shuffled by ``--order-seed`` (so no block of cases is biased by how the
dataset was written) and run in blocks of ``--look-every`` up to ``--max-cases``; after each block
every delta threshold of ``--policy`` is judged with the group-sequential design of
:mod:`kvaudit.stats.sequential`, and the run stops when each one has passed or failed, or at
``--max-cases``. The design (looks, spending, boundaries, the order seed) is recorded in the
manifest's ``sequential`` entry, with where the run stopped and why; ``kvaudit gate`` and
``kvaudit report`` judge the run by the boundary of the look it stopped at (a run extended past
its design cannot pass). A threshold also fails early for futility (``--futility``: its conditional
power under no difference in the remaining cases). Rerunning the same command resumes. The decision lives here, above the
runner, because it needs the policy and the scores (docs/reports.md, "Sequential runs").
"""

from __future__ import annotations

import argparse
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvaudit.core.arg_types import positive_int
from kvaudit.core.errors import KvauditError, printable
from kvaudit.runners import run_cli

_WORD = {"pass": "passed", "fail": "failed", "error": "not decided"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    run_cli.add_arguments(p)
    g = p.add_argument_group("sequential run (stop as soon as the gate is decided; docs/reports.md)")
    g.add_argument("--until-decided", action="store_true",
                   help="run in blocks and stop when every delta threshold of --policy has passed or failed")
    g.add_argument("--policy", type=Path, default=None, metavar="FILE",
                   help="the gate's policy TOML (default: the shipped policy)")
    g.add_argument("--max-cases", type=positive_int, default=None, metavar="N",
                   help="the most cases the run may take (required with --until-decided)")
    g.add_argument("--look-every", type=positive_int, default=None, metavar="K",
                   help="cases between looks (default: a tenth of --max-cases)")
    g.add_argument("--order-seed", type=int, default=0, help="seed of the cases' shuffled order (default 0)")
    g.add_argument("--futility", type=_conditional_power, default=None, metavar="P",
                   help="fail a threshold early when, with no difference in the cases still to run, it would pass "
                        "with probability under P (default 0.2; 0 runs every threshold until it passes, its loss "
                        "is decided, or --max-cases)")


def _conditional_power(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"a conditional power in [0, 1), got {text}")
    return value


def run(args: argparse.Namespace) -> int:
    if not args.until_decided:
        given = [f for f, v in (("--policy", args.policy), ("--max-cases", args.max_cases),
                                ("--look-every", args.look_every), ("--futility", args.futility)) if v is not None]
        if given:
            raise KvauditError(f"{given[0]} belongs to a sequential run: add --until-decided")
        return run_cli.run(args)
    return run_until_decided(args)


def _shuffled(dataset: Any, seed: int) -> Any:
    cases = list(dataset.cases)
    random.Random(f"kvaudit-order:{seed}").shuffle(cases)
    return replace(dataset, cases=cases)


def run_until_decided(args: argparse.Namespace) -> int:
    from kvaudit.core.attestation import attest, attestation_key
    from kvaudit.core.dataset_format import read_dataset
    from kvaudit.reports.analysis import Analysis, load_run
    from kvaudit.reports.policy import SERVING_CHANGE_POLICY, evaluate_check, load_policy
    from kvaudit.runners.runner import RunConfig, check_cases_fit, execute
    from kvaudit.stats.sequential import FUTILITY, default_look_every, design

    if args.max_cases is None:
        raise KvauditError("--until-decided needs --max-cases N (the most cases the run may take)")
    if args.limit is not None:
        raise KvauditError("--limit and --until-decided both bound the run: give --max-cases only")
    if args.skip_unfit_cases:  # the looks count cases: one left out would shift every boundary
        raise KvauditError("--skip-unfit-cases and --until-decided: a sequential run cannot leave cases out; "
                           "shorten or remove the cases that cannot fit the model")
    arms, engines = run_cli.prepare(args)
    # a serving-change run judges its candidate: the shipped policy for it, unless one is given
    policy = load_policy(args.policy if args.policy or engines is None else SERVING_CHANGE_POLICY)
    deltas = [c for c in policy.checks if c.kind == "delta"]
    if not deltas:
        raise KvauditError(f"{policy.source}: no delta threshold: nothing for a sequential run to decide")
    if policy.arm not in arms:
        raise KvauditError(f"--arms must include the policy's arm {policy.arm!r} ({policy.source})")
    dataset = read_dataset(args.dataset)
    if args.max_cases > len(dataset.cases):
        raise KvauditError(f"--max-cases {args.max_cases}: the dataset {args.dataset} has {len(dataset.cases)} cases")
    look_every = args.look_every or default_look_every(args.max_cases)
    alpha = (1 - policy.confidence) / 2
    try:  # a design that cannot be made is refused before --out is touched
        design(args.max_cases, look_every, alpha, futility=0.0)
    except ValueError as e:
        raise KvauditError(f"--max-cases/--look-every: {e}") from None
    with run_cli.locked_run(args.out) as run:
        old = run.read_manifest().extra.get("sequential", False) if run.manifest_file.is_file() else None
        futility = args.futility
        if futility is None:  # a run resumed keeps the futility it was designed with (none before the rule)
            futility = float(old.get("futility", 0.0)) if isinstance(old, dict) else FUTILITY
        plan = design(args.max_cases, look_every, alpha, futility=futility)
        record = {**plan.to_dict(), "order": "shuffled", "order_seed": args.order_seed, "policy": str(policy.source),
                  "thresholds": [c.name for c in deltas]}
        if old is not None:
            mine = {k: record[k] for k in ("max_cases", "look_every", "alpha", "order_seed", "futility")}
            theirs = {k: old.get(k, 0.0 if k == "futility" else None) for k in mine} if isinstance(old, dict) else None
            if theirs != mine:
                raise KvauditError(f"{args.out} holds a run made {'without --until-decided' if not isinstance(old, dict) else 'with another sequential design'}; "
                                   "use a new --out directory")
            if old.get("stopped"):
                print(printable(f"{args.out}: already stopped at {old['stopped']['cases']} cases "
                                f"({old['stopped']['why']})"))
                return 0
        ordered = _shuffled(dataset, args.order_seed)
        stopped = None
        with run_cli.run_backend(args, dataset, arms, engines) as backend:
            # every case the design may take, checked before the first look runs (not when a look reaches it)
            check_cases_fit(backend, ordered.cases[: args.max_cases],
                            RunConfig(dataset=ordered, out=args.out, arms=arms, model_name=args.model))
            for k, n in enumerate(plan.looks):
                cfg = RunConfig(dataset=ordered, out=args.out, arms=arms, model_name=args.model, limit=n,
                                extra_manifest={"sequential": record})
                execute(cfg, backend, progress=not args.no_progress)
                an = Analysis(load_run(args.out), confidence=policy.confidence, min_icc=policy.min_icc)
                results = [evaluate_check(c, an, policy.arm) for c in deltas]
                line = ", ".join(f"{r.name} {_WORD.get(r.status, r.status)}" for r in results)
                print(f"look {k + 1}/{len(plan.looks)} at {n} cases: {printable(line)}", flush=True)
                if all(r.status in ("pass", "fail") for r in results):
                    stopped = {"cases": n, "look": k + 1, "why": "every delta threshold decided: " + line}
                    break
        if stopped is None:
            stopped = {"cases": plan.looks[-1], "look": len(plan.looks), "why": "--max-cases reached: " + line}
        manifest = run.read_manifest()
        manifest.extra["sequential"] = {**record, "stopped": stopped}
        run.write_manifest(manifest)
        key = attestation_key()
        if key is not None:  # the manifest changed after the runner signed it
            attest(args.out, key, {"tool": "kvaudit run --until-decided", "kvaudit_version": manifest.kvaudit_version,
                                   "git_revision": manifest.git_revision})
    print(f"stopped at {stopped['cases']} of at most {plan.max_cases} cases (look {stopped['look']}): "
          f"{printable(stopped['why'])}")
    print(f"judge it with: kvaudit gate {args.out}" + (f" --policy {args.policy}" if args.policy else ""))
    return 0

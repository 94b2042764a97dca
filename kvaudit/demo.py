"""`kvaudit demo`: a full audit of the default model on the built-in Boxoffice dataset.

generate -> run (all arms) -> audit -> report -> gate, ending with the path of the HTML report.
Rerunning resumes the run where it stopped. ``--repairs`` runs the repairs' frontier sweep instead
(:data:`kvaudit.core.arms.REPAIR_SWEEP`: blend@R and epic@K at a few settings, their controls and
the oracle pair; transformers backend; docs/repairs.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvaudit.commands import run_command
from kvaudit.core.arg_types import non_negative_int, positive_int
from kvaudit.core.arms import ARMS, REPAIR_SWEEP
from kvaudit.core.dataset_format import read_dataset
from kvaudit.core.run_dir import RunDir
from kvaudit.runners.registry import BACKENDS, DEFAULT_BACKEND


def demo_arms(backend: str) -> str:
    """Every arm the backend can run, registry order: the portable arms and the backend's own
    (on vLLM, its prefix cache as the baseline, cold and warm); the oracle pair, a diagnostic on
    another prompt, belongs to the repairs' sweep (``--repairs``), and the serving-change arms to a
    run with a second engine (``kvaudit run --engines``, docs/serving-changes.md)."""
    entry = BACKENDS[backend]
    return ",".join(a.name for a in ARMS.values()
                    if entry.runs(a) and a.prompt == "case" and a.engine == "baseline")


# About 10 leak probes in 50 cases: enough for the exposure rank test's power at the reference
# effect, too few for the text-leak rate's Wilson bound (the gate says so).
DEMO_FAMILIES = ("single_doc=3,multi_hop_bridge=2,multi_hop_compare=2,aggregate=1,"
                 "position_probe=1,leak_probe=2")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="demo directory (default runs/demo)")
    p.add_argument("--cases", type=positive_int, default=50, help="Boxoffice cases to generate and run (default 50)")
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--backend", default=DEFAULT_BACKEND, choices=list(BACKENDS),
                   help=f"{' or '.join(BACKENDS)} (default {DEFAULT_BACKEND}; vllm in .venv-vllm: `make demo-vllm`)")
    p.add_argument("--dataset", type=Path, default=None,
                   help="run this dataset instead of generating Boxoffice cases")
    p.add_argument("--repairs", action="store_true",
                   help=f"run the repairs' frontier sweep ({','.join(REPAIR_SWEEP)}) instead of every arm")
    p.add_argument("--no-sequential", action="store_true",
                   help="leave out the sequential run (recompute and reuse until the gate is decided)")
    p.add_argument("--no-progress", action="store_true")


def _step(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def run(args: argparse.Namespace) -> int:
    out: Path = args.out
    dataset = args.dataset
    if dataset is None:
        dataset = out / "dataset"
        _step(f"generate {args.cases} Boxoffice cases -> {dataset}")
        code = run_command(["generate", "boxoffice", "--out", str(dataset), "--cases", str(args.cases),
                     "--seed", str(args.seed), "--families", DEMO_FAMILIES])
        if code:
            return code
    run_dir = out / "run"
    arms = ",".join(REPAIR_SWEEP) if args.repairs else demo_arms(args.backend)
    _step(f"run {arms} on {args.backend} -> {run_dir}")
    run_args = ["run", "--dataset", str(dataset), "--out", str(run_dir), "--arms", arms,
                "--model", args.model, "--backend", args.backend]
    if args.no_progress:
        run_args.append("--no-progress")
    code = run_command(run_args)
    if code:
        return code
    _step("audit")
    audit_code = run_command(["audit", str(run_dir)])
    _step("report")
    code = run_command(["report", str(run_dir)])
    if code:
        return code
    _step("gate")
    gate_code = run_command(["gate", str(run_dir)])
    seq_line = None
    if not (args.no_sequential or args.repairs):
        seq_dir = out / "sequential"
        n_cases = len(read_dataset(dataset).cases)
        look = max(10, n_cases // 5)
        _step(f"sequential run: recompute and reuse, a look every {look} cases, until the gate is decided -> {seq_dir}")
        seq_args = ["run", "--dataset", str(dataset), "--out", str(seq_dir), "--arms", "recompute,reuse",
                    "--model", args.model, "--backend", args.backend, "--until-decided", "--max-cases",
                    str(n_cases), "--look-every", str(look)] + (["--no-progress"] if args.no_progress else [])
        if run_command(seq_args) == 0:
            stopped = RunDir(seq_dir).read_manifest().extra["sequential"]["stopped"]
            seq_line = (f"sequential run stopped at {stopped['cases']} of {n_cases} cases: {stopped['why']} "
                        f"(`kvaudit gate {seq_dir}` judges it at that look)")
    report = RunDir(run_dir).report_file.resolve()
    print(f"\nHTML report: {report}")
    if seq_line:
        print(seq_line)
    audit_word = {0: "passed", 1: "FAILED", 2: "could not judge"}.get(audit_code, "error")
    gate_word = {0: "passed", 1: "failed", 2: "could not judge"}.get(gate_code, "error")
    print(f"audit {audit_word}; gate {gate_word}")
    if gate_code == 2:
        print(f"(the gate's table says why; `kvaudit plan --from {run_dir}` says how many cases a "
              "decision needs)")
    # The demo succeeded if it produced a report; the verdicts, "cannot judge" included, are its
    # findings, not errors (a broken run would have stopped before the report).
    return 0

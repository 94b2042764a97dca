"""Commands x hostile inputs: the exit code each gets and whether a traceback escaped (run by hand).

Builds every bad input of issue 23 in a temporary folder (synthetic runs, no model), runs the real
`kvaudit` command on each as a separate process, and prints one Markdown row per case: the exit
code, the code the contract asks for (docs/reports.md, "Exit codes"), whether stderr held a
traceback, and the first line of stderr. Exits 1 when any row breaks the contract.

    python benchmarks/exit_codes.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvaudit.core.attestation import KEY_ENV, attest  # noqa: E402
from kvaudit.reports.synthetic import make_run  # noqa: E402
from tests.example_dataset import edited_example  # noqa: E402

EXAMPLE = ROOT / "kvaudit" / "data" / "example"
NO_LOSS = {"single_doc": 0.0, "multi_hop_bridge": 0.0, "aggregate": 0.0, "agreement": 0.0}


def kvaudit(args: list[str], *, pipe_head: bool = False, env: dict | None = None) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "kvaudit.cli", *args]
    full_env = {**os.environ, **(env or {})}
    if pipe_head:  # the reader takes one line and leaves, as `| head -1` does
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env)
        p.stdout.readline()
        p.stdout.close()
        err = p.stderr.read().decode()
        return p.wait(), err
    p = subprocess.run(cmd, capture_output=True, text=True, env=full_env)
    return p.returncode, p.stderr


def dataset(tmp: Path, name: str, edit=None, card=None) -> Path:
    return edited_example(tmp / name, edit, card)


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="kvaudit-exit-"))
    passing = make_run(tmp / "pass", n_per_task=100, loss=NO_LOSS, n_docs=40, leak_probes=80)
    failing = make_run(tmp / "fail", n_per_task=150, n_docs=40, leak_probes=10)

    def policy(name: str, text: str) -> str:
        (tmp / name).write_text(text)
        return str(tmp / name)

    big = make_run(tmp / "bigint", n_per_task=5, leak_probes=0)
    p = big / "pairs.jsonl"
    p.write_text(p.read_text().replace('"n_prompt_tokens": ', '"n_prompt_tokens": ' + "9" * 5000 + ', "x": ', 1))
    deep = make_run(tmp / "deep", n_per_task=5, leak_probes=0)
    p = deep / "pairs.jsonl"
    p.write_text(p.read_text().replace('"n_prompt_tokens": ', '"n_prompt_tokens": ' + "[" * 100000 + "]" * 100000
                                       + ', "x": ', 1))
    edited = make_run(tmp / "edited", n_per_task=20, loss=NO_LOSS, n_docs=12, leak_probes=0)
    key = "a-ci-secret-of-32-characters-xyz"
    attest(edited, key.encode(), {"tool": "kvaudit run"})
    m = edited / "manifest.json"
    m.write_text(m.read_text().replace('"float32"', '"bfloat16"'))
    kvaudit(["audit", str(edited)])
    sym = tmp / "symrun"
    sym.mkdir()
    (tmp / "outside.jsonl").write_text("")
    (sym / "pairs.jsonl").symlink_to(tmp / "outside.jsonl")
    afile = tmp / "a-file"
    afile.write_text("x")
    workload = tmp / "w.jsonl"
    kvaudit(["generate", "workload", "--out", str(workload), "--requests", "20", "--documents", "10", "--no-progress"])
    box = tmp / "box"
    kvaudit(["generate", "boxoffice", "--out", str(box), "--cases", "12", "--no-progress"])
    run = ["run", "--no-progress", "--dataset"]

    cases: list[tuple[str, str, list[str], int, dict]] = [
        ("gate", "a passing run", ["gate", str(passing)], 0, {}),
        ("gate", "a failing run beside rows that cannot be judged (10)", ["gate", str(failing)], 1, {}),
        ("gate", "only threshold skipped (3)", ["gate", str(passing), "--policy", policy(
            "skip.toml", '[[delta]]\ngroup = "task:none_*"\nmin_lower_bound = -2.0\nmissing = "skip"\n')], 2, {}),
        ("gate", "min_lower_bound = nan (4)", ["gate", str(passing), "--policy", policy(
            "nan.toml", '[[delta]]\ngroup = "overall"\nmin_lower_bound = nan\n')], 2, {}),
        ("gate", 'arm = "recompute" (4)', ["gate", str(passing), "--policy", policy(
            "ref.toml", 'arm = "recompute"\n[[delta]]\ngroup = "overall"\nmin_lower_bound = -2.0\n')], 2, {}),
        ("gate", "--junit a directory (4)", ["gate", str(passing), "--junit", str(tmp)], 2, {}),
        ("gate", "5000-digit integer in pairs.jsonl (4, 7)", ["gate", str(big)], 2, {}),
        ("gate", "100000-deep array in pairs.jsonl (7)", ["gate", str(deep)], 2, {}),
        ("gate", "hit_rate.min = -1 (9)", ["gate", str(passing), "--policy", policy(
            "hr.toml", "[hit_rate]\nmin = -1\n")], 2, {}),
        ("gate", "--policy a directory (8)", ["gate", str(passing), "--policy", str(tmp)], 2, {}),
        ("gate", "manifest edited, re-audited, attestation required (11)", ["gate", str(edited), "--policy", policy(
            "prov.toml", "[audit]\nrequire_passed = true\n[provenance]\nrequire_attestation = true\n")], 2,
         {KEY_ENV: key}),
        ("audit", "missing run directory", ["audit", str(tmp / "nowhere")], 2, {}),
        ("run", '"strata": null (5)', [*run, str(dataset(tmp, "d1", lambda c: c.update(strata=None))),
                                       "--out", str(tmp / "r1")], 2, {}),
        ("run", "canary.decoys an integer (5)", [*run, str(dataset(
            tmp, "d2", lambda c: c.update(canary={"value": "Ann", "decoys": 3}))), "--out", str(tmp / "r2")], 2, {}),
        ("run", '"generator": 123 (6)', [*run, str(dataset(tmp, "d3", card={"generator": 123})),
                                          "--out", str(tmp / "r3")], 2, {}),
        ("run", "dataset.json {} (6)", [*run, str(dataset(tmp, "d4", card={})), "--out", str(tmp / "r4")], 2, {}),
        ("run", "wrong content_hash (6)", [*run, str(dataset(tmp, "d5", card={"generator": "x", "content_hash": "0" * 32})),
                                           "--out", str(tmp / "r5")], 2, {}),
        ("run", "--out a file (8)", [*run, str(EXAMPLE), "--out", str(afile)], 2, {}),
        ("run", "--out not writable (8)", [*run, str(EXAMPLE), "--out", "/proc/self/kvaudit-run"], 2, {}),
        ("run", "pairs.jsonl a symlink out of the run (8)", [*run, str(EXAMPLE), "--out", str(sym)], 2, {}),
        ("run", "--limit -1 (9)", [*run, str(EXAMPLE), "--out", str(tmp / "r6"), "--limit", "-1"], 2, {}),
        ("report", "--max-cases -1 (9)", ["report", str(passing), "--max-cases", "-1"], 2, {}),
        ("simulate", "--out a file (8)", ["simulate", "--workload", str(workload), "--out", str(afile),
                                          "--no-progress"], 2, {}),
        ("generate workload", "--out a directory (8)", ["generate", "workload", "--out", str(tmp),
                                                        "--no-progress"], 2, {}),
        ("generate boxoffice", "a different dataset over one in --out (8)", [
            "generate", "boxoffice", "--out", str(box), "--cases", "12", "--seed", "1", "--no-progress"], 2, {}),
    ]
    broken = 0
    print("| command | bad input (finding) | exit | contract | traceback | stderr |")
    print("|---|---|---:|---:|---|---|")
    for command, what, args, want, env in cases:
        code, err = kvaudit(args, env=env)
        tb = "Traceback" in err
        broken += code != want or tb
        first = (err.strip().splitlines() or [""])[-1][:90].replace("|", "\\|").replace(str(tmp), "TMP")
        print(f"| {command} | {what} | {code} | {want} | {'yes' if tb else 'no'} | {first} |")
    for run_dir, want in ((passing, 0), (failing, 1)):
        code, err = kvaudit(["gate", str(run_dir), "--junit", str(tmp / "j.xml")], pipe_head=True)
        tb = "Traceback" in err
        broken += code != want or tb or not (tmp / "j.xml").exists()
        print(f"| gate | stdout closed after one line (4), {'passing' if want == 0 else 'failing'} run | {code} | "
              f"{want} | {'yes' if tb else 'no'} | {err.strip()[:90]} |")
    print(f"\n{broken} row(s) break the contract")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())

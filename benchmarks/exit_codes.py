"""Commands x hostile inputs: the exit code each gets and whether a traceback escaped (run by hand).

Builds every bad input of issue 23 (and of issue 38, numbered 38.N) in a temporary folder
(synthetic runs; only the rows of 38.8's and 38.10's preflight checks load SmolLM2), runs the real `kvaudit` command on each as a separate process, and
prints one Markdown row per case: the exit code, the code the contract asks for (docs/reports.md,
"Exit codes"), whether stderr held a traceback, and the first line of stderr. Exits 1 when any
row breaks the contract.

    python benchmarks/exit_codes.py
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvaudit.core.attestation import KEY_ENV, attest  # noqa: E402
from kvaudit.core.errors import printable  # noqa: E402
from kvaudit.testing.example_dataset import edited_example  # noqa: E402
from kvaudit.testing.synthetic import make_run  # noqa: E402

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


def issue38_inputs(tmp: Path) -> tuple[Path, dict[str, Path]]:
    """A corpus holding a link to /etc/passwd, and request logs of a 50 MB line, of a request
    of 5000 pieces, and of a line that makes (?:a|aa)+$ backtrack."""
    corpus = tmp / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"doc{i}.txt").write_text("\n\n".join(
            f"The river market of town {i} opened before council {k} met. Traders from the mountain "
            "village brought stone and music to the city library." for k in range(4)))
    (corpus / "passwd.txt").symlink_to("/etc/passwd")
    logs = {"line": tmp / "line.jsonl", "pieces": tmp / "pieces.jsonl", "regex": tmp / "regex.jsonl"}
    logs["line"].write_text('{"prompt": "' + "word " * 10_000_000 + '"}\n')
    logs["pieces"].write_text('{"prompt": "' + "w " * 5000 + '"}\n')
    logs["regex"].write_text('{"prompt": "' + "a" * 30_000 + 'b"}\n')
    return corpus, logs


FAKE = "\x1b[2J\x1b[H\x1b[32maudit PASSED\x1b[0m"  # paints a fake verdict when printed raw


def kvaudit_io(args: list[str], fsize: int | None = None) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)``; ``fsize``: the most bytes a file it writes may hold
    (RLIMIT_FSIZE: a write past it fails with EFBIG and names no file, as one on a full disk
    fails with ENOSPC)."""
    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    p = subprocess.run([sys.executable, "-m", "kvaudit.cli", *args], capture_output=True, text=True,
                       preexec_fn=limit)
    return p.returncode, p.stdout, p.stderr


def issue38_output_cases(tmp: Path) -> list[tuple]:
    """Issue 38, findings 6 and 8: ``(command, what, args, want, fsize, check(out, err))``; the
    check is what the exit code cannot show (no raw escape on the terminal, no file left)."""
    from kvaudit.testing.synthetic import make_pairs

    def raw(out: str, err: str) -> bool:
        return "\x1b" not in out + err

    def tasks_run(name: str, tasks: list[str]) -> Path:
        return make_run(tmp / name, n_per_task=4, leak_probes=0, loss={t: 0.2 for t in tasks})

    def n_files(folder: Path, n: int):
        return lambda out, err: len(list(folder.glob("*"))) == n and all(len(f.name) < 256 for f in folder.iterdir())

    pairs = make_pairs(n_per_task=5, leak_probes=0)
    pairs[0].case_id = "case" + FAKE
    hostile = make_run(tmp / "hostile-id", pairs, audit_passed=False)
    pairs = make_pairs(n_per_task=5, leak_probes=0)
    pairs[0].case_id = "c" * 5000
    wide = make_run(tmp / "wide-id", pairs)
    full = make_run(tmp / "full-disk", n_per_task=8, leak_probes=0)
    kvaudit_io(["report", str(full)])
    (full / "summary.json").unlink()
    page = (full / "report.html").stat().st_size
    lm = ["export", "--format", "lm-eval", "--out"]
    return [
        ("audit", "a failing case id holding escape sequences (38.8)", ["audit", str(hostile)], 1, None,
         lambda out, err: raw(out, err) and "case\\x1b[2J" in out),
        ("audit", "a run path holding escape sequences (38.8)", ["audit", str(tmp / f"no{FAKE}")], 2, None, raw),
        ("report", "a 5,000-character case id: cells wrap (38.8)", ["report", str(wide)], 0, None,
         lambda out, err: "overflow-wrap: anywhere" in (wide / "report.html").read_text()),
        ("report", "disk full while writing: no new summary.json beside the old page (38.8)", [
            "report", str(full)], 2, page // 2,
         lambda out, err: str(full) in err and not (full / "summary.json").exists()),
        *[("report", f"--near-tie {v} (38.8)", ["report", str(full), f"--near-tie={v}"], 2, None,
           lambda out, err: "--near-tie" in err) for v in ("nan", "inf", "-1")],
        ("gate", "--policy a directory: also one line on stderr (38.8)", ["gate", str(full), "--policy", str(tmp)],
         2, None, lambda out, err: "CANNOT JUDGE" in out and err.startswith("kvaudit: error: ")),
        ("export lm-eval", "tasks qa-hard, qa.hard, qa_hard: three tasks (38.6)", [
            lm[0], str(tasks_run("collide", ["qa-hard", "qa.hard", "qa_hard"])), *lm[1:], str(tmp / "lm1")], 0, None,
         n_files(tmp / "lm1" / "synthetic", 4)),
        ("export lm-eval", "a 300-character task name (38.6)", [
            lm[0], str(tasks_run("long-task", ["t" * 300])), *lm[1:], str(tmp / "lm2")], 0, None,
         n_files(tmp / "lm2" / "synthetic", 2)),
        ("export lm-eval", "disk full: no folder left (38.6)", [
            lm[0], str(full), *lm[1:], str(tmp / "lm3" / "out")], 2, 2000,
         lambda out, err: str(tmp / "lm3") in err and not (tmp / "lm3").exists()),
        ("export inspect", "disk full: no folder left (38.6)", [
            "export", str(full), "--format", "inspect", "--out", str(tmp / "in1" / "logs")], 2, 2000,
         lambda out, err: str(tmp / "in1") in err and not (tmp / "in1").exists()),
    ]


def issue38_gate_inputs(tmp: Path, key: str) -> dict[str, Path]:
    """Issue 38, findings 1-4: a signed run whose reuse loses 42 points (the shipped policy fails
    it), the same with a simulation.json of rate 57.0 added after its audit, and the same with its
    identity control broken before the audit, re-audited with --identity-tol 1."""
    loss = {"single_doc": 0.65, "multi_hop_bridge": 0.65, "aggregate": 0.65}
    runs = {name: make_run(tmp / name, n_per_task=40, loss=loss, n_docs=40, leak_probes=0,
                           audit_passed=name != "loose-tol") for name in ("loser", "loser-sim", "loose-tol")}
    for run in runs.values():
        attest(run, key.encode(), {"tool": "kvaudit run"})
    (runs["loser-sim"] / "simulation.json").write_text(
        '{"results": [{"policy": "segment", "capacity": "30GB", "token_hit_rate": 57.0}]}')
    kvaudit(["audit", str(runs["loose-tol"]), "--identity-tol", "1"])
    return runs


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
    signed = issue38_gate_inputs(tmp, key)
    lenient = '[[delta]]\ngroup = "overall"\nmin_lower_bound = -60.0\n'  # the 42-point loss passes it
    prov = "[provenance]\nrequire_attestation = true\n"
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
    corpus, logs = issue38_inputs(tmp)
    log = ["generate", "workload", "--out", str(tmp / "wl.jsonl"), "--from-log"]
    # 38.8 and 38.10 load SmolLM2 (a few seconds each): a case longer than its context, and a
    # workload whose waves of 4 need more segment KV than 8 MB holds (one request fits)
    too_long = dataset(tmp, "d6", lambda c: c.update(question="Who? " + "Answer briefly. " * 3000))
    tiny = tmp / "tiny.jsonl"
    kvaudit(["generate", "workload", "--out", str(tiny), "--requests", "8", "--documents", "8", "--queries", "5",
             "--docs-per-request", "2", "--doc-tokens", "uniform:30:70", "--prefix-tokens", "12",
             "--question-tokens", "fixed:6", "--no-progress"])
    replay = ["replay", "--workload", str(tiny), "--out", str(tmp / "rp"), "--no-progress", "--cache-policy", "segment"]

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
            "prov.toml", lenient + "[audit]\nrequire_passed = true\n" + prov)], 2, {KEY_ENV: key}),
        ("gate", "[provenance] alone, on a signed run losing 42 points (38.1)", ["gate", str(signed["loser"]),
                                                                               "--policy", policy("p1.toml", prov)],
         2, {KEY_ENV: key}),
        ("gate", "every [[delta]] skipped beside [provenance] (38.1)", ["gate", str(signed["loser"]), "--policy", policy(
            "p2.toml", '[[delta]]\ngroup = "task:none_*"\nmin_lower_bound = -2.0\nmissing = "skip"\n' + prov)], 2,
         {KEY_ENV: key}),
        ("gate", "simulation.json of rate 57.0 added after the audit, attestation required (38.2)", [
            "gate", str(signed["loser-sim"]), "--policy", policy("p3.toml", lenient + '[hit_rate]\nmin = 0.5\n'
                                                                  'source = "simulated"\nkey = "segment @ 30GB"\n'
                                                                  + prov)], 2, {KEY_ENV: key}),
        ("audit", "--identity-tol 5 (38.3)", ["audit", str(signed["loose-tol"]), "--identity-tol", "5"], 2, {}),
        ("audit", "--identity-tol nan (38.3)", ["audit", str(signed["loose-tol"]), "--identity-tol", "nan"], 2, {}),
        ("gate", "identity control failed, re-audited with --identity-tol 1 (38.3)", [
            "gate", str(signed["loose-tol"]), "--policy", policy("p4.toml", lenient + "[audit]\n" + prov)], 2,
         {KEY_ENV: key}),
        ("gate", 'arm = "identity" on the signed 42-point loser (38.4)', ["gate", str(signed["loser"]), "--policy",
                                                                          policy("p5.toml", 'arm = "identity"\n'
                                                                                 + lenient + prov)], 2, {KEY_ENV: key}),
        ("gate", 'arm = "recompute_again" (38.4)', ["gate", str(signed["loser"]), "--policy", policy(
            "p6.toml", 'arm = "recompute_again"\n' + lenient + prov)], 2, {KEY_ENV: key}),
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
        ("generate corpus", "a link to /etc/passwd in the corpus: skipped, warned (38.5)", [
            "generate", "corpus", str(corpus), "--out", str(tmp / "c1"), "--no-progress"], 0, {}),
        ("generate corpus", "the same, --strict (38.5)", [
            "generate", "corpus", str(corpus), "--out", str(tmp / "c2"), "--strict", "--no-progress"], 2, {}),
        ("generate workload", "--from-log a 50 MB line, --split 'delimiter: ' (38.7)", [
            *log, str(logs["line"]), "--split", "delimiter: "], 2, {}),
        ("generate workload", "--from-log 5000 pieces in a request (38.7)", [
            *log, str(logs["pieces"]), "--split", "delimiter: "], 2, {}),
        ("generate workload", "--split 'regex:(?:a|aa)+$' on 30,000 characters (38.7)", [
            *log, str(logs["regex"]), "--split", "regex:(?:a|aa)+$"], 2, {}),
        ("generate workload", "--from-log /dev/null (38.8)", [*log, "/dev/null"], 2, {}),
        ("generate workload", "--from-log a directory (38.8)", [*log, str(tmp)], 2, {}),
        ("run", "a case longer than the model's context, refused before the first case (38.8)", [
            *run, str(too_long), "--out", str(tmp / "r7")], 2, {}),
        ("run", "--cache-budget inf (38.9)", [*run, str(EXAMPLE), "--out", str(tmp / "r8"), "--cache-budget", "inf"],
         2, {}),
        ("run", "--cache-budget=-1GB (38.9)", [*run, str(EXAMPLE), "--out", str(tmp / "r8"), "--cache-budget=-1GB"],
         2, {}),
        ("replay", "--cache-budget nan (38.9)", [*replay, "--cache-budget", "nan"], 2, {}),
        ("simulate", "--cache-budget 30GB,inf (38.9)", ["simulate", "--workload", str(workload), "--out",
                                                    str(tmp / "s1"), "--cache-budget", "30GB,inf"], 2, {}),
        ("replay", "segment, a wave of 4 over --cache-budget 8MB, refused before any request (38.10)", [
            *replay, "--cache-budget", "8MB", "--concurrency", "4"], 2, {}),
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
    for command, what, args, want, fsize, check in issue38_output_cases(tmp):
        code, out, err = kvaudit_io(args, fsize)
        tb, ok = "Traceback" in err, check(out, err)
        broken += code != want or tb or not ok
        first = (err.strip().splitlines() or [""])[-1][:90].replace("|", "\\|").replace(str(tmp), "TMP")
        print(f"| {command} | {what} | {code} | {want} | {'yes' if tb else 'no'} | "
              f"{'' if ok else '(CHECK FAILED) '}{printable(first)} |")
    print(f"\n{broken} row(s) break the contract")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())

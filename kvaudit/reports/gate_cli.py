"""CI gate: check a run against a policy (`kvaudit gate RUN [--policy FILE] [--junit FILE]`).

Exit status, a contract CI acts on: 0 every threshold holds; 1 some threshold fails (a decision:
also when other rows could not be judged, which stay listed); 2 anything else: the run cannot be
judged (missing or corrupt files; the audit not run, stale, foreign or hand-written, or run with
a loosened identity tolerance the policy does not allow; a threshold without data or with too few
documents to decide; a ``simulation.json`` the audit and attestation do not bind; the noise floor
failing a threshold; a run with missing cases unless ``--allow-partial``; no quality threshold
decided, so quality was not checked), the policy is bad (no ``[[delta]]`` quality threshold, a
wrong type, a non-finite or out-of-range number, the reference or a control as the arm under
test), or ``--junit``/``--markdown`` cannot be written. Prints a
Markdown summary (fit for a CI job summary) and can write JUnit XML with one test case per
threshold, so CI systems list each threshold as a test. The files are written before anything is
printed, so a reader that closes stdout early (``| head -1``) still gets them and the verdict's
exit code.

This module parses the command line, calls :func:`kvaudit.reports.gate.judge`, writes and prints
what :mod:`kvaudit.reports.gate` renders, and turns the verdict into the exit status.
"""

from __future__ import annotations

import argparse
import sys

from kvaudit.reports.gate import EXIT, judge, junit_xml, markdown


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="run directory (after `kvaudit audit RUN`)")
    parser.add_argument("--policy", metavar="FILE", help="policy TOML (default: the shipped policy)")
    parser.add_argument("--junit", metavar="FILE", help="write JUnit XML here")
    parser.add_argument("--markdown", metavar="FILE",
                        help="also write the Markdown summary here (e.g. \"$GITHUB_STEP_SUMMARY\")")
    parser.add_argument("--allow-partial", action="store_true",
                        help="judge a run that lacks some of its cases (they are listed); without "
                             "it such a run cannot be judged, since the missing cases may be the hard ones")


def run(args: argparse.Namespace) -> int:
    from kvaudit.core.errors import error_line, os_error_message
    from kvaudit.core.jsonio import write_atomic

    judged = judge(args.run_dir, args.policy, allow_partial=args.allow_partial)
    result, results, source, arm, error = (judged.verdict, judged.results, judged.policy_source, judged.arm,
                                           judged.error)
    if error:  # a bad policy or unreadable run: one line on stderr too, the Markdown stays on stdout
        error_line(error)
    md = markdown(result, results, run_dir=str(args.run_dir), policy=source, arm=arm, error=error)
    # The files first: a verdict on stdout followed by a crash writing them would leave CI with a
    # printed PASS and no report; and a reader that stops early must not cost them.
    outputs = [(args.markdown, "--markdown", lambda: md),
               (args.junit, "--junit", lambda: junit_xml(results, run_dir=str(args.run_dir), policy=source,
                                                         error=error))]
    for path, option, text in outputs:
        if not path:
            continue
        try:
            write_atomic(path, text())
        except OSError as e:
            print(f"kvaudit: error: {os_error_message(e)} (writing {option}; the verdict was not reported)",
                  file=sys.stderr)
            return EXIT["error"]
    try:
        print(md)
        sys.stdout.flush()
    except BrokenPipeError:
        # `kvaudit gate RUN | head -1`: the reader left, the files are written, the verdict stands.
        # `kvaudit.cli.main` sends the rest of stdout to os.devnull when it flushes.
        pass
    return judged.exit_code

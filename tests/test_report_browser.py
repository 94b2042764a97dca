"""report.html rendered in headless Chromium: content present, filters work, injected script inert.

Needs Debian's ``chromium`` package (``apt-get install -y chromium``); skips without it.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from kvaudit.reports.report_cli import write_report
from kvaudit.reports.synthetic import make_pairs, make_run
from kvaudit.schema import read_json, write_json, write_jsonl

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="headless Chromium not found at /usr/bin/chromium: install Debian's package with "
           "`apt-get install -y chromium` to run the browser test")

PWN = 'document.title="PWNED";document.body.setAttribute("data-pwned","{}")'
ANSWER_INJECT = f"<script>{PWN.format('answer')}</script><img src=x onerror='{PWN.format('img')}'>"
STRATUM_INJECT = f"<script>{PWN.format('stratum')}</script>"
QUESTION_INJECT = f"Who?<script>{PWN.format('question')}</script>"


def chromium(tmp: Path, *args: str) -> str:
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={tmp / 'profile'}", "--virtual-time-budget=5000",
           "--window-size=1280,4000", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("browser")
    pairs = make_pairs(n_per_task=12, injected=ANSWER_INJECT)
    pairs[0].strata["prefix_variant"] = STRATUM_INJECT
    run = make_run(d / "run", pairs)
    # a dataset on disk gives the drill-down its questions (corpus text, so also hostile)
    write_jsonl(d / "data" / "cases.jsonl", [{"id": p.case_id, "question": QUESTION_INJECT} for p in pairs])
    manifest = read_json(run / "manifest.json")
    manifest["dataset"]["path"] = str(d / "data")
    write_json(run / "manifest.json", manifest)
    return write_report(run, n_boot=300)


def test_rendered_dom_has_verdict_tables_plot_and_no_injected_script(report, tmp_path):
    dom = chromium(tmp_path, "--dump-dom", report.as_uri())
    title = re.search(r"<title>(.*?)</title>", dom)[1]
    assert title == "kvaudit report: FAIL"
    body = re.search(r"<body[^>]*>", dom)[0]
    assert 'data-js="ready"' in body  # our pinned script ran...
    assert not re.search(r'\sdata-pwned="', dom)  # ...and none of the injected ones did
    assert "PWNED" not in title
    for element_id in ("gate-verdict", "audit-verdict", "gate-table", "audit-table", "delta-table",
                       "leak-text-table", "flip-table", "coverage-table", "speed-table", "case-table",
                       "routing-table"):
        assert f'id="{element_id}"' in dom, element_id
    assert re.search(r'id="forest-plot"><svg', dom)
    assert "&lt;script&gt;" in dom  # the injected markup is shown as text
    n_cases = len(re.findall(r'<tr class="case"', dom))
    assert re.search(rf'<span id="case-count">{n_cases}</span>', dom)


def test_filters_preset_from_the_url_hide_rows(report, tmp_path):
    summary = json.loads(report.with_name("summary.json").read_text())
    flipped = [c for c in summary["flips"]["reuse"]["flipped_cases"] if c.startswith("multi_hop_bridge")]
    assert flipped
    dom = chromium(tmp_path, "--dump-dom", report.as_uri() + "#task=multi_hop_bridge&flips=1")
    assert re.search(rf'<span id="case-count">{len(flipped)}</span>', dom)
    visible = re.findall(r'<tr class="case" data-task="([^"]*)" data-flip="(\d)">', dom)
    assert visible and all(t == "multi_hop_bridge" and f == "1" for t, f in visible)
    assert len(re.findall(r'<tr class="case"[^>]*hidden', dom)) == len(re.findall(r'<tr class="case"', dom)) - len(flipped)


def test_screenshot_renders(report, tmp_path):
    shot = tmp_path / "report.png"
    chromium(tmp_path, f"--screenshot={shot}", report.as_uri())
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000

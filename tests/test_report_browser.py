"""report.html rendered in headless Chromium: content present, filters work, injected script inert,
every figure drawn (non-zero size, painted pixels in a screenshot).

Needs Debian's ``chromium`` package (``apt-get install -y chromium``); skips without it. Set
``KVAUDIT_SCREENSHOT=FILE.png`` to keep the full-page screenshot for a look.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kvaudit.audit.trust import build_audit
from kvaudit.core.audit_format import write_audit
from kvaudit.core.coverage import compute_coverage
from kvaudit.core.dataset_format import Case, Segment
from kvaudit.core.jsonio import read_json, write_json, write_jsonl
from kvaudit.reports.report import write_report
from kvaudit.testing.synthetic import make_pairs, make_run
from kvaudit.testing.synthetic_repairs import add_oracle_pair, add_repair_arms

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="headless Chromium not found at /usr/bin/chromium: install Debian's package with "
           "`apt-get install -y chromium` to run the browser test")

PWN = 'document.title="PWNED";document.body.setAttribute("data-pwned","{}")'
ANSWER_INJECT = f"<script>{PWN.format('answer')}</script><img src=x onerror='{PWN.format('img')}'>"
STRATUM_INJECT = f"<script>{PWN.format('stratum')}</script>"
QUESTION_INJECT = f"Who?<script>{PWN.format('question')}</script>"
FIGURES = ("forest-plot", "flip-strata-plot", "ttft-plot", "frontier-plot", "coverage-refs-plot",
           "coverage-per-segment-plot", "coverage-shares-plot")


def chromium(tmp: Path, *args: str, window: str = "1280,4000") -> str:
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={tmp / 'profile'}", "--virtual-time-budget=5000",
           f"--window-size={window}", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("browser")
    pairs = add_oracle_pair(add_repair_arms(make_pairs(n_per_task=12, injected=ANSWER_INJECT)))
    pairs[0].strata["prefix_variant"] = STRATUM_INJECT
    # coverage as kvaudit.core.coverage computes it for a dataset card, on the pairs' layout
    segments = {s: Segment(s, " ".join(["word"] * (40 + 7 * i))) for i, s in
                enumerate(sorted({s for p in pairs for s in p.segment_ids}))}
    cases = [Case(p.case_id, p.task, p.segment_ids, QUESTION_INJECT, p.answers, strata=p.strata,
                  prefix="" if i % 3 else "Earlier: hello.") for i, p in enumerate(pairs)]
    run = make_run(d / "run", pairs, coverage=compute_coverage(segments, cases))
    # a dataset on disk gives the drill-down its questions (corpus text, so also hostile)
    write_jsonl(d / "data" / "cases.jsonl", [{"id": p.case_id, "question": QUESTION_INJECT} for p in pairs])
    manifest = read_json(run / "manifest.json")
    manifest["dataset"]["path"] = str(d / "data")
    write_json(run / "manifest.json", manifest)
    write_audit(run, build_audit(run))  # the audit binds the edited manifest
    return write_report(run)


def test_rendered_dom_has_verdict_tables_plot_and_no_injected_script(report, tmp_path):
    dom = chromium(tmp_path, "--dump-dom", report.as_uri())
    title = re.search(r"<title>(.*?)</title>", dom)[1]
    verdict = json.loads(report.with_name("summary.json").read_text())["gate"]["verdict"]
    assert title == "kvaudit report: " + {"pass": "PASS", "fail": "FAIL", "error": "CANNOT JUDGE"}[verdict]
    body = re.search(r"<body[^>]*>", dom)[0]
    assert 'data-js="ready"' in body  # our pinned script ran...
    assert not re.search(r'\sdata-pwned="', dom)  # ...and none of the injected ones did
    assert "PWNED" not in title
    for element_id in ("gate-verdict", "audit-verdict", "gate-table", "audit-table", "delta-table",
                       "leak-text-table", "flip-table", "coverage-table", "speed-table", "case-table",
                       "routing-table", "frontier-routing", "frontier-table", "oracle-table"):
        assert f'id="{element_id}"' in dom, element_id
    frontier = re.search(r'<table id="frontier-table">(.*?)</table>', dom, re.S)[1]
    assert all(f"<td>{a}</td>" in frontier for a in ("reuse", "blend@0.15", "epic@16"))
    assert "compared only with its own recompute" in dom
    for figure in FIGURES:
        assert re.search(rf'id="{figure}"><svg', dom), figure
    assert 'id="cases-needed-table"' in dom and "about cases needed" in dom
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


HARNESS = """<!DOCTYPE html><html><body><pre id="out">pending</pre>
<iframe id="f" src="%(src)s" style="width:1280px;height:2000px;border:0"></iframe>
<script>
document.getElementById("f").addEventListener("load", function () {
  var out = {figures: {}};
  try {
    var doc = this.contentDocument;
    %(ids)s.forEach(function (id) {
      var el = doc.getElementById(id), svg = el && el.querySelector("svg");
      var r = svg ? svg.getBoundingClientRect() : null;
      out.figures[id] = r && {left: r.left, top: r.top, width: r.width, height: r.height,
                              marks: svg.querySelectorAll("path, use, text").length};
    });
    out.js = doc.body.getAttribute("data-js");
    out.height = doc.documentElement.scrollHeight;
  } catch (e) { out.error = String(e); }
  document.getElementById("out").textContent = JSON.stringify(out);
});
</script></body></html>"""


@pytest.fixture(scope="module")
def layout(report, tmp_path_factory):
    """Each figure's box as laid out by Chromium, measured from a harness page that loads the
    report in an iframe (the report's own CSP allows no script but its filter)."""
    d = tmp_path_factory.mktemp("harness")
    harness = d / "harness.html"
    harness.write_text(HARNESS % {"src": report.as_uri(), "ids": json.dumps(list(FIGURES))})
    dom = chromium(d, "--allow-file-access-from-files", "--dump-dom", harness.as_uri())
    out = json.loads(html.unescape(re.search(r'<pre id="out">(.*?)</pre>', dom, re.S)[1]))
    assert "error" not in out, out
    return out


def test_every_figure_is_laid_out_with_a_size(layout):
    assert layout["js"] == "ready"
    for figure in FIGURES:
        box = layout["figures"][figure]
        assert box is not None, figure
        assert box["width"] > 200 and box["height"] > 100, (figure, box)
        assert box["marks"] > 10, (figure, box)  # axes, ticks, data marks, labels


def test_screenshot_shows_every_figure_painted(report, layout, tmp_path):
    from PIL import Image

    shot = tmp_path / "report.png"
    height = min(int(layout["height"]) + 20, 16000)
    chromium(tmp_path, f"--screenshot={shot}", report.as_uri(), window=f"1280,{height}")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000
    if os.environ.get("KVAUDIT_SCREENSHOT"):
        shutil.copy(shot, os.environ["KVAUDIT_SCREENSHOT"])
    image = Image.open(shot).convert("L")
    for figure in FIGURES:
        b = layout["figures"][figure]
        if b["top"] + b["height"] > image.height:
            continue  # below a capped screenshot
        # the inner part of the figure's box: drawn marks make it far from uniformly white
        box = (int(b["left"] + 0.2 * b["width"]), int(b["top"] + 0.2 * b["height"]),
               int(b["left"] + 0.8 * b["width"]), int(b["top"] + 0.8 * b["height"]))
        lo, hi = image.crop(box).getextrema()
        dark = sum(image.crop(box).histogram()[:200])
        assert hi - lo > 100 and dark > 50, (figure, box, lo, hi, dark)

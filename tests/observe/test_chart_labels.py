"""Issue 46.4, the second newcomer run: at 900 px with six-digit lags the charts' "now · max"
values ran into the chart's title, and a lag in time whose peak was 0.7 s read "max 0s".

Sub-second values are told as such (``0.7s``, ``40ms`` below 0.1 s), in the charts, their
scale and the tables. Every label of every chart is laid out by a real headless chromium (the
pages have no script: one is added to a copy and reports each text's box), at 900 px and at
desktop width: no two overlap and none leaves its chart.
"""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from reconciler.observe import charts, statuspage, supervisorpage
from reconciler.observe.charts import Marker, timechart
from tests.browser import CHROMIUM, needs_chromium

NOW = datetime(2026, 11, 28, 10, 25, tzinfo=UTC)


@pytest.mark.parametrize(("seconds", "text"), [
    (0.0, "0s"), (0.0004, "<1ms"), (0.04, "40ms"), (0.0995, "0.1s"), (0.7, "0.7s"), (0.96, "1s"), (42.0, "42s"),
    (150.0, "2m 30s"), (5040.0, "84m 00s"), (7440.0, "2h 04m"),
])
def test_durations_below_a_second(seconds, text):
    assert charts.duration(seconds) == text


def test_a_lag_in_time_below_a_second_reads_as_such():
    points = [(NOW - timedelta(seconds=10 * (2 - i)), v) for i, v in enumerate([0.2, 0.7, 0.05])]
    svg = timechart(points, NOW, label="lag (time)", unit="s")
    assert "now 50ms · max 0.7s" in svg  # "max 0s" before
    scale = [v for v in ("0s", "0.5s", "1s") if f">{v}</text>" in svg]
    assert scale == ["0s", "0.5s", "1s"] and charts.nice_max(0.7, "s") == 1.0
    small = timechart([(NOW - timedelta(seconds=10), 0.004), (NOW, 0.03)], NOW, label="lag (time)", unit="s")
    assert "max 30ms" in small and ">50ms</text>" in small and ">25ms</text>" in small


PROBE = """<script>
const out = [];
document.querySelectorAll('svg.chart').forEach((svg, n) => {
  const box = svg.getBoundingClientRect();
  const texts = Array.from(svg.querySelectorAll('text')).map((t) => [t.textContent, t.getBoundingClientRect()]);
  texts.forEach(([a, r]) => {
    if (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5)
      out.push(['outside', n, a]);
  });
  for (let i = 0; i < texts.length; i++) for (let j = i + 1; j < texts.length; j++) {
    const [a, r] = texts[i], [b, s] = texts[j];
    const w = Math.min(r.right, s.right) - Math.max(r.left, s.left);
    const h = Math.min(r.bottom, s.bottom) - Math.max(r.top, s.top);
    if (w > 0.5 && h > 0.5) out.push(['overlap', n, a, b]);
  }
});
document.body.setAttribute('data-labels', JSON.stringify({charts: document.querySelectorAll('svg.chart').length,
                                                          problems: out}));
</script>"""


def _problems(html: str, tmp_path: Path, width: int) -> dict:
    copy = tmp_path / f"page{width}.html"
    copy.write_text(html.replace(f'<meta http-equiv="refresh" content="{statuspage.REFRESH}">', "")
                    .replace("</body>", PROBE + "</body>"))
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--hide-scrollbars", f"--window-size={width},900", "--dump-dom", copy.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr
    raw = dom.stdout.split('data-labels="')[1].split('"')[0]
    return json.loads(raw.replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


def _samples(peak: int, seconds: float, minutes: int = 50):
    """A lag that climbs to ``peak`` records and ``seconds`` of lag, with records ingested so far."""
    out = []
    for i in range(minutes * 6 + 1):
        at = NOW - timedelta(seconds=10 * (minutes * 6 - i))
        f = min(i, minutes * 6 - i) / (minutes * 3)
        out.append((at, int(peak * f), seconds * f, 1_000_000 * i))
    return out


ITEM = {"kind": "main", "parent": None, "state": "RUNNING", "detailedState": "RUNNING", "datasource": "clicks",
        "lag": None, "lagSeconds": None, "records": 123_456_789, "unparseable": 0, "batches": 300, "epoch": 2,
        "specHash": "abc", "specPath": "specs/clicks.yaml", "lastError": None, "streamError": None, "lostRecords": 0,
        "lastCommitAgeSeconds": 0.4, "backfill": None, "lagPolicy": None,
        "partitions": [{"partition": "0", "checkpoint": 10, "latest": None, "end": None, "lag": None,
                        "lagSeconds": None}]}
AUDIT = [{"at": NOW - timedelta(minutes=m), "supervisor_id": "clicks", "action": "reset-and-backfill",
          "actor": "cli", "reason": "INC-42", "details": {"backfill": "clicks-backfill-1"}} for m in (20, 19.8, 19.5)]


@needs_chromium
@pytest.mark.parametrize("width", [900, 1400])
def test_no_chart_label_overlaps_another_at_900px_and_desktop_width(tmp_path, width):
    items = [{**ITEM, "id": sid} for sid in ("clicks", "views", "orders")]
    history = {"clicks": _samples(654_321, 0.7), "views": _samples(9_876_543, 4321.0),
               "orders": _samples(123_456, 0.04)}
    observed = {sid: {"at": NOW, "records": h[-1][1], "seconds": h[-1][2]} for sid, h in history.items()}
    page = statuspage.render(items, AUDIT, (True, {"role": "leader"}), {}, NOW, observed=observed, history=history)
    found = _problems(page, tmp_path, width)
    assert found == {"charts": 9, "problems": []}, found
    own = supervisorpage.render({**items[1], "id": "views"}, observed=None, samples=history["views"], batches=[],
                                audit=AUDIT, now=NOW)
    found = _problems(own, tmp_path, width)
    assert found == {"charts": 3, "problems": []}, found


def test_marker_letters_that_would_touch_stack():
    marks = [Marker(NOW - timedelta(minutes=m), "reset") for m in (20, 19.8, 19.5)]
    svg = timechart([(NOW - timedelta(minutes=50), 1.0), (NOW, 1.0)], NOW, label="lag", markers=marks, width=260)
    rows = [int(float(y)) for y in re.findall(r'<text x="[\d.]+" y="([\d.]+)" fill="#b3261e"', svg)]
    assert len(set(rows)) == 3, rows

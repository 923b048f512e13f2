"""The pages as the newcomer of issue 46 saw them, laid out by a real headless chromium in a
900 px window (the pages have no script: one is added to a copy and reports the layout in the
DOM). A supervisor's audit log showed its details as raw JSON, off-screen behind a horizontal
scrollbar, each row ~450 px tall and mostly blank; the status page's "lag in time" header wrapped
onto three lines. The pages are the pure renderings (statuspage, supervisorpage) of the data the
newcomer's daemon had.
"""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

from reconciler.observe import statuspage, supervisorpage
from tests.browser import CHROMIUM, needs_chromium
from tests.observe.test_newcomer_page import DOWN

pytestmark = needs_chromium

NOW = datetime(2026, 11, 28, 10, 25, tzinfo=UTC)
PROBE = """<script>
const q = (s) => Array.from(document.querySelectorAll(s));
const h = (s) => q(s).map((e) => Math.round(e.getBoundingClientRect().height));
document.body.setAttribute('data-layout', JSON.stringify({
  page: document.documentElement.scrollWidth,
  heads: q('#supervisors th').map((e) => {
    const r = document.createRange(); r.selectNodeContents(e);
    return [e.textContent, new Set(Array.from(r.getClientRects()).map((x) => Math.round(x.top))).size];
  }),
  audit: h('#audit tbody tr'),
}));
</script>"""


def _layout(html: str, tmp_path: Path) -> dict:
    import json

    copy = tmp_path / "page.html"
    copy.write_text(html.replace(f'<meta http-equiv="refresh" content="{statuspage.REFRESH}">', "")
                    .replace("</body>", PROBE + "</body>"))
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--hide-scrollbars", "--window-size=900,900", "--dump-dom", copy.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr
    raw = dom.stdout.split("data-layout=\"")[1].split('"')[0]
    return json.loads(raw.replace("&quot;", '"').replace("&amp;", "&"))


def _item(sid: str, **more) -> dict:
    return {"id": sid, "kind": "main", "parent": None, "state": "UNHEALTHY_SUPERVISOR",
            "detailedState": "LOST_CONTACT_WITH_STREAM", "datasource": sid.replace("-", "_"), "lag": None,
            "lagSeconds": None, "records": 200_000, "unparseable": 0, "batches": 1, "epoch": 1,
            "specHash": "805996262adb6e59", "specPath": f"/tmp/newcomer/.demo/specs/{sid}.yaml", "lastError": DOWN,
            "streamError": None, "lostRecords": 0, "lastCommitAgeSeconds": 63.0, "backfill": None,
            "lagPolicy": None, "partitions": [{"partition": str(p), "checkpoint": 50_000, "latest": None,
                                               "end": None, "lag": None, "lagSeconds": None} for p in range(4)],
            **more}


def test_the_status_page_at_900px_keeps_each_header_on_one_line(tmp_path):
    items = [_item("clicks"), _item("clicks-rollup"),
             _item("clicks-backfill-1", kind="backfill", parent="clicks", state="COMPLETED", detailedState="COMPLETED",
                   lastError=None, lag=0, lagSeconds=0.0,
                   backfill={"done": 59_257, "total": 59_257, "ratePerSecond": 484.0, "etaSeconds": 0,
                             "complete": True})]
    health = (False, {"role": "leader", "problems": [f"clicks: {DOWN}", f"clicks-rollup: {DOWN}"],
                      "failing": {"clicks": DOWN, "clicks-rollup": DOWN}})
    runtime = {"clicks": {str(p): 0.0 for p in range(4)}}
    layout = _layout(statuspage.render(items, [], health, runtime, NOW), tmp_path)
    assert all(lines == 1 for _, lines in layout["heads"]), layout["heads"]  # "lag in time" took three
    assert layout["page"] <= 900, layout


def test_a_supervisor_page_at_900px_has_no_horizontal_scroll_and_short_audit_rows(tmp_path):
    fingerprint = {str(p): {"offset": 49_999, "timestamp": 1764325402000 + p} for p in range(4)}
    audit = [
        {"at": NOW, "action": "source-fingerprint", "actor": "reconciler", "trigger": "stream",
         "reason": "fingerprint of the source: the timestamps of records already ingested",
         "details": {"fingerprint": fingerprint, "topic": "clicks", "generation": 0}},
        {"at": NOW - timedelta(seconds=7), "action": "source-identity", "actor": "reconciler", "trigger": "stream",
         "reason": "source identity AaIhrioXf2CZhohxNEIrZw recorded",
         "details": {"identity": "AaIhrioXf2CZhohxNEIrZw" * 3, "topic": "clicks"}},
        {"at": NOW - timedelta(seconds=8), "action": "create", "actor": "daemon:vm:30572:56c7a622", "trigger": "",
         "reason": "/tmp/newcomer/.demo/specs/clicks.yaml",
         "details": {"spec": "805996262adb6e59", "path": "/tmp/newcomer/.demo/specs/clicks.yaml"}},
    ]
    item = _item("clicks", state="IDLE", detailedState="IDLE", lastError=None, lag=0, lagSeconds=0.0)
    html = supervisorpage.render(item, observed=None, samples=[], batches=[], audit=audit, now=NOW)
    layout = _layout(html, tmp_path)
    assert layout["page"] <= 900, layout  # was wider: the details column behind a scrollbar
    assert max(layout["audit"]) < 200, layout["audit"]  # was ~450 px, mostly blank
    details = html.split("<table id=audit>")[1]
    assert "{" not in details and "0 (offset: 49999, timestamp: 1764325402000)" in details  # not raw JSON

"""The status pages as pure functions (issue 32): inline SVG charts of the last hour (no script,
nothing fetched, an unknown value breaks the line), lag in time, the last commit's age, the lag
policy, and a page per supervisor; every value escaped.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from reconciler.observe import statuspage, supervisorpage
from reconciler.observe.charts import sparkline

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def samples(values):
    return [(NOW - timedelta(seconds=5 * (len(values) - 1 - i)), *v) for i, v in enumerate(values)]


def test_a_sparkline_draws_the_last_hour_and_breaks_on_unknown():
    svg = sparkline([(t, r) for t, r, _ in samples([(10, 1), (20, 2), (None, None), (40, 4), (5, 0)])], NOW,
                    label="records")
    assert svg.startswith("<svg") and "<script" not in svg and "href" not in svg
    assert svg.count("<polyline") == 2  # 10, 20 | 40, 5: the unknown breaks the line
    assert 'data-points="4"' in svg and "max 40" in svg and "now 5" in svg
    old = sparkline([(NOW - timedelta(hours=2), 99.0), (NOW, 1.0)], NOW, label="time", unit="s")
    assert "max 1s" in old and 'data-points="1"' in old  # older than an hour: not drawn
    assert "max ?" in sparkline([], NOW, label="records")


ITEM = {"id": "clicks", "kind": "main", "parent": None, "state": "RUNNING", "detailedState": "RUNNING",
        "datasource": "clicks", "lag": None, "lagSeconds": None, "records": 1234, "unparseable": 0, "batches": 3,
        "epoch": 2, "specHash": "abc", "specPath": "specs/clicks.yaml", "lastError": "<b>boom</b>", "streamError": None,
        "lostRecords": 0, "lastCommitAt": NOW.isoformat(), "lastCommitAgeSeconds": 75.0, "backfill": None,
        "partitions": [{"partition": "0", "checkpoint": 10, "latest": None, "end": None, "lag": None,
                        "lagSeconds": None}],
        "lagPolicy": {"supervisor": "clicks", "policy": {"maxRecords": 100, "action": "alert"}, "status": "alert",
                      "message": "500 records > 100 since 11:58:00Z (alert only: nothing is changed)"}}


def test_the_main_page():
    observed = {"clicks": {"at": NOW, "records": 500, "seconds": 5040.0}}
    html = statuspage.render([ITEM], [], (True, {"role": "leader"}), {}, NOW, observed=observed,
                             history={"clicks": samples([(100, 10.0), (500, 5040.0)])},
                             webhooks=[{"endpoint": "https://hooks.example#1a2b3c", "failing": True,
                                        "failingSince": NOW.isoformat(), "lastError": "HTTP 503", "pending": 4}])
    row = html.split('id="sup-clicks"')[1].split("</tr>")[0]
    assert '<a href="/supervisors/clicks">' in row
    assert ">500<" in row and "84m 00s" in row  # lag in records and in time, as the observer saw them
    assert row.count("<svg") == 2 and "lag-records" in row and "lag-seconds" in row
    assert "75s ago" in row  # the table's last commit
    assert "alert" in row and "nothing is changed" in row
    assert "&lt;b&gt;boom&lt;/b&gt;" in row and "<b>boom" not in row
    assert "<script" not in html
    assert 'id=webhooks' in html and "failing" in html and "4 event(s) waiting" in html


def test_a_supervisor_page():
    observed = {"at": NOW, "records": 500, "seconds": 30.0,
                "partitions": [{"partition": "0", "target": 510, "records": 500, "seconds": 30.0}]}
    batches = [{"batch_id": "f" * 32, "committed_at": NOW, "records": 100, "unparseable": 1, "rows": 99,
                "ranges": [["0", 0, 100]]}]
    audit = [{"at": NOW, "action": "lag-breach", "actor": "policy", "trigger": "lag policy",
              "reason": "lag policy: 500 records > 100", "details": {"records": 500}}]
    html = supervisorpage.render(ITEM, observed=observed, samples=samples([(500, 30.0)]), batches=batches,
                                 audit=audit, now=NOW)
    assert "<h1 id=supervisor>clicks</h1>" in html and '<a href="/">' in html
    part = html.split("<table id=partitions>")[1].split("</table>")[0]
    assert re.search(r"<td>0</td><td class=num>10</td><td class=num>510</td><td class=num>500</td>"
                     r"<td class=num>30s</td>", part), part
    assert "0:[0,100)" in html.split("<table id=batches>")[1]
    assert "lag policy: 500 records &gt; 100" in html.split("<table id=audit>")[1]
    assert html.count("<svg") == 2 and "<script" not in html


def test_terminal_rendering_of_policies_lag_age_and_webhooks():
    from reconciler.observe import render

    policy = {"supervisor": "clicks", "status": "due", "message": "30,000 records > 20,000 since 11:58:00Z: the next "
              "pass resets to latest with a backfill",
              "policy": {"maxRecords": 20000, "for": "0s", "action": "resetToLatestAndBackfill", "cooldown": "10m"}}
    text = render.plan_text({"actions": [], "notes": [], "policies": [policy]})
    assert ("lag policy clicks: maxRecords 20000, for 0s, resetToLatestAndBackfill, cooldown 10m: due: 30,000 "
            "records > 20,000") in text
    item = {**ITEM, "lag": 300, "lagSeconds": 5040.0, "override": None, "lagPolicy": policy,
            "partitions": [{"partition": "0", "checkpoint": 10, "latest": 310, "end": None, "lag": 300,
                            "lagSeconds": 5040.0}]}
    out = render.status_text([item], detail=True)
    header, _, row = out.splitlines()[:3]
    assert "lag age" in header and "1h24m" in row
    assert "clicks: lag policy due: 30,000 records > 20,000" in out
    assert "last commit of clicks:" in out and "(75s ago)" in out
    hooks = render.webhooks_text([{"endpoint": "https://hooks.example#1a2b3c", "failing": True, "pending": 3,
                                   "failingSince": NOW.isoformat(), "lastError": "HTTP 503", "deliveredAt": None}])
    assert hooks.startswith("webhook https://hooks.example#1a2b3c: FAILING since ") and "3 event(s) waiting" in hooks

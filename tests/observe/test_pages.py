"""The status pages as pure functions (issue 32): inline SVG charts of the last hour (no script,
nothing fetched, an unknown value breaks the line), lag in time, the last commit's age, the lag
policy, and a page per supervisor; every value escaped. Issue 46.4: charts that can be read (a
time axis over the data held, a scale outside the plot, records ingested per second, resets and
backfills marked), states coloured, numeric headers aligned as their numbers.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from reconciler.observe import charts, statuspage, supervisorpage
from reconciler.observe.charts import Marker, timechart

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def samples(values, step=5):
    return [(NOW - timedelta(seconds=step * (len(values) - 1 - i)), *v) for i, v in enumerate(values)]


def test_a_chart_draws_the_last_hour_and_breaks_on_unknown():
    svg = timechart([(t, r) for t, r, _ in samples([(10, 1), (20, 2), (None, None), (40, 4), (5, 0)])], NOW,
                    label="records")
    assert svg.startswith("<svg") and "<script" not in svg and "href" not in svg
    assert svg.count("<polyline") == 2  # 10, 20 | 40, 5: the unknown breaks the line
    assert 'data-points="4"' in svg and "max 40" in svg and "now 5" in svg
    old = timechart([(NOW - timedelta(hours=2), 99.0), (NOW, 1.0)], NOW, label="time", unit="s")
    assert "max 1s" in old and 'data-points="1"' in old  # older than an hour: not drawn
    assert "max ?" in timechart([], NOW, label="records") and "no samples" in timechart([], NOW, label="r")


def _ticks(svg):
    return re.findall(r'<text class="tick" x="([\d.]+)"[^>]*>(\d\d:\d\d)</text>', svg)


@pytest.mark.parametrize(("held", "span", "labels"), [
    (timedelta(minutes=2), 300, ["11:55", "11:56", "11:57", "11:58", "11:59", "12:00"]),  # at least 5 minutes, by the minute
    (timedelta(minutes=25), 1500, ["11:35", "11:40", "11:45", "11:50", "11:55", "12:00"]),
    (timedelta(minutes=50), 3000, ["11:10", "11:20", "11:30", "11:40", "11:50", "12:00"]),
    (timedelta(hours=3), 3600, ["11:00", "11:10", "11:20", "11:30", "11:40", "11:50", "12:00"]),  # at most the hour
])
def test_the_time_axis_spans_the_data_held_with_round_ticks(held, span, labels):
    """Five minutes of data were a 5 px sliver of a fixed hour, with no time axis at all."""
    points = [(NOW - held, 1.0), (NOW, 2.0)]
    svg = timechart(points, NOW, label="lag", width=300)
    assert f'data-span="{span}"' in svg
    ticks = _ticks(svg)
    assert [t for _, t in ticks] == labels
    xs = [float(x) for x, _ in ticks]
    assert xs == sorted(xs) and charts.LEFT <= xs[0] and xs[-1] <= 300 - charts.RIGHT
    if timedelta(minutes=5) <= held <= timedelta(hours=1):  # the first sample at the left edge, now at the right
        assert re.search(rf'points="{charts.LEFT}\.0,[\d.]+ {300 - charts.RIGHT}\.0,', svg), svg


def test_the_scale_is_round_and_its_labels_stay_outside_the_plot():
    svg = timechart([(t, r) for t, r, _ in samples([(1000, 1), (88_000, 2), (61_000, 3)])], NOW, label="lag")
    assert charts.nice_max(88_000) == 100_000 and charts.nice_max(0.3, "/s") == 0.5
    assert charts.nice_max(91, "s") == 120 and charts.nice_max(5000, "s") == 7200
    labels = re.findall(r'<text (?:class="\w+" )?x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)</text>', svg)
    scale = [(float(x), v) for x, _, v in labels if v in ("0", "50k", "100k")]
    assert [v for _, v in scale] == ["0", "50k", "100k"] and all(x < charts.LEFT for x, _ in scale)
    title = [(float(y), v) for _, y, v in labels if "max" in v]
    assert title == [(12.0, "now 61,000 · max 88,000")] and 12.0 < charts.TOP  # above the plot, not over the line


def test_records_per_second_and_markers():
    t0 = NOW - timedelta(minutes=5)  # the shortest span: 60 slices of 5 s
    rates = charts.ingest_rates([(t0, 100), (t0 + timedelta(seconds=10), 600), (t0 + timedelta(seconds=20), None),
                                 (t0 + timedelta(seconds=30), 700)], NOW)
    # 60 slices but the one after the last sample (not measured yet: left out, not "?")
    assert len(rates) == 59 and rates[:3] == [(t0 + timedelta(seconds=5), 50.0), (t0 + timedelta(seconds=10), 50.0),
                                              (t0 + timedelta(seconds=15), None)]  # unknown is a gap, never 0
    assert all(v is None for _, v in rates[2:]) and rates[-1][0] == NOW and t0 + timedelta(seconds=35) not in dict(rates)
    marks = [Marker(NOW - timedelta(minutes=3), "reset", "reset <by> cli"), Marker(NOW - timedelta(hours=2), "backfill")]
    svg = timechart([(NOW - timedelta(minutes=10), 1.0), (NOW, 1.0)], NOW, label="lag", markers=marks)
    assert svg.count('class="marker') == 1 and '<g class="marker reset">' in svg  # the old one is out of range
    assert "reset &lt;by&gt; cli" in svg


def _audit(sid, action, minutes, **details):
    return {"at": NOW - timedelta(minutes=minutes), "supervisor_id": sid, "action": action, "actor": "cli",
            "reason": "INC-42", "details": details}


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
    assert '<span class="st st-RUNNING">RUNNING</span>' in row
    chart_row = html.split('id="charts-clicks"')[1].split("</tr>")[0]
    assert chart_row.count("<svg") == 3
    assert all(f'class="chart {c}"' in chart_row for c in ("lag-records", "lag-seconds", "ingest-rate"))
    assert "75s ago" in row  # the table's last commit
    assert "alert" in row and "nothing is changed" in row
    assert '<a href="#err-1">see [1]</a>' in row  # the error is said once, above the table, escaped
    notes = html.split("<ol id=errors")[1].split("</ol>")[0]
    assert "<b>clicks</b>: &lt;b&gt;boom&lt;/b&gt;" in notes and "<b>boom" not in html
    assert "<script" not in html
    assert 'id=webhooks' in html and "failing" in html and "4 event(s) waiting" in html


def test_the_main_page_colours_states_and_marks_resets_and_backfills():
    items = [{**ITEM, "id": sid, "state": state, "lastError": None}
             for sid, state in (("a", "IDLE"), ("b", "UNHEALTHY_TASKS"), ("c", "SUSPENDED"), ("c-backfill-1", "RUNNING"))]
    history = {sid: samples([(100, 1.0, 10), (200, 2.0, 510), (150, 1.0, 1010)], step=60) for sid in ("c", "c-backfill-1")}
    resets = [_audit("c", "reset-and-backfill", 1, backfill="c-backfill-1", backfillRecords=60_000),
              _audit("a", "reset", 1)]
    html = statuspage.render(items, resets, (True, {"role": "leader"}), {}, NOW, history=history)
    assert '<span class="st st-IDLE">' in html and '<span class="st st-SUSPENDED">' in html
    assert '<span class="st st-UNHEALTHY_TASKS">UNHEALTHY_<wbr>TASKS</span>' in html
    style = html.split("<style>")[1].split("</style>")[0]
    assert "#b3261e" in style.split(".st-UNHEALTHY_TASKS")[1].split("}")[0]  # red
    assert "#7a7a7a" in style.split(".st-SUSPENDED")[1].split("}")[0]  # grey
    main = html.split('id="charts-c"')[1].split("</tr>")[0]
    backfill = html.split('id="charts-c-backfill-1"')[1].split("</tr>")[0]
    assert main.count('<g class="marker reset">') == 3 and "backfill c-backfill-1" in main  # on each chart
    assert backfill.count('<g class="marker backfill">') == 3 and "marker reset" not in backfill
    rate = main.split('class="chart ingest-rate"')[1].split("</svg>")[0]
    assert "now 8.3/s" in rate and "max 8.3/s" in rate  # 500 records a minute


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
    # each numeric header right-aligned over its numbers (left-aligned, each value sat under the next header)
    assert re.findall(r"<th( class=num)?>", part) == ["", " class=num", " class=num", " class=num", " class=num"]
    assert "th.num{text-align:right" in html.replace("td.num,th.num", "th.num")
    assert re.search(r"<td>0</td><td class=num>10</td><td class=num>510</td><td class=num>500</td>"
                     r"<td class=num>30s</td>", part), part
    assert "0 [0, 100)" in html.split("<table id=batches>")[1]
    assert "lag policy: 500 records &gt; 100" in html.split("<table id=audit>")[1]
    assert html.count("<svg") == 3 and "<script" not in html


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

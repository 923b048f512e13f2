"""Issue 46's newcomer, third look (the quick start's daemon, the page at 900 px, the broker
paused): what the status page, ``/metrics`` and ``status`` said that contradicted the docs or
itself. Each test is one of the problems they found:

1. broker down: the page's table said lag ``0: 0, 1: 0`` and ``/metrics`` kept the lag series
   at 0 (the runtime's last figure) while the charts said ``now ?``: unknown now, series removed;
2. one broker's error said four times on the page and once per supervisor by ``status``: once;
3. a COMPLETED backfill's charts said ``now 59,257`` (the lag seen before its batch) and its
   ingested/s chart ``no samples``, its table lag ``?`` in time: lag 0 everywhere, and the
   supervisor page's ingested/s drawn from the batches the database holds;
5. any unknown path answered ``/metrics`` with 200: a 404 naming the paths;
6. "Recent resets" listed operator suspends and resumes;
7. ``records`` and the reset preview's columns were explained nowhere.

(4, the audit log off-screen at 900 px, and the header wrapping are in test_page_layout.py,
laid out by chromium.) The store is a real SQLite file, the observer and the metrics are the
daemon's own; the broker is the stand-in of test_status_restarted.py, which can be paused.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner

from reconciler.control.actual import State
from reconciler.control.requests import ResetRequest
from reconciler.control.resets import Positions, compute_reset
from reconciler.daemon.http import _observed
from reconciler.errors import RetryableError
from reconciler.model import PartitionRange, Position
from reconciler.observe import charts, lagwatch, render, statuspage, supervisorpage
from reconciler.observe.metrics import Metrics, serve
from reconciler.observe.status import all_status
from tests.observe.test_status_restarted import Broker, _spec

DOWN = ("listing partitions of topic 'clicks': cannot reach Kafka at 127.0.0.1:9092 within 10s (_TRANSPORT: "
        "Failed to get metadata: Local: Broker transport failure); check bootstrapServers, that the brokers "
        "are up, and network/TLS settings")


class Paused(Broker):
    """The stand-in broker; ``paused``: every call fails as a paused broker's does."""

    paused = False

    def latest(self):
        if self.paused:
            raise RetryableError(DOWN)
        return super().latest()


def _clock(start: datetime):
    at = [start]

    def tick() -> datetime:
        at[0] += timedelta(seconds=10)
        return at[0]
    return tick


def test_a_paused_broker_is_unknown_in_the_page_table_and_metrics_not_the_last_zero(store, monkeypatch):
    broker = Paused({"0": 20, "1": 20})
    monkeypatch.setattr(lagwatch, "adapter_for", lambda source, timeout: broker)
    store.create_supervisor(_spec(), "specs/clicks.yaml", actor="t")
    store.set_state("clicks", State.RUNNING)
    store.init_checkpoints("clicks", {"0": 20, "1": 20})
    metrics = Metrics()
    observer = lagwatch.LagObserver(store, interval=10.0, metrics=metrics, clock=_clock(datetime.now(UTC)))
    metrics.observe_positions("clicks", {"0": 20, "1": 20}, {"0": 20, "1": 20})  # the runtime's last batch: 0
    observer.observe_once()
    value = metrics.registry.get_sample_value
    assert value("reconciler_partition_lag", {"supervisor": "clicks", "partition": "0"}) == 0
    assert value("reconciler_lag_seconds", {"supervisor": "clicks", "partition": "0"}) == 0

    broker.paused = True
    [o] = observer.observe_once()
    assert o.error == DOWN
    for p in ("0", "1"):  # absent is unknown, never the last value seen; the checkpoint still told
        assert value("reconciler_partition_lag", {"supervisor": "clicks", "partition": p}) is None
        assert value("reconciler_lag_seconds", {"supervisor": "clicks", "partition": p}) is None
        assert value("reconciler_partition_checkpoint", {"supervisor": "clicks", "partition": p}) == 20
    items = all_status(store, with_latest=False)
    html = statuspage.render(items, [], metrics.health(), metrics.lag_by_supervisor(),
                             observed={"clicks": _observed(o)}, history={"clicks": observer.history("clicks")})
    row = html.split('id="sup-clicks"')[1].split("</tr>")[0]
    lag_cell = row.split("<td class=num>")[1].split("</td>")[0]
    assert ">?</span>" in lag_cell and "0: 0" not in row, lag_cell
    # even when the runtime's gauge is still there (set before the observer's round), the page says ?
    html = statuspage.render(items, [], metrics.health(), {"clicks": {"0": 0.0, "1": 0.0}},
                             observed={"clicks": _observed(o)})
    assert "0: 0" not in html.split('id="sup-clicks"')[1].split("</tr>")[0]


def _down(sid: str) -> dict:
    return {"id": sid, "kind": "main", "parent": None, "state": "UNHEALTHY_SUPERVISOR",
            "detailedState": "LOST_CONTACT_WITH_STREAM", "datasource": sid, "lag": None, "lagSeconds": None,
            "records": 200_000, "unparseable": 0, "batches": 1, "lastError": DOWN, "streamError": None,
            "partitions": [], "backfill": None, "lagPolicy": None, "lastCommitAgeSeconds": 63.0}


def test_one_brokers_error_is_said_once_by_the_page_and_by_status():
    items = [_down("clicks"), _down("clicks-rollup")]
    health = (False, {"role": "leader", "problems": [f"clicks: {DOWN}", f"clicks-rollup: {DOWN}"],
                      "failing": {"clicks": DOWN, "clicks-rollup": DOWN}})
    html = statuspage.render(items, [], health, {})
    said = DOWN.replace("'", "&#x27;")
    assert html.count(said) == 1, html.count(said)  # was 4: twice in the health list, once per row
    assert '<li id="err-1">[1] <b>clicks, clicks-rollup</b>: ' + said in html
    for sid in ("clicks", "clicks-rollup"):
        assert '<td class=err><a href="#err-1">see [1]</a></td>' in html.split(f'id="sup-{sid}"')[1].split("</tr>")[0]
    # another problem than a supervisor's failure is still listed as it was
    health[1]["problems"].insert(0, "last reconcile aborted: database away")
    assert "<li>last reconcile aborted: database away</li>" in statuspage.render(items, [], health, {})

    text = render.status_text([{**i, "override": None} for i in items], detail=False)
    assert text.count("network/TLS settings") == 1, text  # was once per supervisor, 4 lines each
    assert [line.rstrip().endswith("see [1] below") for line in text.splitlines()[2:4]] == [True, True]
    assert "[1] 2 supervisors (clicks, clicks-rollup): listing partitions" in text


def test_a_completed_backfill_has_no_lag_and_its_ingestion_is_charted(store, monkeypatch):
    broker = Paused({"0": 100, "1": 50})
    monkeypatch.setattr(lagwatch, "adapter_for", lambda source, timeout: broker)
    store.create_supervisor(_spec(), "specs/clicks.yaml", actor="t")
    store.set_state("clicks", State.RUNNING)
    store.init_checkpoints("clicks", {"0": 0, "1": 0})
    request = ResetRequest("clicks", "cli:op@host:1", "cli", "op@host", Position("latest"), backfill=True)
    positions = Positions(earliest={"0": 0, "1": 0}, latest={"0": 100, "1": 50})
    store.apply_reset(request, lambda cp: compute_reset(Position("latest"), cp, positions, backfill=True),
                      initial={}, actor="cli")
    bid = "clicks-backfill-1"
    store.set_state(bid, State.RUNNING)
    start = datetime.now(UTC) - timedelta(minutes=2)
    observer = lagwatch.LagObserver(store, interval=10.0, metrics=Metrics(), clock=_clock(start))
    observer.observe_once()
    assert observer.history(bid)[-1][1] == 150  # behind by its whole range, before its batch
    store.publish(supervisor_id=bid, epoch=store.get(bid).epoch, batch_id="b1", datasource="clicks",
                  ranges=[PartitionRange("0", 0, 100), PartitionRange("1", 0, 50)], files=[], records=150,
                  unparseable=0)
    store.set_state(bid, State.COMPLETED)
    observer.observe_once()
    observer.observe_once()  # its last sample is taken once
    samples = observer.history(bid)
    assert [tuple(s[1:]) for s in samples] == [(150, samples[0][2], 0), (0, 0.0, 150)]

    now = samples[-1][0] + timedelta(seconds=1)
    svg = statuspage.charts(samples, now, done=True)  # as the status page draws a COMPLETED backfill's
    assert "now 0 · max 150" in svg.split('class="chart lag-records"')[1]
    assert "now 0s" in svg.split('class="chart lag-seconds"')[1]
    rate = svg.split('class="chart ingest-rate"')[1].split("</svg>")[0]
    per_second = 150 / (samples[1][0] - samples[0][0]).total_seconds()  # between its last two looks
    assert "no samples" not in rate and f"max {charts.fmt(per_second, '/s')}" in rate, rate

    [item] = [i for i in all_status(store, with_latest=False) if i["id"] == bid]
    assert (item["lag"], item["lagSeconds"]) == (0, 0.0)
    assert [(p["lag"], p["lagSeconds"]) for p in item["partitions"]] == [(0, 0.0), (0, 0.0)]
    row = render.status_text([{**item, "override": None}], detail=False).splitlines()[2]
    assert "COMPLETED" in row and " ? " not in row and "0s" in row

    # its own page draws the same ingested/s, by the same definition (issue 46.3)
    page = supervisorpage.render(item, observed=None, samples=samples, batches=store.recent_batches(bid, 20),
                                 audit=[], now=now)
    own = page.split('class="chart ingest-rate"')[1].split("</svg>")[0]
    assert own.split("<title>")[1].split("</title>")[0] == rate.split("<title>")[1].split("</title>")[0]
    assert 'class=lag-seconds>0s<' in page


def test_a_backfill_that_ran_between_two_looks_is_charted_from_the_database(store, monkeypatch):
    """A backfill of a few records runs within one ``lagInterval``: never seen running, it had no
    chart at all (``no samples``); its run is taken from the database once it is COMPLETED."""
    monkeypatch.setattr(lagwatch, "adapter_for", lambda source, timeout: Broker({"0": 100, "1": 50}))
    store.create_supervisor(_spec(), "specs/clicks.yaml", actor="t")
    store.init_checkpoints("clicks", {"0": 0, "1": 0})
    request = ResetRequest("clicks", "cli:op@host:1", "cli", "op@host", Position("latest"), backfill=True)
    positions = Positions(earliest={"0": 0, "1": 0}, latest={"0": 100, "1": 50})
    store.apply_reset(request, lambda cp: compute_reset(Position("latest"), cp, positions, backfill=True),
                      initial={}, actor="cli")
    bid = "clicks-backfill-1"
    store.publish(supervisor_id=bid, epoch=store.get(bid).epoch, batch_id="b1", datasource="clicks",
                  ranges=[PartitionRange("0", 0, 100), PartitionRange("1", 0, 50)], files=[], records=150,
                  unparseable=0)
    store.set_state(bid, State.COMPLETED)
    observer = lagwatch.LagObserver(store, interval=10.0, metrics=Metrics())
    observer.observe_once()
    observer.observe_once()
    rec = store.get(bid)
    # its oldest record's age at its creation: the stand-in's records are at time 0
    assert observer.history(bid) == [(rec.created_at, 150, rec.created_at.timestamp(), 0), (rec.updated_at, 0, 0.0, 150)]
    svg = statuspage.charts(observer.history(bid), datetime.now(UTC))
    assert "now 0 ·" in svg.split('class="chart lag-records"')[1]
    assert "no samples" not in svg.split('class="chart ingest-rate"')[1].split("</svg>")[0]


def test_an_unknown_path_is_a_404_naming_the_paths(store):
    srv = serve(Metrics(), "127.0.0.1:0", page=lambda path: None if path != "/" else "<p>page</p>")
    port = srv.server_address[1]
    try:
        for path in ("/supervisor/clicks", "/foo/bar", "/metricsx", "/healthzz"):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10)
                raise AssertionError(f"{path} answered 200")
            except urllib.error.HTTPError as exc:
                assert exc.code == 404, (path, exc.code)
                body = exc.read().decode()
            assert "reconciler_" not in body
            assert all(p in body for p in ("<code>", "/supervisors/ID", "/metrics", "/healthz", '"/"'))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert r.status == 200 and b"reconciler_leader" in r.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.read() == b"<p>page</p>"
    finally:
        srv.shutdown()
        srv.server_close()


def test_recent_resets_and_backfills_lists_no_operator_suspend(store):
    store.create_supervisor(_spec(), "specs/clicks.yaml", actor="t")
    store.suspend_by_operator("clicks", "newcomer try", actor="cli:root")
    assert store.recent_audit(statuspage.RESET_ACTIONS) == []
    html = statuspage.render(all_status(store, with_latest=False), store.recent_audit(statuspage.RESET_ACTIONS),
                             (True, {"role": "leader"}), {})
    assert "<h2>Recent resets and backfills</h2>" in html and "operator-suspend" not in html


def test_the_words_of_status_and_of_a_reset_preview_are_explained():
    from reconciler.cli import cli

    text = CliRunner().invoke(cli, ["status", "--help"], terminal_width=120).output
    assert "records        records ingested so far" in text
    for word in ("new ", "backfill ", "skipped ", "reread "):
        assert any(line.strip().startswith(word) for line in text.split("reset's preview")[1].splitlines()), word
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs/operations.md").read_text()
    reading = doc.split("## Reading `status`")[1].split("\n## ")[0]
    assert "| records |" in reading and "| new / backfill / skipped / reread |" in reading

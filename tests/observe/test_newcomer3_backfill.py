"""Issue 46, the third newcomer run, item 2: a backfill's charts and audit disagreed with its table.

(a) a COMPLETED backfill's ingested/s chart said ``now ?`` (unknown) on both pages: it ingests
    nothing any more, ``now 0.0/s``;
(b) a backfill that ran between two looks charted its lag in time as ``max 0s`` although the main's
    chart showed 20 s at the reset: its first sample has the age of the oldest record of its range;
(c) a backfill done in one batch audited "75% of the range ingested" with ``done == total``: its
    completion is audited already, no progress entry; a partial one gets the highest milestone.

A real SQLite store and the daemon's observer; the broker is test_status_restarted.py's stand-in
(here with record times: the age of the records)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

import pytest

from reconciler.control.actual import State
from reconciler.control.requests import ResetRequest
from reconciler.control.resets import Positions, compute_reset
from reconciler.model import PartitionRange, Position
from reconciler.observe import lagwatch, statuspage, supervisorpage
from reconciler.observe.status import all_status
from tests.observe.test_status_restarted import Broker, _spec

BID = "clicks-backfill-1"


class Aged(Broker):
    """Records written ``age`` seconds ago (the one at offset 0 of partition 1 ``oldest`` ago)."""

    def __init__(self, latest, age=5.0, oldest=20.0):
        super().__init__(latest)
        self.age, self.oldest, self.asked = age, oldest, []

    def record_times(self, partitions):
        self.asked.append(dict(partitions))
        now_ms = time.time() * 1000
        return {p: int(now_ms - 1000 * (self.oldest if (p, o) == ("1", 0) else self.age))
                for p, o in partitions.items()}


def _backfill(store, ends=None) -> None:
    """``clicks`` reset to latest with a backfill of [0, end) per partition."""
    ends = ends or {"0": 30_000, "1": 20_000}
    store.create_supervisor(_spec(), "specs/clicks.yaml", actor="t")
    store.set_state("clicks", State.RUNNING)
    store.init_checkpoints("clicks", dict.fromkeys(ends, 0))
    request = ResetRequest("clicks", "cli:op@host:1", "cli", "op@host", Position("latest"), backfill=True)
    positions = Positions(earliest=dict.fromkeys(ends, 0), latest=ends)
    store.apply_reset(request, lambda cp: compute_reset(Position("latest"), cp, positions, backfill=True),
                      initial={}, actor="cli")


def _publish(store, ranges, batch="b1") -> None:
    store.publish(supervisor_id=BID, epoch=store.get(BID).epoch, batch_id=batch, datasource="clicks",
                  ranges=[PartitionRange(p, a, b) for p, (a, b) in ranges.items()], files=[],
                  records=sum(b - a for a, b in ranges.values()), unparseable=0)


def _progress(store) -> list[dict]:
    return [e["details"] for e in store.history(BID) if e["action"] == "backfill-progress"]


def test_a_backfill_done_in_one_batch_between_two_looks(store, monkeypatch):
    broker = Aged({"0": 30_000, "1": 20_000})
    monkeypatch.setattr(lagwatch, "adapter_for", lambda source, timeout: broker)
    _backfill(store)
    # its one batch committed, not yet marked COMPLETED (the runtime's next look does that)
    store.set_state(BID, State.RUNNING)
    _publish(store, {"0": (0, 30_000), "1": (0, 20_000)})
    observer = lagwatch.LagObserver(store, interval=10.0)
    observer.observe_once()
    assert _progress(store) == []  # not "75 %" with done == total: its completion is audited
    store.set_state(BID, State.COMPLETED, actor="reconciler", reason="every partition reached its end offset")
    observer.observe_once()
    assert _progress(store) == []
    assert [e["action"] for e in store.history(BID)][-1] == "completed"

    # (b) its first sample: the whole range behind, its oldest record 20 s old at its creation
    samples = observer.history(BID)
    created = store.get(BID).created_at
    assert samples[0][0] == created and samples[0][1] == 50_000
    # the oldest record was written 20 s before the look, which came just after the creation
    assert samples[0][2] == pytest.approx(20.0 - (time.time() - created.timestamp()), abs=2.0)
    assert {"0": 0, "1": 0} in broker.asked  # asked at the range's start, not at its end
    now = datetime.now(UTC) + timedelta(seconds=30)
    svg = statuspage.charts(samples, now, done=True)
    seconds = svg.split('class="chart lag-seconds"')[1].split("</svg>")[0]
    assert "max 0s" not in seconds and re.search(r"max (1[89]|20)s", seconds), seconds

    # (a) both pages: ingested/s "now 0.0/s", never "now ?", and the same figures
    rate = svg.split('class="chart ingest-rate"')[1].split("</svg>")[0]
    assert "now 0.0/s" in rate and "now ?" not in rate, rate
    [item] = [i for i in all_status(store, with_latest=False) if i["id"] == BID]
    page = supervisorpage.render(item, observed=None, samples=samples, batches=[], audit=[], now=now)
    own = page.split('class="chart ingest-rate"')[1].split("</svg>")[0]
    assert own.split("<title>")[1].split("</title>")[0] == rate.split("<title>")[1].split("</title>")[0]
    table = statuspage.render([item], [], (True, {}), {}, now, history={BID: samples})
    listed = table.split(f'id="charts-{BID}"')[1].split('class="chart ingest-rate"')[1].split("</svg>")[0]
    assert "now 0.0/s" in listed, listed


def test_a_running_backfill_keeps_its_unknown_now():
    """Only a completed one is known to ingest nothing: a running one's last slice is not measured."""
    start = datetime(2026, 11, 28, 13, 0, tzinfo=UTC)
    samples = [(start, 100, 1.0, 0), (start + timedelta(seconds=60), 40, 1.0, 60)]
    now = start + timedelta(seconds=400)
    running = statuspage.charts(samples, now).split('class="chart ingest-rate"')[1]
    done = statuspage.charts(samples, now, done=True).split('class="chart ingest-rate"')[1]
    assert "now ?" in running and "now 0.0/s" in done


@pytest.mark.parametrize("done, percent", [
    pytest.param(12_000, [], id="under 25 %"),
    pytest.param(26_000, [50], id="past half: the highest passed, once"),
    pytest.param(40_000, [75], id="80 %"),
    pytest.param(49_999, [75], id="one short"),
])
def test_a_milestone_is_the_highest_passed_and_never_of_a_done_range(store, monkeypatch, done, percent):
    monkeypatch.setattr(lagwatch, "adapter_for", lambda source, timeout: Aged({"0": 30_000, "1": 20_000}))
    _backfill(store)
    store.set_state(BID, State.RUNNING)
    first = min(done, 30_000)
    _publish(store, {"0": (0, first)} | ({"1": (0, done - first)} if done > first else {}))
    observer = lagwatch.LagObserver(store, interval=10.0)
    observer.observe_once()
    observer.observe_once()
    got = _progress(store)
    assert [d["percent"] for d in got] == percent
    assert all(d["done"] < d["total"] for d in got)
    # the rest in one batch: complete, no "75 %" or "100 %" entry after it
    _publish(store, {"1": (max(0, done - 30_000), 20_000)} | ({"0": (first, 30_000)} if first < 30_000 else {}),
             batch="b2")
    observer.observe_once()
    assert [d["percent"] for d in _progress(store)] == percent


def test_a_backfills_first_lag_in_time_is_its_oldest_records_age_on_kafka(store, kafka_broker, topic):
    """(b) against a real broker: the record at the range's start is two minutes old."""
    import devservices
    from reconciler.model import SupervisorSpec

    name = topic(partitions=1)
    t0 = int(time.time() * 1000) - 120_000
    devservices.produce_kafka(kafka_broker.bootstrap, name, [(f"k{i}", b"{}", t0 + i) for i in range(100)],
                              partition_of=lambda k, v: 0)
    doc = {"id": "clicks", "source": {"type": "kafka", "bootstrapServers": kafka_broker.bootstrap, "topic": name},
           "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"}}}
    store.create_supervisor(SupervisorSpec.from_document(doc), None, actor="t")
    store.set_state("clicks", State.RUNNING)
    store.init_checkpoints("clicks", {"0": 40})
    request = ResetRequest("clicks", "cli:op@host:1", "cli", "op@host", Position("latest"), backfill=True)
    positions = Positions(earliest={"0": 0}, latest={"0": 100})
    store.apply_reset(request, lambda cp: compute_reset(Position("latest"), cp, positions, backfill=True),
                      initial={}, actor="cli")
    started = time.time()
    _publish(store, {"0": (40, 100)})  # it ran between two looks
    store.set_state(BID, State.COMPLETED, actor="reconciler")
    observer = lagwatch.LagObserver(store, interval=5.0)
    observer.observe_once()
    first = observer.history(BID)[0]
    created = store.get(BID).created_at.timestamp()
    assert first.records == 60
    # the record at offset 40 (written at t0 + 40 ms), as old as it was when the backfill was made
    assert first.seconds == pytest.approx(created - (t0 + 40) / 1000, abs=0.01), first
    assert 119 <= first.seconds <= 121 + (time.time() - started)

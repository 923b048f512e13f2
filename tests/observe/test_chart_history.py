"""Issue 46, the second newcomer run: the lag charts forgot on a restart, a fast backfill was
charted "lag max 0, ingested 0", and the two pages drew different records per second.

1. The observer's samples are kept in the database (the last hour, pruned as they are written):
   a restarted daemon or a new leader loads them in its first round and the charts go on, and a
   daemon that does not lead charts them too. On SQLite and PostgreSQL.
2. A backfill first met after it had read everything (seen RUNNING at lag 0 with all it ingested,
   then COMPLETED) charts its run from its creation: its range behind, nothing ingested yet.
3. Ingested/s has one definition: the status page and the supervisor page draw the same figures.

The stores are real databases; the broker is the stand-in of test_status_restarted.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reconciler.control.actual import State
from reconciler.control.requests import ResetRequest
from reconciler.control.resets import Positions, compute_reset
from reconciler.model import PartitionRange, Position
from reconciler.observe import charts, lagwatch, statuspage, supervisorpage
from reconciler.observe.charts import timechart
from reconciler.observe.lagwatch import LagObserver
from reconciler.observe.status import all_status
from reconciler.store.store import Store
from tests.observe.test_status_restarted import Broker, _spec

T0 = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)


def _ticks(start: datetime, step: float = 10.0):
    at = [start]

    def tick() -> datetime:
        at[0] += timedelta(seconds=step)
        return at[0]
    return tick, at


def _head(svg: str, chart: str) -> str:
    """The "now … · max …" of one chart."""
    return svg.split(f'class="chart {chart}"')[1].split("<title>")[1].split("</title>")[0]


@pytest.fixture
def broker(monkeypatch) -> Broker:
    b = Broker({"0": 20, "1": 20})
    monkeypatch.setattr(lagwatch, "adapter_for", lambda source, timeout: b)
    return b


def test_the_charts_go_on_after_a_restart_and_keep_an_hour(db_url, broker):
    store = Store(db_url)
    store.migrate()
    store.create_supervisor(_spec(), "specs/clicks.yaml", actor="t")
    store.set_state("clicks", State.RUNNING)
    store.init_checkpoints("clicks", {"0": 15, "1": 15})
    tick, at = _ticks(T0)
    first = LagObserver(store, interval=10.0, clock=tick)
    first.observe_once()
    broker.latest_ = {"0": 40, "1": 20}
    first.observe_once()
    before = first.history("clicks")
    assert [s.records for s in before] == [10, 30]
    first.stop()
    store.close()

    # the daemon restarted (or another took the lead): its own store and observer
    again = Store(db_url)
    try:
        second = LagObserver(again, interval=10.0, clock=tick)
        second.observe_once()
        history = second.history("clicks")
        assert [(s.at, s.records, s.ingested) for s in history[:2]] == [(s.at, s.records, s.ingested) for s in before]
        assert [s.seconds for s in history[:2]] == pytest.approx([s.seconds for s in before], abs=0.001)
        assert len(history) == 3 and history[2].at == at[0]
        svg = statuspage.charts(history, at[0])
        assert "max 30" in _head(svg, "lag-records")  # the peak from before the restart

        # an hour later only the last hour is kept, in the database too
        at[0] += timedelta(hours=1)
        second.observe_once()
        stored = again.lag_samples(T0 - timedelta(days=1))
        assert [s.at for s in stored["clicks"]] == [at[0]]
        assert [s.at for s in second.history("clicks")] == [at[0]]
    finally:
        again.close()


def _backfill(store: Store) -> str:
    """``clicks`` reset to latest with a backfill of 150 records (100 + 50)."""
    store.create_supervisor(_spec(), "specs/clicks.yaml", actor="t")
    store.set_state("clicks", State.RUNNING)
    store.init_checkpoints("clicks", {"0": 0, "1": 0})
    request = ResetRequest("clicks", "cli:op@host:1", "cli", "op@host", Position("latest"), backfill=True)
    positions = Positions(earliest={"0": 0, "1": 0}, latest={"0": 100, "1": 50})
    store.apply_reset(request, lambda cp: compute_reset(Position("latest"), cp, positions, backfill=True),
                      initial={}, actor="cli")
    return "clicks-backfill-1"


def _read_all(store: Store, bid: str) -> None:
    store.set_state(bid, State.RUNNING)
    store.publish(supervisor_id=bid, epoch=store.get(bid).epoch, batch_id="b1", datasource="clicks",
                  ranges=[PartitionRange("0", 0, 100), PartitionRange("1", 0, 50)], files=[], records=150,
                  unparseable=0)


@pytest.mark.parametrize("first_look", ["running-at-lag-0", "completed"])
def test_a_fast_backfill_charts_the_range_it_read(store, broker, first_look):
    broker.latest_ = {"0": 100, "1": 50}
    bid = _backfill(store)
    created = store.get(bid).created_at
    tick, at = _ticks(datetime.now(UTC) + timedelta(seconds=5), step=5.0)
    observer = LagObserver(store, interval=5.0, clock=tick)
    _read_all(store, bid)  # its one batch published between two rounds: it has read everything
    if first_look == "running-at-lag-0":
        observer.observe_once()  # seen RUNNING, at lag 0, with all it ingested
    store.set_state(bid, State.COMPLETED)
    observer.observe_once()
    observer.observe_once()
    samples = observer.history(bid)
    # its creation: the whole range behind, nothing ingested, its oldest record's age (the stand-in's are at 0)
    assert samples[0] == (created, 150, created.timestamp(), 0)
    assert (samples[-1].records, samples[-1].ingested) == (0, 150)

    svg = statuspage.charts(samples, at[0])
    assert "now 0, max 150" in _head(svg, "lag-records")
    rate = _head(svg, "ingest-rate")
    assert "max ?" not in rate and "max 0.0/s" not in rate, rate


def test_both_pages_draw_the_same_records_per_second(store, broker):
    broker.latest_ = {"0": 100, "1": 50}
    bid = _backfill(store)
    tick, at = _ticks(datetime.now(UTC), step=7.0)
    observer = LagObserver(store, interval=7.0, clock=tick)
    observer.observe_once()
    _read_all(store, bid)
    store.set_state(bid, State.COMPLETED)
    for _ in range(3):
        observer.observe_once()
    samples, now = observer.history(bid), at[0] + timedelta(seconds=2)
    [item] = [i for i in all_status(store, with_latest=False) if i["id"] == bid]
    main = statuspage.charts(samples, now, done=True)  # as the status page draws a COMPLETED backfill's
    own = supervisorpage.render(item, observed=None, samples=samples, batches=store.recent_batches(bid, 20),
                                audit=[], now=now)
    assert _head(own, "ingest-rate") == _head(main, "ingest-rate")
    assert "max ?" not in _head(main, "ingest-rate")


def test_records_per_second_now_is_the_last_observation_between_two_rounds():
    """The slice after the last sample is not measured yet: "now" is the last figure, not "?"."""
    t0 = T0 - timedelta(minutes=5)
    totals = [(t0 + timedelta(seconds=5 * i), 100 * i) for i in range(59)]  # the last at T0 - 10 s
    rates = charts.ingest_rates(totals, T0 - timedelta(seconds=7))
    assert rates[-1][1] == pytest.approx(20.0)
    assert "now 20/s" in timechart(rates, T0 - timedelta(seconds=7), label="ingested/s", unit="/s")
    stale = charts.ingest_rates(totals, T0 + timedelta(seconds=30))  # no longer observed: unknown
    assert stale[-1][1] is None


def test_a_follower_page_charts_what_the_leader_keeps(store, broker):
    """A daemon that does not lead has no observer: its pages chart the samples the leader wrote."""
    from reconciler.daemon.http import HttpEndpoint
    from reconciler.observe.metrics import Metrics

    store.create_supervisor(_spec(), "specs/clicks.yaml", actor="t")
    store.set_state("clicks", State.RUNNING)
    store.init_checkpoints("clicks", {"0": 15, "1": 15})
    tick, _ = _ticks(datetime.now(UTC) - timedelta(minutes=1))
    leader = LagObserver(store, interval=10.0, clock=tick)
    leader.observe_once()
    broker.latest_ = {"0": 40, "1": 20}
    leader.observe_once()
    follower = HttpEndpoint(store, Metrics())
    for path in ("/", "/supervisors/clicks"):
        page = follower._status_page(path)  # noqa: SLF001 - the page as the HTTP handler renders it
        assert "now 30, max 30" in _head(page, "lag-records"), path
    broker.latest_ = {"0": 60, "1": 20}
    leader.observe_once()  # read by the follower's next rendering: only the rows written since
    page = follower._status_page("/")  # noqa: SLF001
    assert "now 50, max 50" in _head(page, "lag-records")
    assert [s.records for s in follower._stored.history(["clicks"], datetime.now(UTC))["clicks"]] == [10, 30, 50]  # noqa: SLF001


def test_a_followers_samples_keep_time_order_and_the_hour(store):
    from reconciler.observe.storedsamples import StoredSamples
    from reconciler.store.samples import LagSample

    now = datetime.now(UTC)
    stored = StoredSamples(store)
    store.save_lag_samples([LagSample("b", now - timedelta(seconds=10), 0, 0.0, 150)], keep_since=now - timedelta(hours=1))
    assert [s.ingested for s in stored.history(["b"], now)["b"]] == [150]
    # the leader met the backfill late: its creation's sample is written after, dated before
    store.save_lag_samples([LagSample("b", now - timedelta(minutes=2), 150, None, 0)], keep_since=now - timedelta(hours=1))
    assert [s.ingested for s in stored.history(["b"], now)["b"]] == [0, 150]
    later = now + timedelta(minutes=59)  # the creation's sample is over an hour old, the other not
    assert [s.ingested for s in stored.history(["b", "other"], later)["b"]] == [150]
    assert stored.history(["other"], later) == {"other": []}


def test_the_leaders_pages_do_not_show_idle_beside_the_lag_its_observer_sees(store, broker):
    """The database says IDLE (the runtime's last look found nothing), the observer sees records
    behind since: the pages show it RUNNING, with the note, as ``status`` does."""
    from types import SimpleNamespace

    from reconciler.daemon.http import HttpEndpoint
    from reconciler.observe.metrics import Metrics

    store.create_supervisor(_spec(), "specs/clicks.yaml", actor="t")
    store.set_state("clicks", State.IDLE)
    store.init_checkpoints("clicks", {"0": 20, "1": 20})
    tick, _ = _ticks(datetime.now(UTC) - timedelta(minutes=1))
    leader = LagObserver(store, interval=10.0, clock=tick)
    broker.latest_ = {"0": 100_020, "1": 20}
    leader.observe_once()
    endpoint = HttpEndpoint(store, Metrics(), SimpleNamespace(observer=leader, endpoints=lambda: []))
    for path in ("/", "/supervisors/clicks"):
        page = endpoint._status_page(path)  # noqa: SLF001 - the page as the HTTP handler renders it
        assert ">IDLE<" not in page and ">RUNNING<" in page, path

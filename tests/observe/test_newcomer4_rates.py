"""Issue 46.4, a fourth newcomer's run: a completed backfill's ingested/s peak kept changing.

"``clicks-backfill-1`` was COMPLETED; the 'max' label read 11,587, then 9,252, 10,376, 9,323...
over about 2 minutes, and 8,707 after a daemon restart; the status page and the supervisor page,
fetched in the same second, disagreed (10,376 vs 10,385)." The rate slices were 60 equal parts
of the span ending *now*, and a sample made up at *now* closed a finished range: every rendering
cut the same samples differently. A finished range's chart is now a fixed picture.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from reconciler.control.actual import State
from reconciler.model import PartitionRange
from reconciler.observe import charts, statuspage, supervisorpage
from reconciler.observe.lagwatch import LagObserver, Sample
from reconciler.observe.status import all_status
from reconciler.observe.storedsamples import StoredSamples
from reconciler.store.store import Store
from tests.observe.test_chart_history import _backfill, _ticks, broker  # noqa: F401 - a fixture

CREATED = datetime(2026, 11, 28, 14, 8, 3, 217_000, tzinfo=UTC)


def _run() -> list[Sample]:
    """A backfill of 600,000 records read in bursts, sampled every 5.3 s (never on a round second),
    from its creation's sample to its end."""
    out, total, at = [Sample(CREATED, 600_000, 90.0, 0)], 0, CREATED
    for burst in (0, 41_000, 62_000, 18_000, 55_000, 0, 70_000, 61_000, 33_000, 90_000, 77_000, 66_000, 27_000):
        at += timedelta(seconds=5.3)
        total += burst
        out.append(Sample(at, 600_000 - total, 30.0, total))
    out.append(Sample(at + timedelta(seconds=5.3), 0, 0.0, total))  # COMPLETED: lag 0 with all it ingested
    return out


def _head(html: str) -> str:
    return html.split('class="chart ingest-rate"')[1].split("<title>")[1].split("</title>")[0]


def _max(html: str) -> str:
    return re.search(r"max ([\d,.]+/s|\?)", _head(html)).group(1)


ITEM = {"id": "clicks-backfill-1", "kind": "backfill", "parent": "clicks", "state": "COMPLETED",
        "detailedState": "COMPLETED", "datasource": "clicks", "records": 600_000, "epoch": 1, "specHash": "h",
        "partitions": []}


def test_a_finished_ranges_peak_is_the_same_at_every_now_and_on_both_pages():
    samples = _run()
    end = samples[-1].at
    nows = [end + timedelta(seconds=s) for s in (0.4, 3.1, 17.9, 42.2, 61.0, 95.5, 121.3, 600.0)]
    peaks = {_max(statuspage.charts(samples, now, done=True)) for now in nows}
    peaks |= {_max(supervisorpage.render(ITEM, observed=None, samples=samples, batches=[], audit=[], now=now))
              for now in nows}
    assert len(peaks) == 1, peaks
    assert all("now 0.0/s" in _head(statuspage.charts(samples, now, done=True)) for now in nows)


def test_the_rate_buckets_start_on_fixed_clock_boundaries():
    samples = _run()
    totals = [(s.at, s.ingested) for s in samples]
    step = charts.rate_step([t for t, _ in totals])
    for now in (samples[-1].at + timedelta(seconds=2.5), samples[-1].at + timedelta(seconds=300)):
        rates = charts.ingest_rates(totals, now, done=True)
        # every point but "now" ends a bucket that is a multiple of the step since the epoch
        assert all(t.timestamp() % step == 0 for t, _ in rates if t != now)
    early = charts.ingest_rates(totals, samples[-1].at + timedelta(seconds=2.5), done=True)
    late = charts.ingest_rates(totals, samples[-1].at + timedelta(seconds=300), done=True)
    assert [p for p in early if p[0] < early[-1][0]] == late[:len(early) - 1]


def test_a_restart_draws_the_same_peak(db_url, broker):  # noqa: F811 - the fixture
    store = Store(db_url)
    store.migrate()
    broker.latest_ = {"0": 100, "1": 50}
    bid = _backfill(store)
    tick, at = _ticks(datetime.now(UTC), step=5.3)
    first = LagObserver(store, interval=5.3, clock=tick)
    first.observe_once()
    store.set_state(bid, State.RUNNING)
    cp = {"0": 0, "1": 0}
    for n, (p, upto) in enumerate((("0", 30), ("0", 80), ("1", 20), ("0", 100), ("1", 50))):
        store.publish(supervisor_id=bid, epoch=store.get(bid).epoch, batch_id=f"b{n}", datasource="clicks",
                      ranges=[PartitionRange(p, cp[p], upto)], files=[], records=upto - cp[p], unparseable=0)
        cp[p] = upto
        first.observe_once()
    store.set_state(bid, State.COMPLETED)
    first.observe_once()
    [item] = [i for i in all_status(store, with_latest=False) if i["id"] == bid]
    before = first.history(bid)
    seen = {_max(statuspage.charts(before, at[0] + timedelta(seconds=s), done=True)) for s in (1.0, 7.7, 44.0)}
    assert len(seen) == 1, seen
    first.stop()
    store.close()

    again = Store(db_url)  # the daemon restarted, a minute later
    try:
        at[0] += timedelta(seconds=60)
        second = LagObserver(again, interval=5.3, clock=tick)
        second.observe_once()
        now = at[0] + timedelta(seconds=1.9)
        after = second.history(bid)
        assert [s.ingested for s in after] == [s.ingested for s in before]
        page = supervisorpage.render(item, observed=None, samples=after, batches=[], audit=[], now=now)
        follower = StoredSamples(again).history([bid], now)[bid]  # a daemon that does not lead
        assert {_max(page), _max(statuspage.charts(follower, now, done=True))} == seen
    finally:
        again.close()

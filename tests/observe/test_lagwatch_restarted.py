"""Issue 46 (the newcomer's re-run): after a topic was re-created or truncated below a
supervisor's checkpoint, `status` said lag `?` with the reason, but the lag observer still
recorded latest minus checkpoint: 0 (or a few) in its samples, in `/metrics`' lag series and so
in the status page's charts, for a supervisor that reads nothing. It records the lag as unknown
now (a gap in the samples and charts, no lag series), and keeps the history before.

The supervisor is made UNHEALTHY by the real runtime step against a stand-in broker (as in
tests/observe/test_status_restarted.py); the database is a real SQLite file; the observer and
the metrics are the daemon's own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reconciler.control.actual import State
from reconciler.observe import lagwatch, statuspage
from reconciler.observe.lagwatch import LagObserver
from reconciler.observe.metrics import Metrics
from reconciler.runtime.supervisor import RuntimeContext, SupervisorRuntime
from tests.observe.test_status_restarted import Broker, _fewer, _more, _spec, _truncated

T0 = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize("after", [_fewer, _more, _truncated], ids=["fewer-records", "more-records", "truncated"])
def test_a_source_that_started_over_is_charted_as_unknown_after_its_kept_history(store, tmp_path, monkeypatch, after):
    broker = Broker({"0": 20, "1": 20}, topic_id=None if after is _truncated else "A")
    monkeypatch.setattr(lagwatch, "adapter_for", lambda source, timeout: broker)
    store.create_supervisor(_spec(), "specs/clicks.yaml", actor="t")
    store.set_state("clicks", State.RUNNING)
    store.init_checkpoints("clicks", {"0": 15, "1": 15})
    clock = iter(T0 + timedelta(seconds=10 * i) for i in range(10))
    metrics = Metrics()
    observer = LagObserver(store, interval=10.0, metrics=metrics, clock=lambda: next(clock))
    lag = metrics.registry.get_sample_value

    [before] = observer.observe_once()  # healthy: 5 behind per partition
    assert (before.records, before.unknown) == (10, None)
    assert lag("reconciler_partition_lag", {"supervisor": "clicks", "partition": "0"}) == 5

    rt = SupervisorRuntime("clicks", RuntimeContext(store=store, segments_dir=tmp_path, spark=lambda: None))
    rt._adapter_for = lambda rec: broker  # noqa: SLF001 - the stand-in broker
    broker.latest_ = {"0": 15, "1": 15}
    rt.step()  # caught up: topic A's id recorded
    after(broker)
    rt.step()
    assert store.get("clicks").state == State.UNHEALTHY_SUPERVISOR

    [o] = observer.observe_once()
    assert o.records is None and o.seconds is None, o
    assert o.unknown.startswith("unknown: the source started over below the checkpoints")
    assert [p.records for p in o.partitions] == [None, None]
    for p in ("0", "1"):  # absent is unknown, never 0; the checkpoint is still told
        assert lag("reconciler_partition_lag", {"supervisor": "clicks", "partition": p}) is None
        assert lag("reconciler_lag_seconds", {"supervisor": "clicks", "partition": p}) is None
        assert lag("reconciler_partition_checkpoint", {"supervisor": "clicks", "partition": p}) == 15

    history = observer.history("clicks")
    assert [(s.records, s.seconds is None) for s in history] == [(10, False), (None, True)]  # the history before kept
    page = statuspage.charts(history, T0 + timedelta(seconds=20))
    records_chart = page.split('class="chart lag-records"')[1].split("</svg>")[0]
    assert "now ? · max 10" in records_chart, records_chart  # a gap after the 10, never a 0

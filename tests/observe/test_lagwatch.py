"""The leader's lag observer against a real Tansu broker and a real SQLite store (issue 32): lag
in records and in time per partition into ``/metrics`` (``reconciler_lag_seconds``) and the
charts' samples; a policy's breach persisted with its audit entry and the pass rung when a reset
is due; a broker that is down gives unknown, not 0, within the bound; backfill milestones once.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

import devservices
from reconciler.control.actual import State
from reconciler.control.lagpolicy import policy_request
from reconciler.control.resets import Positions, compute_reset
from reconciler.model import PartitionRange, Position, SupervisorSpec
from reconciler.observe import lagwatch
from reconciler.observe.lagwatch import LagObserver
from reconciler.observe.metrics import Metrics
from reconciler.store.store import Store

pytestmark = [pytest.mark.kafka, pytest.mark.integration]

POLICY = {"maxRecords": 100, "for": "0s", "action": "resetToLatestAndBackfill", "cooldown": "10m"}



def create(store: Store, sid: str, bootstrap: str, topic: str, policy=POLICY) -> None:
    doc = {"id": sid, "source": {"type": "kafka", "bootstrapServers": bootstrap, "topic": topic},
           "dataSchema": {"datasource": sid, "timestamp": {"column": "ts"}}}
    if policy:
        doc["lagPolicy"] = policy
    store.create_supervisor(SupervisorSpec.from_document(doc), None, actor="test")
    store.set_state(sid, State.RUNNING)


def test_one_round(store, kafka_broker, topic):
    name = topic(partitions=2)
    started = time.monotonic()
    t0 = int(time.time() * 1000) - 600_000  # the records say they were written ten minutes ago
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name,
                                     [(f"k{i}", b"{}", t0 + i) for i in range(400)], partition_of=lambda k, v: 0)
    create(store, "clicks", kafka_broker.bootstrap, name)
    store.init_checkpoints("clicks", {"0": 100, "1": 0})  # partition 1 is empty: caught up
    metrics, rung = Metrics(), []
    observer = LagObserver(store, interval=5.0, metrics=metrics, on_due=lambda: rung.append(1))
    [seen] = observer.observe_once()
    assert seen.records == ends[0] - 100 == 300
    by_part = {p.partition: p for p in seen.partitions}
    assert by_part["1"].seconds == 0.0 and by_part["1"].records == 0
    elapsed = time.monotonic() - started
    assert 599 <= by_part["0"].seconds <= 601 + elapsed  # the record at the checkpoint: ten minutes old
    sample = metrics.registry.get_sample_value
    assert sample("reconciler_lag_seconds", {"supervisor": "clicks", "partition": "0"}) == by_part["0"].seconds
    assert sample("reconciler_partition_lag", {"supervisor": "clicks", "partition": "0"}) == 300
    assert sample("reconciler_lag_policy_breach", {"supervisor": "clicks"}) == 1
    o = store.lag_observations()["clicks"]
    assert o.records == 300 and o.breach_since is not None and o.fired_at is not None
    assert [e["reason"] for e in store.history("clicks") if e["action"] == "lag-breach"] == [
        "lag policy: 300 records > 100"]
    assert rung == [1]  # the reset is due: the pass is rung
    assert [s.records for s in observer.history("clicks")] == [300]
    # a second round: the breach keeps its start, announced once
    observer.observe_once()
    assert store.lag_observations()["clicks"].breach_since == o.breach_since
    assert len([e for e in store.history("clicks") if e["action"] == "lag-breach"]) == 1
    assert len(observer.history("clicks")) == 2
    # the policy's reset applied: the observation is from before it; the breach after it is a new one
    request = policy_request("clicks", store.get("clicks").spec.lag_policy, o)
    pos = Positions(earliest={"0": 0, "1": 0}, latest={"0": ends[0], "1": 0})
    store.apply_reset(request, lambda cp: compute_reset(Position("latest"), cp, pos, backfill=True),
                      initial={}, actor="policy")
    observer.observe_once()
    after = store.lag_observations()["clicks"]
    assert after.breach_since is None and after.records == 0
    assert [e["action"] for e in store.history("clicks")][-1] != "lag-breach-end"  # the reset's, not announced
    # the backfill is observed too, and its milestone recorded once
    store.set_state("clicks-backfill-1", State.RUNNING)
    store.publish(supervisor_id="clicks-backfill-1", epoch=1, batch_id="b1", datasource="clicks",
                  ranges=[PartitionRange("0", 100, 260)],
                  files=[], records=160, unparseable=0)
    observer.observe_once()
    observer.observe_once()
    progress = [e for e in store.history("clicks-backfill-1") if e["action"] == "backfill-progress"]
    assert [e["details"]["percent"] for e in progress] == [50]  # 160 of 300: the highest passed, once


def test_a_broker_that_is_down_is_unknown_within_the_bound(store):
    create(store, "gone", f"127.0.0.1:{devservices.free_port()}", "t")
    store.init_checkpoints("gone", {"0": 5})
    metrics = Metrics()
    observer = LagObserver(store, interval=5.0, metrics=metrics)
    started = time.monotonic()
    [seen] = observer.observe_once()
    assert time.monotonic() - started < 20  # bounded by the adapter's timeout, not by the broker
    assert seen.error and seen.records is None and seen.seconds is None
    o = store.lag_observations()["gone"]
    assert (o.records, o.seconds, o.breach_since) == (None, None, None)  # unknown starts no breach
    assert metrics.registry.get_sample_value("reconciler_lag_seconds", {"supervisor": "gone", "partition": "0"}) is None


def test_a_suspended_supervisor_is_observed_and_keeps_its_history_but_not_its_policy(store, kafka_broker, topic):
    """46.2: while suspended, its lag went on growing unseen (a stale 1,000 on the page, ``?`` for
    lag in time, no /metrics series) and its samples were dropped, so the chart after the resume
    had lost the burst. Observed while suspended, history kept; its policy's breach still ends."""
    name = topic(partitions=1)
    create(store, "paused", kafka_broker.bootstrap, name)
    devservices.produce_kafka(kafka_broker.bootstrap, name, [(f"k{i}", b"{}") for i in range(100)])
    store.init_checkpoints("paused", {"0": 0})
    store.publish(supervisor_id="paused", epoch=1, batch_id="b1", datasource="paused",
                  ranges=[PartitionRange("0", 0, 40)], files=[], records=40, unparseable=0)
    metrics = Metrics()
    observer = LagObserver(store, interval=5.0, metrics=metrics)
    observer.observe_once()
    assert "paused" in store.lag_observations()
    store.set_state("paused", State.SUSPENDED)
    devservices.produce_kafka(kafka_broker.bootstrap, name, [(f"b{i}", b"{}") for i in range(500)])
    [seen] = observer.observe_once()
    assert "paused" not in store.lag_observations()  # its policy is not watched while suspended
    assert seen.supervisor_id == "paused" and seen.records == 600 - 40 and seen.seconds is not None
    sample = metrics.registry.get_sample_value
    assert sample("reconciler_partition_lag", {"supervisor": "paused", "partition": "0"}) == 560
    assert sample("reconciler_lag_seconds", {"supervisor": "paused", "partition": "0"}) is not None
    assert observer.snapshot()["paused"].records == 560
    store.set_state("paused", State.RUNNING)  # resumed: the suspension's samples are still there
    observer.observe_once()
    history = observer.history("paused")
    assert [s.records for s in history] == [60, 560, 560]
    assert {s.ingested for s in history} == {40}  # records ingested so far, for the records/s chart
    store.set_state("paused", State.COMPLETED)  # as a backfill ends: not observed, its run still charted
    assert observer.observe_once() == [] and len(observer.history("paused")) == 4
    # ... ending at lag 0 with all it ingested (issue 46: "now 560" beside a table saying 0), once
    assert observer.observe_once() == [] and observer.history("paused")[3][1:] == (0, 0.0, 40)
    assert len(observer.history("paused")) == 4
    store.set_state("paused", State.TERMINATED)
    assert observer.observe_once() == [] and observer.history("paused") == []  # gone: its history too


# --------------------------------------------------------------------------- issue 41


class Clock:
    """The observer's clock, moved by the test: rounds 5 s apart without waiting for them."""

    def __init__(self):
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def tick(self, seconds: float = 5.0) -> None:
        self.now += timedelta(seconds=seconds)


def test_a_lag_at_its_threshold_alternating_every_round_is_one_breach(store, kafka_broker, topic):
    """41.7: 101 / 99 records behind a threshold of 100, round after round, for two minutes: one
    breach (one audit entry, one webhook event), and its end once the lag stayed under."""
    name = topic(partitions=1)
    produced = devservices.produce_kafka(kafka_broker.bootstrap, name, [(f"k{i}", b"{}") for i in range(101)])[0]
    create(store, "hover", kafka_broker.bootstrap, name, {"maxRecords": 100, "for": "0s", "action": "alert"})
    store.init_checkpoints("hover", {"0": 0})
    clock = Clock()
    observer = LagObserver(store, interval=5.0, clock=clock)
    checkpoint, lags = 0, []
    for i in range(24):
        if i % 2:  # a batch of 2 lands: 99 behind
            store.publish(supervisor_id="hover", epoch=1, batch_id=f"b{i}", datasource="hover",
                          ranges=[PartitionRange("0", checkpoint, checkpoint + 2)], files=[], records=2, unparseable=0)
            checkpoint += 2
        elif i:  # 2 more records arrive: 101 behind
            produced = devservices.produce_kafka(kafka_broker.bootstrap, name, [("k", b"{}"), ("k", b"{}")])[0]
        [seen] = observer.observe_once()
        lags.append(seen.records)
        clock.tick()
    assert lags == [101, 99] * 12 and produced - checkpoint == 99
    policy_entries = [e["action"] for e in store.history("hover") if e["action"].startswith("lag-breach")]
    assert policy_entries == ["lag-breach"]
    for _ in range(13):  # under for a minute (RECOVER_MIN, as for is 0s): the breach ends, once
        observer.observe_once()
        clock.tick()
    policy_entries = [e["action"] for e in store.history("hover") if e["action"].startswith("lag-breach")]
    assert policy_entries == ["lag-breach", "lag-breach-end"]
    assert store.lag_observations()["hover"].breach_since is None


@pytest.mark.parametrize("how", ["stored-for-beyond-the-bound", "evaluation-raises"])
def test_one_poisoned_policy_does_not_end_the_round_for_the_others(store, kafka_broker, topic, monkeypatch,
                                                                  caplog, how):
    """41.1: a policy whose deadline overflowed ended the observer's round: the other supervisors'
    due resets were never rung for, and the backfill milestones never recorded."""
    name = topic(partitions=1)
    devservices.produce_kafka(kafka_broker.bootstrap, name, [(f"k{i}", b"{}") for i in range(300)])
    if how == "stored-for-beyond-the-bound":  # stored before the bound existed: its document only
        doc = {"id": "a-bad", "source": {"type": "kafka", "bootstrapServers": kafka_broker.bootstrap, "topic": name},
               "dataSchema": {"datasource": "a-bad", "timestamp": {"column": "ts"}}}
        poisoned = {**doc, "lagPolicy": {"maxRecords": 10, "for": "100000000h"}}
        store.create_supervisor(replace(SupervisorSpec.from_document(doc), document=poisoned), None, actor="test")
        store.set_state("a-bad", State.RUNNING)
    else:
        create(store, "a-bad", kafka_broker.bootstrap, name)
        real = lagwatch.decide

        def decide(rec, *args, **kwargs):
            if rec.id == "a-bad":
                raise OverflowError("date value out of range")
            return real(rec, *args, **kwargs)

        monkeypatch.setattr(lagwatch, "decide", decide)
    create(store, "b-good", kafka_broker.bootstrap, name)
    store.init_checkpoints("a-bad", {"0": 0})
    store.init_checkpoints("b-good", {"0": 0})
    rung = []
    observer = LagObserver(store, interval=5.0, on_due=lambda: rung.append(1))
    observer.observe_once()
    assert rung == [1]  # b-good's reset is due: the pass is rung all the same
    assert store.lag_observations()["b-good"].fired_at is not None
    observer.observe_once()
    if how == "evaluation-raises":  # said for its supervisor, once while it lasts
        said = [r.getMessage() for r in caplog.records if "cannot be evaluated" in r.getMessage()]
        assert said == ["lag policy of a-bad cannot be evaluated: OverflowError: date value out of range; "
                        "skipped, the other supervisors' policies go on"]

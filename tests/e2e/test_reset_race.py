"""The two duplicate windows Druid documents for reset-and-backfill, shown closed.

* **Backfill overlap**: a main batch in flight when the reset lands read from the old
  checkpoint C, which the backfill now covers. Here its publish loses the
  compare-and-swap (the reset bumped the epoch) and its output is discarded. The loop
  below resets while a main batch is really in flight, with records produced all the
  time: a gate holds the main's batch job (the real Spark job) before or after it runs
  until the reset has landed, so every reset meets a batch in flight however fast
  batches are, and each must cost that batch its publish (the
  ``reconciler_publish_conflicts`` metric): the window is exercised, not dodged.
* **Reset race**: a checkpoint published between capturing the offsets and applying the
  reset. Here the reset recomputes on the checkpoint it reads under lock in the one
  transaction. The second test makes a real publish land exactly in that gap.

Both end with every key in the segments exactly once, and every offset of every
partition in exactly one committed batch (main or backfill).
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

import devservices
from reconciler.control import positions as positions_mod
from reconciler.control.apply import Applier
from reconciler.control.plan import Action, ActionKind
from reconciler.control.requests import from_cli
from reconciler.daemon import Daemon
from reconciler.model import Position
from reconciler.store.store import Store
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

SID = "race"


class Producer(threading.Thread):
    """Produces keyed records to a topic all the time, ``chunk`` per call, until stopped."""

    def __init__(self, bootstrap: str, topic_name: str, chunk: int = 100, pause: float = 0.2):
        super().__init__(name="producer", daemon=True)
        self.bootstrap, self.topic_name, self.chunk, self.pause = bootstrap, topic_name, chunk, pause
        self.next = 0
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                devservices.produce_kafka(self.bootstrap, self.topic_name,
                                          devservices.make_records(self.chunk, start=self.next))
                self.next += self.chunk
                self._stop_event.wait(self.pause)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> list[str]:
        """Stop after the call under way (which leaves Tansu's latest exact); the keys produced."""
        self._stop_event.set()
        self.join(60)
        assert not self.is_alive() and self.error is None, self.error
        return [f"k{i:06d}" for i in range(self.next)]


class BackgroundDaemon:
    """The daemon in a thread of this process (no signal handlers there), stopped like SIGTERM."""

    def __init__(self, settings):
        self.daemon = Daemon(settings)
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, name="daemon", daemon=True)

    def _run(self) -> None:
        self.code = self.daemon.run()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.daemon.request_stop()
        self.thread.join(120)
        assert not self.thread.is_alive(), "the daemon did not stop"

    def in_flight(self, sid: str):
        manager = self.daemon.manager
        return manager.running.get(sid) if manager is not None else None

    def running_step(self, sid: str):
        """The supervisor's step future while it executes (not while it waits for a worker)."""
        fut = self.in_flight(sid)
        return fut if fut is not None and fut.running() else None

    def conflicts(self, sid: str) -> float:
        return self.daemon.metrics.registry.get_sample_value("reconciler_publish_conflicts_total",
                                                            {"supervisor": sid}) or 0.0


class BatchGate:
    """Holds one main batch in flight at a time: its job waits, before or after the real
    Spark run, until the test releases it (backfills' batches pass freely)."""

    def __init__(self, monkeypatch):
        from reconciler.runtime import jobs

        self._run = jobs.SparkJob.run
        self._lock = threading.Lock()
        self._armed: str | None = None  # "before" or "after" the run
        self.held = threading.Event()
        self._release = threading.Event()
        gate = self

        def run(job, spec, *args, **kwargs):
            when = gate._take(spec.id)
            if when == "before":
                gate._hold()
            written = gate._run(job, spec, *args, **kwargs)
            if when == "after":
                gate._hold()
            return written

        monkeypatch.setattr(jobs.SparkJob, "run", run)

    def arm(self, when: str) -> None:
        with self._lock:
            self.held.clear()
            self._release.clear()
            self._armed = when

    def release(self) -> None:
        self._release.set()

    def _take(self, sid: str) -> str | None:
        with self._lock:
            if sid != SID or self._armed is None:
                return None
            when, self._armed = self._armed, None
            return when

    def _hold(self) -> None:
        self.held.set()
        if not self._release.wait(120):
            raise AssertionError("the test never released the batch it held")


def wait_for(condition, timeout: float, what: str, every: float = 0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def cli_reset(store: Store, settings, reason: str):
    """What ``reconciler reset race --to latest --backfill --reason ...`` does (in this process)."""
    req = from_cli(SID, Position("latest"), operation_id=uuid.uuid4().hex[:12], reason=reason)
    [res] = Applier(store, actor=f"cli:{req.source}", state_dir=settings.state_path).apply(
        [Action(ActionKind.RESET_AND_BACKFILL, SID, req.describe(), request=req)])
    assert res.ok, res.message
    return res


def assert_offsets_tiled(settings, ends: dict[str, int]) -> None:
    """Every offset of every partition in exactly one committed batch, main or backfill."""
    spans = collections.defaultdict(list)
    for b in h.batches(settings):
        for p, start, end in b["ranges"]:
            if end > start:
                spans[p].append((start, end))
    for p, end in ends.items():
        got = sorted(spans[p])
        assert got[0][0] == 0 and got[-1][1] == end, (p, got[:3], got[-3:], end)
        gaps = [(a, b) for a, b in zip(got, got[1:], strict=False) if a[1] != b[0]]
        assert not gaps, f"partition {p}: overlapping or missing ranges {gaps[:5]}"


def finish_and_check(spark, settings, store: Store, expected_keys: list[str], resets: int) -> None:
    code, _ = h.run_daemon(settings, timeout=240)
    assert code == 0, "did not catch up after the loop"
    h.assert_exactly_once(h.key_counts(spark, settings, SID), expected_keys)
    actual = store.read_actual()
    bfs = sorted(sid for sid, r in actual.supervisors.items() if r.parent_id == SID)
    assert all(str(actual.supervisors[b].state) == "COMPLETED" for b in bfs)
    # A reset that skipped nothing made no backfill and is recorded as 'reset'.
    assert len([e for e in store.history(SID) if e["action"] in ("reset-and-backfill", "reset")]) == resets
    assert len(bfs) <= resets
    latest = positions_mod.capture(store.get(SID).spec, Position("latest"), datetime.now(UTC))[0].latest
    assert store.checkpoints(SID) == latest
    assert_offsets_tiled(settings, latest)
    assert h.staging_leftovers(settings) == []  # the discarded batches' files are gone


@pytest.mark.parametrize("iterations", [pytest.param(10, id="x10"),
                                        pytest.param(40, id="x40", marks=pytest.mark.soak)])
def test_reset_lands_while_a_main_batch_is_in_flight(spark, kafka_broker, topic, tmp_path, db_url, iterations,
                                                     monkeypatch):
    name = topic(partitions=2)
    s = h.make_settings(tmp_path, db_url)
    h.write_spec(s.specs, h.spec_doc(SID, h.kafka_source(kafka_broker.bootstrap, name, **{"fetch.queue.backoff.ms": 10}),
                                     task_duration="200ms", max_batch_records=4000))
    store = Store(s.db_url)
    store.migrate()  # before the daemon thread does: the test reads the tables at once
    gate = BatchGate(monkeypatch)
    producer = Producer(kafka_broker.bootstrap, name)
    producer.start()
    log: list[tuple[str, str, bool]] = []
    try:
        with BackgroundDaemon(s) as bg:
            wait_for(lambda: sum(store.checkpoints(SID).values()) > 0, 120, "the first main batch")
            for i in range(iterations):
                # The reset lands while the main's batch, cut from checkpoint C, is held: before
                # its Spark job reads, or after its files are written and before its publish.
                when = "before" if i % 4 < 2 else "after"
                gate.arm(when)
                wait_for(gate.held.is_set, 60, "a main batch in flight")
                fut = bg.in_flight(SID)
                assert fut is not None and not fut.done()
                before = bg.conflicts(SID)
                if i % 2 == 0:
                    trigger = "cli"
                    cli_reset(store, s, f"race {i}")
                else:  # the daemon's own tick applies a marker, while its runtime ingests
                    trigger = "marker"
                    marker = Path(s.specs) / f"{SID}.reset.yaml"
                    marker.write_text(f"reason: race {i}\n")
                    wait_for(lambda m=marker: not m.exists(), 60, "the marker to be consumed")
                    assert not fut.done()
                gate.release()
                wait_for(fut.done, 60, "the batch in flight to end")
                log.append((trigger, when, bg.conflicts(SID) > before))
        keys = producer.stop()
    finally:
        gate.release()
        if producer.is_alive():
            producer.stop()
    print(f"\n{iterations} resets during main batches: {log}")
    # Every reset landed while a main batch cut from the old checkpoint was in flight, so
    # every such batch lost its compare-and-swap and was discarded.
    assert all(hit for _, _, hit in log), log
    finish_and_check(spark, s, store, keys, iterations)
    store.close()


def test_publish_between_capture_and_reset_is_not_overwritten(spark, kafka_broker, topic, tmp_path, db_url):
    """Druid's 'reset race': a checkpoint written after the offsets were captured.

    The applier's capture is the real one, then waits until the running daemon has
    really published a main batch, so the reset transaction starts from a checkpoint
    newer than the one the capture saw. The reset must build on the newer one.
    """
    name = topic(partitions=2)
    s = h.make_settings(tmp_path, db_url)
    h.write_spec(s.specs, h.spec_doc(SID, h.kafka_source(kafka_broker.bootstrap, name, **{"fetch.queue.backoff.ms": 10}),
                                     task_duration="200ms", max_batch_records=4000))
    store = Store(s.db_url)
    store.migrate()  # before the daemon thread does: the test reads the tables at once
    producer = Producer(kafka_broker.bootstrap, name)
    producer.start()
    stale: list[dict[str, int]] = []

    def capture_then_let_a_publish_land(spec, position, now):
        seen = store.checkpoints(SID)
        captured = positions_mod.capture(spec, position, now)
        stale.append(seen)
        wait_for(lambda: store.checkpoints(SID) != seen, 60, "a main publish after the capture")
        return captured

    try:
        with BackgroundDaemon(s):
            wait_for(lambda: sum(store.checkpoints(SID).values()) > 0, 120, "the first main batch")
            for i in range(3):
                req = from_cli(SID, Position("latest"), operation_id=uuid.uuid4().hex[:12], reason=f"gap {i}")
                applier = Applier(store, actor="cli:test", state_dir=s.state_path,
                                  capture=capture_then_let_a_publish_land)
                [res] = applier.apply([Action(ActionKind.RESET_AND_BACKFILL, SID, req.describe(), request=req)])
                assert res.ok, res.message
                used = {p["partition"]: p["checkpoint"] for p in res.details["partitions"]}
                # The reset started from the checkpoint the publish left, not the one seen at capture
                # (which a blind overwrite would have moved back to, ingesting that batch twice).
                assert all(used[p] >= stale[-1][p] for p in used) and used != stale[-1], (stale[-1], used)
                for p in res.details["partitions"]:
                    assert p["new"] == max(p["checkpoint"], p["latest"])
                time.sleep(0.5)
        keys = producer.stop()
    finally:
        if producer.is_alive():
            producer.stop()
    finish_and_check(spark, s, store, keys, 3)
    store.close()

"""Fault injection: SIGKILL at every named crash point with production going on, a broker
stopped and restarted mid-batch, a busy SQLite, PostgreSQL connections dropped
mid-transaction, and a segments directory that cannot be written.

After each fault: every key exactly once in ``<segments>/<datasource>``, the checkpoints
equal to what the committed batches cover, no staging leftovers, and the supervisor
healthy again. ``test_randomized_crashes`` runs 12 crash runs (a separate
``reconciler run`` process each, killed by ``reconciler.faults``); its ``soak`` twin runs
100 (``scripts/test.sh tests/faults --soak -s``). The seed is printed and can be set
with ``RECONCILER_FAULT_SEED``.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

import devservices
from reconciler.control.actual import State
from reconciler.store.store import Store
from tests.e2e import helpers as h

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SID = "faulty"
POINTS = ("after-write", "before-commit", "after-commit", "inside-reset", "after-reset", "mid-backfill")
RESET_POINTS = ("inside-reset", "after-reset", "mid-backfill")
HEALTHY = (State.RUNNING, State.IDLE)


class Producer(threading.Thread):
    """Produces keyed records to a Kafka topic continuously until stopped."""

    def __init__(self, bootstrap: str, topic: str, chunk: int = 300, pause: float = 0.3):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.chunk, self.pause = bootstrap, topic, chunk, pause
        self.produced = 0
        self.ends: dict[str, int] = {}
        self.error: BaseException | None = None
        self._stop_evt = threading.Event()

    def produce(self, n: int) -> None:
        ends = devservices.produce_kafka(self.bootstrap, self.topic,
                                         devservices.make_records(n, start=self.produced))
        self.produced += n
        for p, e in ends.items():
            self.ends[str(p)] = max(e, self.ends.get(str(p), 0))

    def run(self) -> None:
        try:
            while not self._stop_evt.is_set():
                self.produce(self.chunk)
                self._stop_evt.wait(self.pause)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(120)
        assert self.error is None, f"producer failed: {self.error!r}"


def check_final(spark, s, store: Store, expected_keys, ends: dict[str, int], datasource: str = SID) -> None:
    """Exactly once, checkpoints == committed coverage, no staging, every supervisor healthy."""
    h.assert_exactly_once(h.key_counts(spark, s, datasource), expected_keys)
    done = h.batches(s)
    h.assert_batches_tile(done, ends)  # main + backfills: every offset in exactly one batch
    assert all(b["status"] == "committed" for b in done)
    assert store.checkpoints(SID) == ends
    assert h.undiscarded_leftovers(s, store) == {}  # a discarded write's files are orphan clean-up's
    for sid, rec in store.read_actual().supervisors.items():
        if rec.bounded:
            assert rec.state == State.COMPLETED, (sid, rec.state)
        else:
            assert rec.state in HEALTHY, (sid, rec.state, rec.detailed_state)


# --------------------------------------------------------------------------- randomized SIGKILLs


def _crash_run(s, point: str, after: int, i: int, rng: random.Random, limit: float) -> bool:
    """One ``reconciler run`` subprocess armed with a crash point; True if it was hit."""
    env = {**os.environ, **h.settings_env(s), "PYSPARK_PYTHON": sys.executable,
           "RECONCILER_CRASH_AFTER": str(after)}
    if point in RESET_POINTS:
        Path(s.specs, f"{SID}.reset.yaml").write_text(f"resetTo: latest\nreason: fault run {i}\n")
    if point == "mid-backfill":
        env["RECONCILER_CRASH_AT"] = rng.choice(["after-write", "before-commit", "after-commit"])
        env["RECONCILER_CRASH_SUPERVISOR"] = f"{SID}-backfill"
    else:
        env["RECONCILER_CRASH_AT"] = point
    proc = subprocess.Popen([str(h.RECONCILER_BIN), "run"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)  # not reached in time: kill it the same way, count "not hit"
        proc.communicate()
        return False
    assert proc.returncode == -9, f"run {i} ({point}) exited {proc.returncode}\n{err[-3000:]}"
    return True


def _randomized_crashes(spark, tmp_path, kafka_broker, topic, runs: int) -> None:
    seed = int(os.environ.get("RECONCILER_FAULT_SEED") or random.randrange(2**32))
    print(f"\nfault seed: {seed} (RECONCILER_FAULT_SEED={seed} to replay)")
    rng = random.Random(seed)
    name = topic(partitions=4)
    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc(SID, h.kafka_source(kafka_broker.bootstrap, name, **{"fetch.queue.backoff.ms": 10}),
                                     task_count=2, max_batch_records=2000))
    started = time.monotonic()
    producer = Producer(kafka_broker.bootstrap, name)
    producer.produce(2000)
    producer.start()
    injected: collections.Counter = collections.Counter()
    hit: collections.Counter = collections.Counter()
    try:
        for i in range(runs):
            point, after = rng.choice(POINTS), rng.randint(0, 2)
            if point in RESET_POINTS:
                after = 0  # one marker means one reset per run, and a backfill may be one batch long
            injected[point] += 1
            t0 = time.monotonic()
            got = _crash_run(s, point, after, i, rng, limit=90.0)
            hit[point] += got
            print(f"run {i}: {point} after {after}: {'hit' if got else 'not hit'} in {time.monotonic() - t0:.0f}s",
                  flush=True)
    finally:
        producer.stop()
    code, _ = h.run_daemon(s, timeout=300)  # recovery + catch-up, in this process
    assert code == 0
    store = Store(s.db_url)
    try:
        counts = h.key_counts(spark, s, SID)
        expected = h.keys(devservices.make_records(producer.produced))
        summary = {
            "seed": seed, "runs": runs, "injected": dict(sorted(injected.items())), "hit": dict(sorted(hit.items())),
            "hits": sum(hit.values()), "records": producer.produced,
            "losses": len(set(expected) - set(counts)), "duplicates": sum(1 for n in counts.values() if n > 1),
            "backfills": sum(1 for r in store.read_actual().supervisors.values() if r.bounded),
            "seconds": round(time.monotonic() - started),
        }
        print("fault summary: " + json.dumps(summary))
        check_final(spark, s, store, expected, producer.ends)
        assert sum(hit.values()) >= min(15, runs * 3 // 4), summary
    finally:
        store.close()


@pytest.mark.kafka
@pytest.mark.timeout(1800)
def test_randomized_crashes(spark, tmp_path, kafka_broker, topic):
    _randomized_crashes(spark, tmp_path, kafka_broker, topic, runs=int(os.environ.get("RECONCILER_FAULT_RUNS", "12")))


@pytest.mark.soak
@pytest.mark.timeout(7200)
@pytest.mark.kafka
def test_randomized_crashes_soak(spark, tmp_path, kafka_broker, topic):
    _randomized_crashes(spark, tmp_path, kafka_broker, topic, runs=100)


# --------------------------------------------------------------------------- faults while the daemon runs in-process


def wait_for(what: str, cond, timeout: float = 120.0, every: float = 0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def run_with_fault(s, fault, timeout: float = 240.0) -> dict:
    """The daemon in this process (main thread: it installs signal handlers) until caught up,
    while ``fault(notes)`` runs in a thread; returns the notes the fault wrote."""
    notes: dict = {}
    errors: list[BaseException] = []

    def body():
        try:
            fault(notes)
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    code, _ = h.run_daemon(s, timeout=timeout)
    t.join(180)
    if errors:
        raise errors[0]
    assert not t.is_alive(), "the fault thread did not finish"
    assert code == 0, f"daemon did not catch up (exit {code}); notes {notes}"
    return notes


def first_batch_committed(s):
    def committed():
        try:
            return h.batches(s, SID)
        except Exception:  # noqa: BLE001 - the daemon has not created its tables yet
            return []

    return wait_for("a first committed batch", committed, timeout=150)


def kafka_setup(tmp_path, kafka_broker, topic, n: int, db: str = "", partitions: int = 2):
    name = topic(partitions=partitions)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(n))
    s = h.make_settings(tmp_path, db=db)
    h.write_spec(s.specs, h.spec_doc(SID, h.kafka_source(kafka_broker.bootstrap, name, **{"fetch.queue.backoff.ms": 10}),
                                     task_count=2, max_batch_records=1500))
    return s, {str(p): e for p, e in ends.items()}


@pytest.mark.rabbitmq
def test_broker_restart_mid_batch(spark, tmp_path):
    """RabbitMQ's stream listener goes away mid-run (``stop_app``; the node and its stream
    data stay) and comes back: LOST_CONTACT_WITH_STREAM, then recovery, exactly once."""
    n = 24_000
    node = devservices.RabbitNode().start()  # our own node: stopping it must not break other tests
    try:
        streams = ["restart-0", "restart-1"]
        per = {st: [] for st in streams}
        records = devservices.make_records(n)
        for i, rec in enumerate(records):
            per[streams[i % 2]].append(rec)
        for st in streams:
            node.create_stream(st)
            devservices.produce_rabbit(node.stream_uri, st, per[st])
        s = h.make_settings(tmp_path)
        h.write_spec(s.specs, h.spec_doc(SID, h.rabbit_source(node.stream_uri, streams), task_count=2,
                                         max_batch_records=1000))

        def fault(notes):
            first_batch_committed(s)
            node.ctl("stop_app", timeout=90)
            store = Store(s.db_url)
            try:
                rec = wait_for("LOST_CONTACT_WITH_STREAM",
                               lambda: (r := store.get(SID)) and str(r.detailed_state) == "LOST_CONTACT_WITH_STREAM" and r,
                               timeout=120)
                notes["lost"] = (str(rec.state), rec.last_error)
                notes["batches_while_down"] = len(h.batches(s, SID))
            finally:
                store.close()
            node.ctl("start_app", timeout=120)
            notes["restarted"] = True

        notes = run_with_fault(s, fault, timeout=300)
        assert notes.get("restarted"), notes
        store = Store(s.db_url)
        try:
            check_final(spark, s, store, h.keys(records), {st: len(per[st]) for st in streams})
            assert notes["lost"][1], notes  # the error the supervisor reported while the broker was away
        finally:
            store.close()
    finally:
        node.stop()


@pytest.mark.kafka
def test_segments_dir_unwritable(spark, tmp_path, kafka_broker, topic):
    """The table's ``data`` directory replaced by a regular file (root ignores mode bits):
    batches fail, the supervisor turns UNHEALTHY_TASKS naming the path, nothing is committed
    while broken; once restored, everything lands exactly once."""
    n1, n2 = 3_000, 6_000
    s, _ = kafka_setup(tmp_path, kafka_broker, topic, n1)
    code, _ = h.run_daemon(s, timeout=180)
    assert code == 0
    before = h.batches(s, SID)  # committed before the fault
    topic_name = yaml.safe_load(Path(s.specs, f"{SID}.yaml").read_text())["source"]["topic"]
    ends = devservices.produce_kafka(kafka_broker.bootstrap, topic_name, devservices.make_records(n2, start=n1))
    doc = yaml.safe_load(Path(s.specs, f"{SID}.yaml").read_text())
    data = s.segments_dir / "default" / doc["dataSchema"]["datasource"] / "data"
    saved = data.with_name("data.saved")
    data.rename(saved)  # the committed files, kept aside while the path is broken
    data.write_text("not a directory\n")

    def fault(notes):
        store = Store(s.db_url)
        try:
            rec = wait_for("UNHEALTHY_TASKS", lambda: (r := store.get(SID)) and r.state == State.UNHEALTHY_TASKS and r,
                           timeout=150)
            notes["error"] = rec.last_error
            notes["committed_while_broken"] = len(h.batches(s, SID)) - len(before)
        finally:
            store.close()
        data.unlink()
        saved.rename(data)

    notes = run_with_fault(s, fault, timeout=300)
    assert notes["committed_while_broken"] == 0, notes
    assert f"{data.parent.name}/data" in (notes["error"] or ""), notes
    store = Store(s.db_url)
    try:
        check_final(spark, s, store, h.keys(devservices.make_records(n1 + n2)), {str(p): e for p, e in ends.items()})
    finally:
        store.close()


@pytest.mark.kafka
def test_sqlite_busy(spark, tmp_path, kafka_broker, topic):
    """Another process holds SQLite's write lock (BEGIN EXCLUSIVE) for a few seconds
    mid-run: the daemon waits or retries, never dies, and ends exactly once."""
    n = 20_000
    s, ends = kafka_setup(tmp_path, kafka_broker, topic, n)
    path = s.db_url.removeprefix("sqlite:///")

    def fault(notes):
        first_batch_committed(s)
        con = sqlite3.connect(path, timeout=30, isolation_level=None)
        try:
            con.execute("BEGIN EXCLUSIVE")
            time.sleep(6)
            con.execute("COMMIT")
        finally:
            con.close()
        notes["released"] = True

    notes = run_with_fault(s, fault)
    assert notes.get("released")
    store = Store(s.db_url)
    try:
        check_final(spark, s, store, h.keys(devservices.make_records(n)), ends)
    finally:
        store.close()


@pytest.mark.kafka
@pytest.mark.postgres
def test_postgres_connection_dropped(spark, tmp_path, kafka_broker, topic, pg_cluster):
    """The daemon's PostgreSQL backends are terminated (pg_terminate_backend) three times
    while batches run: it reconnects and ends exactly once."""
    import sqlalchemy as sa

    n = 20_000
    url = pg_cluster.create_database(f"faults_pg_{os.getpid()}_{int(time.time())}")
    s, ends = kafka_setup(tmp_path, kafka_broker, topic, n, db=url)

    def fault(notes):
        first_batch_committed(s)
        engine = sa.create_engine(url)
        try:
            killed = 0
            for _ in range(3):
                with engine.connect() as c:
                    killed += sum(1 for (ok,) in c.execute(sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()")) if ok)
                time.sleep(1.5)
            notes["killed"] = killed
        finally:
            engine.dispose()

    notes = run_with_fault(s, fault)
    assert notes["killed"] >= 1, notes
    store = Store(s.db_url)
    try:
        check_final(spark, s, store, h.keys(devservices.make_records(n)), ends)
    finally:
        store.close()

"""Freshness: how long after the broker acknowledged a record it is visible in the table.

Prints ONE JSON document on stdout (logs go to stderr). Starts a Tansu broker
(``devservices``), a topic, and the daemon in this process (``Daemon.run`` in a thread)
with one supervisor (``taskDuration`` as given, 1 s by default). After a warm-up batch, a
producer sends records at a steady rate for ``--seconds`` and notes when the broker
acknowledged each one (its delivery report, with its partition and offset). Meanwhile:

* the daemon's side: the committed checkpoints are polled every 5 ms. A checkpoint moves
  in the same database transaction as the table's snapshot pointer, so the first poll
  that sees ``checkpoint[p] > offset`` is when the record became visible to every reader
  of the table;
* the baseline, in the same run: a raw consumer (confluent-kafka, assigned to every
  partition from the start) notes when it received each record: the floor that no
  pipeline reading from this broker can beat.

The producer, the raw consumer and the poller each run in a process of their own (spawned,
never forked from the JVM's host), as they would beside a daemon in production; only the
daemon (and ``--trace``'s wrappers) runs in this one.

Latency is visible (or received) minus acknowledged, per record; the JSON holds p50, p95,
p99 and max of both, the commits seen and their median interval, and the exactly-once
verification of the table (every key once).

It also holds each batch's publish time (the runtime's ``publish`` phase, from the
daemon's own log record of the batch), the median of the first and of the last
``--publish-window`` batches (100 by default) and their ratio: issue 34's check that the
commit cost stays flat as the table's history grows. A long run at a trickle measures it:
``--task-duration 0.5s --rate 200 --seconds 3600 --linger-ms 200 --no-baseline``.

Why those two switches on a long run: Tansu's in-memory storage keeps each produced batch
as an object and lists a partition's objects on every fetch, so a fetch costs time in
proportion to the batches stored (measured on one partition: 3 ms at 2,000 batches, 40 ms
at 60,000). A trickle sent a record at a time stores 360,000 batches a partition in an
hour: within 15 minutes the broker spent 1.3 cores answering the baseline's 10 ms fetches,
answered fetches with nothing once a lookup outlasted their wait, and the daemon's
batches stalled. ``--linger-ms`` lets the producer batch (200 ms: a twentieth of the
batches), and ``--no-baseline`` drops the raw consumer; neither touches the daemon's
publish, which is what such a run measures. The linger adds up to its length to the
records' visibility (Tansu serves a batch's last records only once the next batch is in).

Usage: ``.venv/bin/python benchmarks/freshness.py [--rate 20000] [--seconds 30]
[--task-duration 1s] [--partitions 2] [--publish-window 100] [--linger-ms 2] [--no-baseline]
[--trace]``. ``--trace`` adds where each batch's time went (``batch_trace.py``): the median
and p95 of each phase, from the cut to the checkpoint visible, with the tasks' own times.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import threading
import time
from array import array
from bisect import bisect_right
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from batch_trace import BatchTrace  # noqa: E402
from ingest import _verify  # noqa: E402  (through the catalog: the committed snapshot only)
from marker_latency import _wait  # noqa: E402

import devservices  # noqa: E402
from reconciler import logs  # noqa: E402
from reconciler import settings as settings_mod  # noqa: E402
from reconciler.daemon import Daemon  # noqa: E402
from reconciler.pipeline import heap  # noqa: E402
from reconciler.store.store import Store  # noqa: E402

log = logging.getLogger("bench")
ID = "fresh"
POLL_EVERY = 0.005


def _spec(bootstrap: str, topic: str, task_duration: str) -> str:
    return f"""id: {ID}
source: {{type: kafka, bootstrapServers: "{bootstrap}", topic: {topic}}}
taskCount: 1
taskDuration: {task_duration}
maxBatchRecords: 1000000
dataSchema:
  datasource: {ID}
  timestamp: {{column: ts, format: millis}}
  dimensions: [id, user, page]
  granularity: {{segment: hour, query: none, rollup: false}}
"""


def _pct(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)

    def rank(q: float) -> float:  # nearest rank
        return round(s[max(0, math.ceil(q * len(s)) - 1)], 4)

    return {"p50": rank(0.50), "p95": rank(0.95), "p99": rank(0.99), "max": round(s[-1], 4),
            "mean": round(statistics.fmean(s), 4), "n": len(s)}


def _record(i: int) -> tuple[bytes, bytes]:
    key = f"k{i:08d}"
    value = json.dumps({"id": key, "ts": int(time.time() * 1000), "user": f"u{i % 97}",
                        "page": f"/p{i % 13}"}, separators=(",", ":"))
    return key.encode(), value.encode()


class _Stamps:
    """(partition, offset) -> a monotonic time, in arrays per partition: millions of stamps
    as a few arrays, not millions of tuples (which once shared the daemon's process and were
    walked by each of its full collections), and cheap to send between processes."""

    def __init__(self) -> None:
        self._by_partition: dict[int, tuple[array, array]] = {}

    def add(self, partition: int, offset: int, at: float) -> None:
        found = self._by_partition.get(partition)
        if found is None:
            found = self._by_partition[partition] = (array("q"), array("d"))
        found[0].append(offset)
        found[1].append(at)

    def items(self):
        for partition, (offsets, times) in self._by_partition.items():
            for offset, at in zip(offsets, times, strict=True):
                yield (partition, offset), at

    def __iter__(self):
        return (key for key, _ in self.items())

    def __len__(self) -> int:
        return sum(len(offsets) for offsets, _ in self._by_partition.values())

    def lookup(self) -> dict[tuple[int, int], float]:
        return dict(self.items())

    def state(self) -> dict[int, tuple[array, array]]:
        """Plain arrays, to cross from a process (a class of ``__main__`` would not unpickle)."""
        return self._by_partition

    @classmethod
    def of(cls, state: dict[int, tuple[array, array]] | None) -> _Stamps | None:
        if state is None:
            return None
        out = cls()
        out._by_partition = state
        return out


class _Producer:
    """Produces ``rate`` records a second in 10 ms slices; notes each acknowledgement."""

    def __init__(self, bootstrap: str, topic: str, start: int, linger_ms: float = 2):
        from confluent_kafka import Producer

        self.topic = topic
        self.next = start
        self.acks = _Stamps()
        # one callable for every record: ``self._delivered`` makes a bound method per produce(),
        # which librdkafka holds until the record's delivery report (hundreds of thousands
        # of objects on a long run, walked by every full collection of the daemon here)
        self._on_delivery = self._delivered
        self.errors: list[str] = []
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms, "acks": "all",
                                  "log_level": 2, "queue.buffering.max.messages": 1_000_000})

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.acks.add(msg.partition(), msg.offset(), time.monotonic())

    def seal(self, partitions: int) -> int:
        """One last record alone in its batch per partition: Tansu answers ``latest`` with
        the last batch's base offset + 1, so a multi-record last batch would never look
        complete (devservices.produce_kafka does the same)."""
        for p in range(partitions):
            key, value = _record(self.next)
            self.producer.produce(self.topic, value, key, partition=p, on_delivery=self._on_delivery)
            self.next += 1
            self.producer.flush(60)
        return partitions

    def run(self, rate: int, seconds: float) -> int:
        began = time.monotonic()
        sent = 0
        while (elapsed := time.monotonic() - began) < seconds:
            due = int(rate * elapsed) - sent
            for _ in range(due):
                key, value = _record(self.next)
                self.producer.produce(self.topic, value, key, on_delivery=self._on_delivery)
                self.next += 1
                sent += 1
            self.producer.poll(0)
            time.sleep(0.002)
        self.producer.flush(60)
        return sent


class _RawConsumer:
    """The baseline: a plain consumer assigned to every partition, noting when each record arrives."""

    def __init__(self, bootstrap: str, topic: str, starts: dict[int, int]):
        from confluent_kafka import Consumer, TopicPartition

        self.seen = _Stamps()
        self.stop = threading.Event()
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "freshness-baseline",
                                  "enable.auto.commit": False, "fetch.wait.max.ms": 10, "log_level": 2})
        self.consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        self.thread = threading.Thread(target=self._run, name="raw-consumer", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for msg in self.consumer.consume(10_000, timeout=0.05):
                if msg.error() is None:
                    self.seen.add(msg.partition(), msg.offset(), time.monotonic())
        self.consumer.close()


class _CheckpointPoller:
    """When each committed checkpoint value was first seen, per partition."""

    def __init__(self, db_url: str):
        self.db_url = db_url
        self.seen: dict[int, list[tuple[int, float]]] = {}  # partition -> [(checkpoint, first seen)]
        self.commits = 0
        self._offsets: dict[int, list[int]] = {}

    def run(self, stop) -> None:
        store = Store(self.db_url)
        last: dict[str, int] = {}
        try:
            while not stop.is_set():
                now = time.monotonic()
                current = store.checkpoints(ID)
                if current != last:
                    self.commits += 1
                    for p, o in current.items():
                        if o != last.get(p):
                            self.seen.setdefault(int(p), []).append((o, now))
                    last = current
                time.sleep(POLL_EVERY)
        finally:
            store.close()

    def visible_at(self, partition: int, offset: int) -> float | None:
        points = self.seen.get(partition, [])
        offsets = self._offsets.get(partition)
        if offsets is None or len(offsets) != len(points):  # once per partition, not per record
            offsets = self._offsets[partition] = [o for o, _ in points]
        i = bisect_right(offsets, offset)  # the first checkpoint > offset
        return points[i][1] if i < len(points) else None


# The load and the observers run in processes of their own, as they would beside a daemon in
# production: in the daemon's process, the producer's 20,000 Python calls a second, the raw
# consumer's stamps and the poller's queries every 5 ms held the daemon's GIL for a share of
# every second, and a batch waited for it. time.monotonic() is one clock for every process
# of the machine (CLOCK_MONOTONIC), so their times compare with the daemon's.

def _load_process(conn, bootstrap: str, start: int, linger_ms: float, rate: int, seconds: float,
                  partitions: int) -> None:
    """The producer: ``conn`` gets ("produced", acks, sent, errors) once every record is acknowledged."""
    producer = _Producer(bootstrap, ID, start=start, linger_ms=linger_ms)
    conn.send("ready")
    sent = producer.run(rate, seconds)
    sent += producer.seal(partitions)
    conn.send(("produced", producer.acks.state(), sent, producer.errors[:3], len(producer.errors)))


def _raw_process(conn, bootstrap: str, starts: dict[int, int]) -> None:
    """The baseline's raw consumer: ``conn`` gets what it saw after a "stop"."""
    raw = _RawConsumer(bootstrap, ID, starts)
    raw.thread.start()
    conn.send("ready")
    conn.recv()
    raw.stop.set()
    raw.thread.join(10)
    conn.send(raw.seen.state())


def _poller_process(conn, db_url: str) -> None:
    """The checkpoint poller: ``conn`` gets its findings after a "stop"."""
    import threading as _threading

    poller, stop = _CheckpointPoller(db_url), _threading.Event()
    thread = _threading.Thread(target=poller.run, args=(stop,), daemon=True)
    thread.start()
    conn.send("ready")
    conn.recv()
    stop.set()
    thread.join(10)
    conn.send((poller.seen, poller.commits))


class _Publishes(logging.Handler):
    """Each published batch's phases, from the runtime's log record of it (``extra`` phases)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.publish: list[float] = []
        self.job: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        phases = getattr(record, "phases", None)
        if phases and getattr(record, "supervisor", None) == ID:
            self.publish.append(phases["publish"])
            self.job.append(phases["job"])

    def attach(self) -> _Publishes:
        self._logger = logging.getLogger("reconciler.runtime.supervisor")
        self._level = self._logger.level
        self._logger.setLevel(logging.INFO)  # the root logger's handlers still drop INFO
        self._logger.addHandler(self)
        return self

    def detach(self) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)

    def summary(self, window: int) -> dict[str, Any]:
        xs = self.publish[1:]  # the first batch is the warm-up: the table's creation, a cold job
        if len(xs) < 2 * window:
            return {"batches": len(xs), "window": window, "note": "fewer than two windows of batches"}
        first, last = statistics.median(xs[:window]), statistics.median(xs[-window:])
        return {"batches": len(xs), "window": window,
                "first_median_ms": round(first * 1000, 2), "last_median_ms": round(last * 1000, 2),
                "last_over_first": round(last / first, 3),
                "all_ms": {k: round(v * 1000, 2) for k, v in _pct(xs).items() if k != "n"},
                "job_median_ms": round(statistics.median(self.job[1:]) * 1000, 2)}


def _store(s) -> Store | None:
    if not Path(s.db_url.removeprefix("sqlite:///")).exists():
        return None
    store = Store(s.db_url)
    try:
        if store.get(ID) is None:
            store.close()
            return None
    except Exception:  # noqa: BLE001 - the daemon is still creating the database
        store.close()
        return None
    return store


def run(rate: int, seconds: float, task_duration: str, partitions: int, warmup: int, work: Path,
        publish_window: int = 100, linger_ms: float = 2, baseline: bool = True,
        trace: bool = False) -> dict[str, Any]:
    broker = devservices.TansuBroker().start()
    publishes = _Publishes().attach()
    tracer = BatchTrace(ID, work).attach() if trace else None
    try:
        broker.create_topic(ID, partitions)
        ends = devservices.produce_kafka(broker.bootstrap, ID, devservices.make_records(warmup))
        specs = work / "specs"
        specs.mkdir(parents=True)
        (specs / f"{ID}.yaml").write_text(_spec(broker.bootstrap, ID, task_duration))
        s = settings_mod.load({"specs": str(specs), "state_dir": str(work / "state"), "spark_master": "local[2]",
                               "http": ""}, config="/dev/null", env={})
        heap.enable()  # the daemon runs in this process, as under `reconciler run`
        daemon = Daemon(s)
        thread = threading.Thread(target=daemon.run, name="daemon", daemon=True)
        thread.start()
        store = _wait(lambda: _store(s), 60, "the database")
        _wait(lambda: sum(store.checkpoints(ID).values()) >= warmup, 300, "the warm-up batch", every=0.2)
        starts = {p: ends.get(p, 0) for p in range(partitions)}
        spawn = multiprocessing.get_context("spawn")  # never fork a process that hosts a JVM
        children = []

        def child(target, *args):
            conn, theirs = spawn.Pipe()
            proc = spawn.Process(target=target, args=(theirs, *args), daemon=True)
            proc.start()
            if not conn.poll(60) or conn.recv() != "ready":
                raise RuntimeError(f"{target.__name__} did not start")
            children.append(proc)
            return conn

        poll_conn = child(_poller_process, s.db_url)
        raw_conn = child(_raw_process, broker.bootstrap, starts) if baseline else None
        load_conn = child(_load_process, broker.bootstrap, warmup, linger_ms, rate, seconds, partitions)
        if not load_conn.poll(seconds + 300):
            raise RuntimeError("the producer did not finish")
        _, acked_state, sent, errors, n_errors = load_conn.recv()
        acks = _Stamps.of(acked_state)
        if n_errors:
            raise RuntimeError(f"{n_errors} deliveries failed, e.g. {errors[0]}")
        last = {}
        for p, o in acks:
            last[p] = max(last.get(p, 0), o + 1)
        _wait(lambda: all(store.checkpoints(ID).get(str(p), 0) >= o for p, o in last.items()), 300,
              "every record committed", every=0.1)
        time.sleep(0.1)
        poll_conn.send("stop")
        poller = _CheckpointPoller(s.db_url)
        poller.seen, poller.commits = poll_conn.recv()
        raw_stamps = None
        if raw_conn is not None:
            raw_conn.send("stop")
            raw_stamps = _Stamps.of(raw_conn.recv())
        for proc in children:
            proc.join(30)
        daemon.request_stop()
        thread.join(120)
        table, floor, missing = [], [], 0
        minutes: dict[int, list[float]] = {}  # by the ack's minute: does the tail grow with the run?
        first_ack = min((t for _, t in acks.items()), default=0.0)
        raw_seen = raw_stamps.lookup() if raw_stamps is not None else {}
        for (p, o), acked in acks.items():
            visible = poller.visible_at(p, o)
            if visible is None:
                missing += 1
                continue
            table.append(max(0.0, visible - acked))
            minutes.setdefault(int((acked - first_ack) // 60), []).append(table[-1])
            if (p, o) in raw_seen:
                floor.append(max(0.0, raw_seen[(p, o)] - acked))
        commit_times = sorted({t for points in poller.seen.values() for _, t in points})
        intervals = [b - a for a, b in zip(commit_times, commit_times[1:], strict=False)]
        store.close()
        return {
            "rate_per_s": rate, "seconds": seconds, "task_duration": task_duration, "partitions": partitions,
            "producer_linger_ms": linger_ms,
            "records": {"warmup": warmup, "measured": sent, "acked": len(acks), "not_seen_committed": missing},
            "visible_after_ack_s": _pct(table),
            **({"visible_by_minute": [{"minute": m, **{k: v for k, v in _pct(xs).items() if k in ("p50", "p95", "p99")}}
                                      for m, xs in sorted(minutes.items())]} if len(minutes) > 1 else {}),
            "baseline_raw_consumer_after_ack_s": _pct(floor) if floor else None,
            "commits": {"seen": poller.commits,
                        "median_interval_s": round(statistics.median(intervals), 4) if intervals else None},
            "publish": publishes.summary(publish_window),
            "verify": _verify(s.segments_dir, ID, warmup + sent),
            **({"trace": tracer.summary(poller.visible_at, time.time() - time.monotonic())} if tracer else {}),
        }
    finally:
        publishes.detach()
        if tracer is not None:
            tracer.detach()
        broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=20_000, help="records a second (default 20000)")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long to produce (default 30)")
    ap.add_argument("--task-duration", default="1s", help="the supervisor's taskDuration (default 1s)")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--warmup-records", type=int, default=20_000)
    ap.add_argument("--publish-window", type=int, default=100,
                    help="batches in the first and last publish medians (default 100)")
    ap.add_argument("--linger-ms", type=float, default=2,
                    help="the producer's linger.ms (default 2); 200 for runs of an hour, see above")
    ap.add_argument("--no-baseline", action="store_true",
                    help="no raw consumer beside the daemon (its 10 ms fetches load Tansu on long runs)")
    ap.add_argument("--trace", action="store_true",
                    help="time each batch's phases end to end (benchmarks/batch_trace.py) and report them")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    logs.setup("WARNING")
    for handler in logging.getLogger().handlers:  # the publish log records are caught, not printed
        handler.setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="freshness-"))
    try:
        doc = run(args.rate, args.seconds, args.task_duration, args.partitions, args.warmup_records, work,
                  args.publish_window, args.linger_ms, not args.no_baseline, args.trace)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(doc, indent=2))
    if not doc["verify"]["exactly_once"] or doc["records"]["not_seen_committed"]:
        sys.exit(1)


if __name__ == "__main__":
    main()

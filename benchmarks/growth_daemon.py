"""Commit growth within the open hour, measured on a real daemon (issue 45): ``commit_growth.py --daemon``.

A Tansu broker, a topic, and the daemon in this process (``Daemon.run`` in a thread, as
``freshness.py`` runs it) with one supervisor at ``--task-duration`` (1 s: about one commit
a second) while a steady producer sends ``--rate`` records a second for ``--minutes``.
The leader's rolling compaction runs as the daemon runs it (``--rolling-compaction``
seconds; 0: off, the old behaviour).

Prints ONE JSON document: each batch's publish time (the runtime's ``publish`` phase, from
its log record of the batch, as freshness.py reads it), the median of the first and the
last 100 batches and their ratio; every 10 s the live data files of the open time
partitions (the most any one of them holds) and the entries of the current snapshot's
manifests; per minute the CPU seconds of the rolling compaction (its own thread's), of
the whole process, of each thread job (``ThreadCpu``) and of the daemon's (the process's
less the producer's and the sampler's), beside the load average; the table checked
exactly once by key at the end; the load average.
"""

from __future__ import annotations

import logging
import os
import re
import statistics
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from freshness import (  # the same daemon, producer and publish log
    ID,
    _Producer,
    _Publishes,
    _spec,
    _store,
)
from ingest import _verify
from marker_latency import _wait

import devservices
from reconciler import settings as settings_mod
from reconciler.daemon import Daemon
from reconciler.pipeline import heap
from reconciler.table.catalog import Tables
from reconciler.table.compact import time_field_id, time_interval

SAMPLE_EVERY = 10.0
LATENESS = timedelta(hours=1)  # compactLateness's default: a partition is open until an hour after its end


def open_partition_files(tables: Tables) -> tuple[int, int]:
    """(the most live files any open time partition holds, entries of the current snapshot's
    manifests, deleted ones included: what a publish's merge and a reader's planning walk)."""
    table = tables.load(ID)
    snap = table.current_snapshot() if table is not None else None
    if snap is None:
        return 0, 0
    spec, time_id = table.metadata.spec(), time_field_id(table.metadata.schema())
    now = datetime.now(UTC)
    per: dict[tuple, int] = {}
    entries = 0
    for manifest in snap.manifests(table.io):
        entries += sum(int(x or 0) for x in (manifest.added_files_count, manifest.existing_files_count,
                                             manifest.deleted_files_count))
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            f = entry.data_file
            _, end = time_interval(spec, f.partition, time_id)
            if end is not None and end + LATENESS > now:
                per[tuple(f.partition)] = per.get(tuple(f.partition), 0) + 1
    return max(per.values(), default=0), entries


def _group(name: str) -> str:
    """A thread's job: its name without what differs between threads of one job (a runtime's
    step thread is new each step, ``runtime-<id>``; ``Thread-12 (serve)``; ``lag_3``)."""
    name = re.sub(r"[-_]\d+", "", name.split(" (")[0])
    return "runtime" if name.startswith("runtime-") else name


class ThreadCpu:
    """This process's CPU seconds by thread job since the last ``take``, read from
    /proc/self/task: Python threads by name (``_group``), native ones (librdkafka's, the
    allocator's) by their kernel name. A thread that ended since the last take is in
    ``exited`` (the process's time less what the live threads account for): mostly the
    runtime's step threads, one a step."""

    def __init__(self):
        self.tick = os.sysconf("SC_CLK_TCK")
        self.seen: dict[int, int] = {}  # tid -> its CPU ticks at the last take
        self.process = time.process_time()
        self.take()  # from now on: what each thread spent since

    def take(self) -> dict[str, float]:
        names = {t.native_id: _group(t.name) for t in threading.enumerate()}
        out: dict[str, float] = {}
        seen: dict[int, int] = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                stat = Path(f"/proc/self/task/{tid}/stat").read_text()
            except OSError:  # ended meanwhile: its time is in exited
                continue
            comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            ticks = int(rest[11]) + int(rest[12])  # utime + stime (fields 14 and 15)
            seen[int(tid)] = ticks
            group = names.get(int(tid)) or f"native:{re.sub(r'[-0-9]+$', '', comm)}"
            out[group] = out.get(group, 0.0) + (ticks - self.seen.get(int(tid), 0)) / self.tick
        process = time.process_time()
        out["exited"] = max(0.0, (process - self.process) - sum(out.values()))
        self.seen, self.process = seen, process
        return {k: round(v, 3) for k, v in out.items()}


class _Sampler:
    """Every ``SAMPLE_EVERY`` seconds: the open partition's files, the manifest entries, and
    the CPU seconds so far of the rolling compaction and of the process."""

    def __init__(self, tables: Tables, daemon: Daemon):
        self.tables, self.daemon = tables, daemon
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="growth-sampler", daemon=True)
        self.began = time.monotonic()
        self.start: dict[str, float] = {}
        self.threads: ThreadCpu | None = None

    def _rolling_cpu(self) -> float:
        manager = self.daemon.manager
        return manager.compactor.rolling_cpu if manager is not None else 0.0

    def _run(self) -> None:
        self.start = {"rollingCpuS": self._rolling_cpu(), "processCpuS": time.process_time()}
        self.threads = ThreadCpu()  # the same start as the per-minute figures
        while not self.stop.wait(SAMPLE_EVERY):
            files, entries = open_partition_files(self.tables)
            self.samples.append({"s": round(time.monotonic() - self.began), "openPartitionFiles": files,
                                 "manifestEntries": entries, "rollingCpuS": round(self._rolling_cpu(), 3),
                                 "processCpuS": round(time.process_time(), 2), "threadCpuS": self.threads.take(),
                                 "load1": round(os.getloadavg()[0], 2)})


def _per_minute(samples: list[dict[str, Any]], key: str, start: dict[str, float]) -> list[float]:
    """The growth of the cumulative ``key`` over each whole minute of samples, from its value
    at the sampler's start (``start``): counted from the first sample, the first minute was
    50 s and read as a lower first minute, a growth that was not."""
    per = int(60 / SAMPLE_EVERY)
    marks = samples[per - 1::per]
    out, last = [], start[key]
    for m in marks:
        out.append(round(m[key] - last, 3))
        last = m[key]
    return out


def _threads_per_minute(samples: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per thread job, its CPU seconds in each whole minute of samples (``ThreadCpu``)."""
    per = int(60 / SAMPLE_EVERY)
    minutes = [samples[i:i + per] for i in range(0, len(samples) - per + 1, per)]
    groups = sorted({g for x in samples for g in x["threadCpuS"]})
    return {g: [round(sum(x["threadCpuS"].get(g, 0.0) for x in m), 2) for m in minutes] for g in groups}


def _daemon_per_minute(samples: list[dict[str, Any]], threads: dict[str, list[float]],
                       start: dict[str, float]) -> list[float]:
    """The process's CPU seconds per minute less the benchmark's own threads: the producer
    (MainThread) and the sampler. The producer's librdkafka threads stay in: they are not
    told apart from the daemon's clients'."""
    own = [threads.get(g, []) for g in ("MainThread", "growth-sampler")]
    return [round(p - sum(t[i] if i < len(t) else 0.0 for t in own), 2)
            for i, p in enumerate(_per_minute(samples, "processCpuS", start))]


def run(minutes: float, task_duration: str, rate: int, partitions: int, rolling: float, work: Path,
        window: int = 100, linger_ms: float = 200) -> dict[str, Any]:
    broker = devservices.TansuBroker().start()
    publishes = _Publishes().attach()
    try:
        broker.create_topic(ID, partitions)
        warmup = 1000
        devservices.produce_kafka(broker.bootstrap, ID, devservices.make_records(warmup))
        specs = work / "specs"
        specs.mkdir(parents=True)
        (specs / f"{ID}.yaml").write_text(_spec(broker.bootstrap, ID, task_duration))
        s = settings_mod.load({"specs": str(specs), "state_dir": str(work / "state"), "spark_master": "local[2]",
                               "http": "", "rolling_compaction": rolling}, config="/dev/null", env={})
        heap.enable()  # the daemon runs in this process, as under `reconciler run`
        daemon = Daemon(s)
        thread = threading.Thread(target=daemon.run, name="daemon", daemon=True)
        thread.start()
        store = _wait(lambda: _store(s), 60, "the database")
        _wait(lambda: sum(store.checkpoints(ID).values()) >= warmup, 300, "the warm-up batch", every=0.2)
        tables = Tables(store.engine, s.segments_dir)
        sampler = _Sampler(tables, daemon)
        sampler.thread.start()
        producer = _Producer(broker.bootstrap, ID, start=warmup, linger_ms=linger_ms)
        sent = producer.run(rate, minutes * 60)
        sent += producer.seal(partitions)
        if producer.errors:
            raise RuntimeError(f"{len(producer.errors)} deliveries failed, e.g. {producer.errors[0]}")
        last: dict[int, int] = {}
        for p, o in producer.acks:
            last[p] = max(last.get(p, 0), o + 1)
        _wait(lambda: all(store.checkpoints(ID).get(str(p), 0) >= o for p, o in last.items()), 300,
              "every record committed", every=0.1)
        sampler.stop.set()
        sampler.thread.join(30)
        daemon.request_stop()
        thread.join(120)
        store.close()
        samples = sampler.samples
        threads = _threads_per_minute(samples)
        files = [x["openPartitionFiles"] for x in samples]
        # A short run has fewer than 2 x 100 batches: its windows are halves of what it has.
        summary = publishes.summary(min(window, max(10, (len(publishes.publish) - 1) // 2)))
        return {
            "minutes": minutes, "task_duration": task_duration, "rate_per_s": rate, "partitions": partitions,
            "rolling_compaction_s": rolling, "records": warmup + sent,
            "publish": summary,
            "open_partition_files": {"max": max(files, default=0),
                                     "last_quarter_max": max(files[len(files) * 3 // 4:], default=0),
                                     "every_10s": files},
            "manifest_entries_every_10s": [x["manifestEntries"] for x in samples],
            "rolling_cpu_s_per_minute": _per_minute(samples, "rollingCpuS", sampler.start),
            "process_cpu_s_per_minute": _per_minute(samples, "processCpuS", sampler.start),
            "thread_cpu_s_per_minute": threads,
            "daemon_cpu_s_per_minute": _daemon_per_minute(samples, threads, sampler.start),
            # a loaded machine's CPU second does less: read the CPU per minute beside the load it ran under
            "load1_per_minute": [x["load1"] for x in samples[int(60 / SAMPLE_EVERY) - 1::int(60 / SAMPLE_EVERY)]],
            "verify": _verify(Path(s.segments_dir), ID, warmup + sent),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "median_rolling_cpu_s_per_minute": (round(statistics.median(_per_minute(samples, "rollingCpuS", sampler.start)), 3)
                                                if len(samples) >= 6 else None),
        }
    finally:
        publishes.detach()
        broker.stop()
        logging.getLogger(__name__).debug("growth run over")

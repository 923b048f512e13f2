"""Backfill beside a running main supervisor: how long a reset's backfill of N records takes.

Prints ONE JSON document on stdout (logs go to stderr). Starts a Tansu broker
(``devservices``), produces N records (~100 bytes of JSON) to a 4-partition topic, and
runs the daemon in this process (``Daemon.run`` in a thread, ``local[2]``) with:

* ``warm``: a supervisor of another topic that ingests 20,000 records first, so the
  SparkSession and its Python workers exist (a running daemon's state);
* ``clicks``: the main supervisor, created suspended with no checkpoint.

Then it drops ``clicks.reset.yaml`` (``resetTo: latest, backfill: true``): the reset
moves the main supervisor to the end and creates ``clicks-backfill-1`` for ``[0, N)``.
Once the reset is recorded, the main supervisor is resumed (``suspended: false``) and a
producer keeps adding records, so the backfill runs beside a main supervisor that
ingests too. Measured from the marker's drop: ``reset_s`` (the reset recorded) and
``backfill_s`` (the backfill COMPLETED), with the records per second of the backfill and
how many main batches committed meanwhile. At the end every record, the backfill's and
the main's, must be in the table exactly once (read through the catalog), and the
daemon's peak RSS (this process, its JVM and Python workers; the broker excluded) is
reported.

With ``--partitions 1`` (issue 30) it measures instead what splitting one partition's range
into offset sub-ranges buys: two one-partition topics of N records each, two suspended
main supervisors, and one backfill of each, ``backfillTaskCount: 1`` then ``2`` (alternating
the order with ``--rounds``), each alone on the daemon. Per backfill: ``backfill_s`` (marker
drop to COMPLETED), ``drain_s`` (reset recorded to COMPLETED: the reading, writing and
publish, without the marker's latency) and their rates; then ``speedup`` = the taskCount 2
drain rate over the taskCount 1 one, both measured in the same run.

Usage: ``.venv/bin/python benchmarks/backfill.py [--records N] [--partitions 1 [--rounds R]]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _rss import PeakRss  # noqa: E402
from ingest import _verify  # noqa: E402
from marker_latency import _store as _open_store  # noqa: E402  (waits for supervisor 'clicks')
from marker_latency import _wait  # noqa: E402

import devservices  # noqa: E402
from reconciler import logs  # noqa: E402
from reconciler import settings as settings_mod  # noqa: E402
from reconciler.control.actual import State  # noqa: E402
from reconciler.daemon import Daemon  # noqa: E402
from reconciler.store.store import Store  # noqa: E402

log = logging.getLogger("bench")
PARTITIONS = 4
WARM = 20_000
TRICKLE = 2_000  # records the producer adds every half second while the backfill runs


def _spec(sid: str, bootstrap: str, topic: str, *, suspended: bool, task_count: int = 2) -> str:
    return f"""id: {sid}
source: {{type: kafka, bootstrapServers: "{bootstrap}", topic: {topic}}}
suspended: {str(suspended).lower()}
taskCount: {task_count}
taskDuration: 1s
maxBatchRecords: 1000000
dataSchema:
  datasource: {sid}
  timestamp: {{column: ts, format: millis}}
  dimensions: [id, user, page, __partition, __offset]
  granularity: {{segment: hour, query: none, rollup: false}}
"""


class Trickle(threading.Thread):
    """Keeps producing to the main supervisor's topic, so it ingests beside the backfill."""

    def __init__(self, bootstrap: str, topic: str, start: int):
        super().__init__(daemon=True, name="trickle")
        self.bootstrap, self.topic, self.produced = bootstrap, topic, start
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            devservices.produce_kafka(self.bootstrap, self.topic, devservices.make_records(TRICKLE, start=self.produced))
            self.produced += TRICKLE
            self._halt.wait(0.5)

    def stop(self) -> int:
        self._halt.set()
        self.join(120)
        return self.produced


def run(n: int, work: Path) -> dict[str, Any]:
    with devservices.TansuBroker() as broker:
        broker.create_topic("clicks", PARTITIONS)
        broker.create_topic("warm", PARTITIONS)
        devservices.produce_kafka(broker.bootstrap, "clicks", devservices.make_records(n))
        devservices.produce_kafka(broker.bootstrap, "warm", devservices.make_records(WARM))
        specs = work / "specs"
        specs.mkdir(parents=True)
        (specs / "warm.yaml").write_text(_spec("warm", broker.bootstrap, "warm", suspended=False))
        (specs / "clicks.yaml").write_text(_spec("clicks", broker.bootstrap, "clicks", suspended=True))
        s = _settings(specs, work)
        daemon = Daemon(s)
        thread = threading.Thread(target=daemon.run, name="daemon", daemon=True)
        with PeakRss(os.getpid(), exclude=frozenset({broker.proc.pid})) as peak:
            thread.start()
            store = _wait(lambda: _open_store(s), 60, "the database")
            _wait(lambda: sum(store.checkpoints("warm").values()) >= WARM, 300, "the warm-up supervisor", every=0.2)
            log.info("warm; dropping the marker")
            t0 = time.monotonic()
            (specs / "clicks.reset.yaml").write_text("resetTo: latest\nbackfill: true\nreason: backfill benchmark\n")
            _wait(lambda: store.get("clicks-backfill-1") is not None, 60, "the reset")
            reset_s = time.monotonic() - t0
            main_batches_before = len(_batches(store, "clicks"))
            (specs / "clicks.yaml").write_text(_spec("clicks", broker.bootstrap, "clicks", suspended=False))
            trickle = Trickle(broker.bootstrap, "clicks", start=n)
            trickle.start()
            _wait(lambda: store.get("clicks-backfill-1").state == State.COMPLETED, 900, "the backfill", every=0.1)
            backfill_s = time.monotonic() - t0
            main_during = len(_batches(store, "clicks")) - main_batches_before
            produced = trickle.stop()
            log.info("backfill completed in %.1fs; waiting for the main supervisor", backfill_s)
            _wait(lambda: sum(store.checkpoints("clicks").values()) >= produced, 300, "the main supervisor",
                  every=0.2)
            daemon.request_stop()
            thread.join(120)
        backfill_batches = _batches(store, "clicks-backfill-1")
        store.close()
    return {
        "records": n, "partitions": PARTITIONS, "task_count": 2, "spark_master": "local[2]",
        "reset_s": round(reset_s, 3),
        "backfill_s": round(backfill_s, 3),
        "backfill_records_per_s": round(n / backfill_s, 1),
        "backfill_batches": len(backfill_batches),
        "main_batches_during_backfill": main_during,
        "records_after_reset": produced - n,
        "peak_rss_mib": peak.mib,
        "peak_pss_mib": peak.pss_mib,
        "verify": _verify(s.segments_dir, "clicks", produced),
    }


def _settings(specs: Path, work: Path):
    return settings_mod.load({"specs": str(specs), "state_dir": str(work / "state"), "spark_master": "local[2]",
                              "http": "", "tick_interval": 30.0}, config="/dev/null", env={})


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process: /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _one_backfill(store: Store, specs: Path, sid: str, task_count: int, n: int) -> dict[str, Any]:
    """Drop ``<sid>.reset.yaml`` with ``backfillTaskCount``; time its backfill to COMPLETED."""
    t0 = time.monotonic()
    (specs / f"{sid}.reset.yaml").write_text(
        f"resetTo: latest\nbackfill: true\nbackfillTaskCount: {task_count}\nreason: split benchmark\n")
    bf = f"{sid}-backfill-1"
    _wait(lambda: store.get(bf) is not None, 60, f"the reset of {sid}", every=0.02)
    t1, busy1 = time.monotonic(), _busy_cpu_s()
    _wait(lambda: store.get(bf).state == State.COMPLETED, 900, f"the backfill of {sid}", every=0.05)
    t2, busy2 = time.monotonic(), _busy_cpu_s()
    assert store.get(bf).spec.task_count == task_count
    return {"task_count": task_count, "supervisor": bf, "reset_s": round(t1 - t0, 3),
            "backfill_s": round(t2 - t0, 3), "drain_s": round(t2 - t1, 3),
            "backfill_records_per_s": round(n / (t2 - t0), 1), "drain_records_per_s": round(n / (t2 - t1), 1),
            "batches": len(_batches(store, bf)),
            # cores the machine kept busy while it drained (the broker, the daemon, its tasks,
            # and anything else running): what a second task could not have had
            "cores_busy": round((busy2 - busy1) / (t2 - t1), 2)}


def _store_with(s, sid: str) -> Store | None:
    """The daemon's database once it holds supervisor ``sid``, else None."""
    if not Path(s.db_url.removeprefix("sqlite:///")).exists():
        return None
    store = Store(s.db_url)
    try:
        if store.get(sid) is not None:
            return store
    except Exception:  # noqa: BLE001 - not migrated yet
        pass
    store.close()
    return None


def run_one_partition(n: int, rounds: int, work: Path) -> dict[str, Any]:
    """Backfills of one partition, ``backfillTaskCount`` 1 against 2, in one daemon."""
    order = [(1, 2) if r % 2 == 0 else (2, 1) for r in range(rounds)]
    with devservices.TansuBroker() as broker:
        broker.create_topic("warm", PARTITIONS)
        devservices.produce_kafka(broker.bootstrap, "warm", devservices.make_records(WARM))
        specs = work / "specs"
        specs.mkdir(parents=True)
        (specs / "warm.yaml").write_text(_spec("warm", broker.bootstrap, "warm", suspended=False))
        s = _settings(specs, work)
        daemon = Daemon(s)
        thread = threading.Thread(target=daemon.run, name="daemon", daemon=True)
        results: list[dict[str, Any]] = []
        with PeakRss(os.getpid(), exclude=frozenset({broker.proc.pid})) as peak:
            thread.start()
            store = _wait(lambda: _store_with(s, "warm"), 60, "the database")
            _wait(lambda: sum(store.checkpoints("warm").values()) >= WARM, 300, "the warm-up supervisor", every=0.2)
            for r, tasks in enumerate(order):
                for k in tasks:
                    sid = f"one{r}t{k}"
                    broker.create_topic(sid, 1)
                    produced = time.monotonic()
                    devservices.produce_kafka(broker.bootstrap, sid, devservices.make_records(n))
                    log.info("produced %d records to %s in %.1fs", n, sid, time.monotonic() - produced)
                    (specs / f"{sid}.yaml").write_text(_spec(sid, broker.bootstrap, sid, suspended=True, task_count=1))
                    _wait(lambda sid=sid: store.get(sid) is not None, 60, f"supervisor {sid}")
                    got = _one_backfill(store, specs, sid, k, n)
                    got["round"] = r
                    got["verify"] = _verify(s.segments_dir, sid, n)
                    log.info("%s", got)
                    results.append(got)
            daemon.request_stop()
            thread.join(120)
        store.close()

    def rate(k: int) -> float:
        return round(statistics.median(x["drain_records_per_s"] for x in results if x["task_count"] == k), 1)

    # per round too: the two backfills of a round ran back to back, so they shared its load
    by_round = [round(next(x["drain_records_per_s"] for x in results if x["round"] == r and x["task_count"] == 2)
                      / next(x["drain_records_per_s"] for x in results if x["round"] == r and x["task_count"] == 1), 3)
                for r in range(rounds)]
    ceilings = [(os.cpu_count() or 1) / x["cores_busy"] for x in results if x["task_count"] == 1 and x["cores_busy"]]
    return {
        "records": n, "partitions": 1, "spark_master": "local[2]", "cores": os.cpu_count(), "rounds": rounds,
        "backfills": results,
        "task_count_1_drain_records_per_s": rate(1),
        "task_count_2_drain_records_per_s": rate(2),
        "speedup": round(rate(2) / rate(1), 3),  # of the medians over the rounds
        "speedup_by_round": by_round,
        # the most a second task could add: every core busy for the same work as one task's
        # (median over the rounds of cores / the cores one task's backfill kept busy)
        "speedup_ceiling": round(statistics.median(ceilings), 3) if ceilings else None,
        "peak_rss_mib": peak.mib, "peak_pss_mib": peak.pss_mib,
        "exactly_once": all(x["verify"]["exactly_once"] for x in results),
    }


def _batches(store: Store, supervisor_id: str) -> list:
    import sqlalchemy as sa

    from reconciler.store.tables import batches

    with store.engine.connect() as c:
        return c.execute(sa.select(batches.c.batch_id).where(batches.c.supervisor_id == supervisor_id)).all()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000, help="records to backfill (default 1,000,000)")
    ap.add_argument("--partitions", type=int, choices=(1, PARTITIONS), default=PARTITIONS,
                    help="1: backfills of one partition, backfillTaskCount 1 against 2 (default: 4, beside a main)")
    ap.add_argument("--rounds", type=int, default=1, help="with --partitions 1: pairs of backfills (default 1)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    logs.setup("INFO")
    work = Path(tempfile.mkdtemp(prefix="backfill-bench-"))
    load = [round(x, 2) for x in os.getloadavg()]
    try:
        if args.partitions == 1:
            doc = {"load_average_at_start": load, **run_one_partition(args.records, max(1, args.rounds), work)}
        else:
            doc = {"load_average_at_start": load, **run(args.records, work)}
        doc["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(doc, indent=2))
    if not doc.get("exactly_once", doc.get("verify", {}).get("exactly_once")):
        sys.exit(1)


if __name__ == "__main__":
    main()

"""What lag in time costs: one round of the leader's lag observer, and ``status`` with lag.

Prints ONE JSON document on stdout (progress on stderr). Starts a Tansu broker
(``devservices``) and one topic of ``--partitions`` partitions with records, then for each N
of ``--supervisors``: N RUNNING supervisors in a fresh SQLite database, all behind on every
partition (their checkpoints in the middle of the topic), each with a ``lagPolicy`` that is
not breached (so nothing resets). No Spark, no runtime: the observer alone.

* ``observe_round``: ``LagObserver.observe_once()`` (latest offsets and the record time at
  each checkpoint, every supervisor at once on its pool; the observations and audit written),
  ``--repetitions`` times after a first round that builds the clients (reported apart as
  ``first``), every checkpoint moved one record before each round (as when every supervisor
  publishes between two rounds: each record time is fetched again, the worst case); median,
  p95, max, and the mean CPU seconds a round costs this process;
* ``observe_round_unmoved``: the same without moving the checkpoints (the record times are
  known from the round before: a supervisor stuck behind costs no fetch);
* ``records_only``: the moving rounds with the record-time fetch left out (the lag in records
  alone, what the observer would cost without lag in time): the baseline, same run;
* ``status_with_lag``: ``all_status`` (what ``reconciler status`` asks: latest offsets and the
  record times, clients built per call), and ``status_records_only`` its baseline without the
  record times.

Usage: ``.venv/bin/python benchmarks/lag_observe.py [--supervisors 10 100] [--partitions 4]``
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
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

import devservices  # noqa: E402
from reconciler.control.actual import State  # noqa: E402
from reconciler.model import SupervisorSpec  # noqa: E402
from reconciler.observe import lagwatch, status  # noqa: E402
from reconciler.observe.lagwatch import LagObserver  # noqa: E402
from reconciler.store.store import Store  # noqa: E402
from reconciler.store.tables import checkpoints  # noqa: E402
from reconciler.streams import lagtime  # noqa: E402

log = logging.getLogger("bench")


def summary(samples: list[float]) -> dict[str, Any]:
    s = sorted(samples)
    return {"median": round(statistics.median(s), 4), "p95": round(s[min(len(s) - 1, int(0.95 * len(s)))], 4),
            "max": round(s[-1], 4), "samples": [round(x, 4) for x in samples]}


def build(tmp: Path, n: int, bootstrap: str, topic: str, partitions: int, middle: int) -> Store:
    store = Store(f"sqlite:///{tmp / f'r{n}.db'}")
    store.migrate()
    for i in range(n):
        sid = f"s{i:04d}"
        store.create_supervisor(SupervisorSpec.from_document({
            "id": sid, "source": {"type": "kafka", "bootstrapServers": bootstrap, "topic": topic},
            "dataSchema": {"datasource": sid, "timestamp": {"column": "ts"}},
            "lagPolicy": {"maxRecords": 10**9, "action": "alert"}}), None, actor="bench")
        store.set_state(sid, State.RUNNING)
        store.init_checkpoints(sid, {str(p): middle for p in range(partitions)})
    return store


def advance(store: Store) -> None:
    """Every checkpoint one record further (what publishes do between two rounds)."""
    with store.engine.begin() as c:
        c.execute(sa.update(checkpoints).values(next_offset=checkpoints.c.next_offset + 1))


def rounds(observer: LagObserver, repetitions: int, between=None) -> tuple[float, list[float], float]:
    """(first round's wall time, the next rounds' wall times, their mean CPU time in this
    process); ``between`` runs before each timed round, outside the timing."""
    t = time.perf_counter()
    observer.observe_once()
    first = time.perf_counter() - t
    out, cpu = [], 0.0
    for _ in range(repetitions):
        if between is not None:
            between()
        c, t = time.process_time(), time.perf_counter()
        observer.observe_once()
        out.append(time.perf_counter() - t)
        cpu += time.process_time() - c
    return first, out, cpu / repetitions


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--supervisors", type=int, nargs="+", default=[10, 100])
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--repetitions", type=int, default=10)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    doc: dict[str, Any] = {"benchmark": "lag_observe", "partitions": args.partitions,
                           "load_average_start": os.getloadavg()}
    tmp = Path(tempfile.mkdtemp(prefix="lag-bench-"))
    real_record_times = lagtime.record_times
    try:
        with devservices.TansuBroker() as broker:
            broker.create_topic("clicks", args.partitions)
            devservices.produce_kafka(broker.bootstrap, "clicks", devservices.make_records(args.records))
            middle = args.records // args.partitions // 2
            for n in args.supervisors:
                log.warning("%d supervisors", n)
                store = build(tmp, n, broker.bootstrap, "clicks", args.partitions, middle)
                observer = LagObserver(store, interval=5.0)
                first, with_time, cpu = rounds(observer, args.repetitions, lambda store=store: advance(store))
                _, static, static_cpu = rounds(observer, args.repetitions)
                observer.stop()
                lagwatch.record_times = lambda *a: {}  # the baseline: lag in records only
                observer = LagObserver(store, interval=5.0)
                base_first, records_only, base_cpu = rounds(observer, args.repetitions, lambda store=store: advance(store))
                observer.stop()
                lagwatch.record_times = real_record_times
                seen = observer.snapshot() or {}
                status_t = []
                for _ in range(3):
                    t = time.perf_counter()
                    items = status.all_status(store)
                    status_t.append(time.perf_counter() - t)
                assert all(i["lagSeconds"] is not None and i["lagSeconds"] > 0 for i in items), items[:1]
                status.record_times = lambda *a: {}
                status_base = []
                for _ in range(3):
                    t = time.perf_counter()
                    status.all_status(store)
                    status_base.append(time.perf_counter() - t)
                status.record_times = real_record_times
                doc[str(n)] = {
                    "observe_round": summary(with_time) | {"first": round(first, 4), "cpu_seconds": round(cpu, 4)},
                    "observe_round_unmoved": summary(static) | {"cpu_seconds": round(static_cpu, 4)},
                    "records_only": summary(records_only) | {"first": round(base_first, 4),
                                                             "cpu_seconds": round(base_cpu, 4)},
                    "ratio_median": round(statistics.median(with_time) / statistics.median(records_only), 3),
                    "status_with_lag": summary(status_t), "status_records_only": summary(status_base),
                    "observed": len(seen),
                }
                store.close()
    finally:
        lagwatch.record_times = real_record_times
        shutil.rmtree(tmp, ignore_errors=True)
    doc["load_average_end"] = os.getloadavg()
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

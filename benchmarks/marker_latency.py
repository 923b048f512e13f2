"""Marker-to-reset latency: how soon a dropped ``<id>.reset.yaml`` is acted on.

Prints ONE JSON document on stdout (logs go to stderr). Starts a Tansu broker
(``devservices``), a 2-partition topic with records, and the daemon in this
process (``Daemon.run`` in a thread, the default debounce, a 30 s tick so only the file
event can trigger the pass) with one RUNNING supervisor that has caught up. Then, N
times: produce more records (the supervisor falls behind, as in a lag alarm), drop a
marker ``resetTo: latest, backfill: true`` and measure from just before the file is
written until

* ``db``: the reset is recorded in the database (audit log entry, committed in the
  same transaction as the new checkpoint, the backfill supervisor and the token);
* ``applied``: the marker has been renamed ``clicks.reset.yaml.applied`` (after the
  commit): what the operator sees in the directory.

Ingestion keeps running meanwhile (main batches, then each backfill), so the figures
include a busy Spark beside the loop. At the end every backfill must complete and
every record must be committed exactly once (read through the catalog); the JSON holds
``median``, ``p95``, ``max`` (and ``min``, ``mean``) per measure, each sample, and the
verification.

Usage: ``.venv/bin/python benchmarks/marker_latency.py [--repetitions N] [--debounce S]``
"""

from __future__ import annotations

import argparse
import json
import logging
import math
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

from ingest import _verify  # noqa: E402  (through the catalog: the committed snapshot only)

import devservices  # noqa: E402
from reconciler import logs  # noqa: E402
from reconciler import settings as settings_mod  # noqa: E402
from reconciler.daemon import Daemon  # noqa: E402
from reconciler.store.store import Store  # noqa: E402

log = logging.getLogger("bench")
PARTITIONS = 2


def _spec(bootstrap: str, topic: str) -> str:
    return f"""id: clicks
source: {{type: kafka, bootstrapServers: "{bootstrap}", topic: {topic}}}
taskCount: 1
taskDuration: 500ms
maxBatchRecords: 20000
dataSchema:
  datasource: clicks
  timestamp: {{column: ts, format: millis}}
  dimensions: [id, user, page, __partition, __offset]
  granularity: {{segment: hour, query: none, rollup: false}}
"""


def _stats(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    p95 = s[max(0, math.ceil(0.95 * len(s)) - 1)]  # nearest rank
    return {"median": round(statistics.median(s), 4), "p95": round(p95, 4), "max": round(s[-1], 4),
            "min": round(s[0], 4), "mean": round(statistics.fmean(s), 4)}


def _wait(cond, timeout: float, what: str, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def run(repetitions: int, debounce: float, initial: int, per_rep: int, work: Path) -> dict[str, Any]:
    broker = devservices.TansuBroker().start()
    try:
        broker.create_topic("clicks", PARTITIONS)
        produced = initial
        devservices.produce_kafka(broker.bootstrap, "clicks", devservices.make_records(initial))
        specs = work / "specs"
        specs.mkdir(parents=True)
        (specs / "clicks.yaml").write_text(_spec(broker.bootstrap, "clicks"))
        s = settings_mod.load({"specs": str(specs), "state_dir": str(work / "state"), "spark_master": "local[2]",
                               "http": "", "tick_interval": 30.0, "debounce": debounce}, config="/dev/null", env={})
        daemon = Daemon(s)
        thread = threading.Thread(target=daemon.run, name="daemon", daemon=True)
        thread.start()
        store = _wait(lambda: _store(s), 30, "the database")
        _wait(lambda: sum(store.checkpoints("clicks").values()) >= initial, 300, "the first catch-up", every=0.2)
        samples = []
        for i in range(repetitions):
            devservices.produce_kafka(broker.bootstrap, "clicks",
                                      devservices.make_records(per_rep, start=produced))
            produced += per_rep
            time.sleep(0.2)  # let a main batch start: the reset lands beside it (and fences it)
            done_before = _resets(store)
            applied_before = len(list(specs.glob("clicks.reset.yaml*.applied")))
            marker = specs / "clicks.reset.yaml"
            t0 = time.monotonic()
            marker.write_text(f"resetTo: latest\nbackfill: true\nreason: latency benchmark {i}\n")
            t_db = t_file = None
            while t_db is None or t_file is None:
                now = time.monotonic()
                if now - t0 > 30:
                    raise TimeoutError(f"marker {i} not applied within 30s")
                if t_db is None and _resets(store) > done_before:
                    t_db = now
                if t_file is None and not marker.exists() and \
                        len(list(specs.glob("clicks.reset.yaml*.applied"))) > applied_before:
                    t_file = now
                time.sleep(0.002)
            samples.append({"db": round(t_db - t0, 4), "applied": round(t_file - t0, 4)})
            log.info("marker %d: db %.3fs, applied %.3fs", i, t_db - t0, t_file - t0)
        _wait(lambda: _all_done(store, produced), 600, "every backfill and the main supervisor", every=0.5)
        daemon.request_stop()
        thread.join(120)
        store.close()
        return {
            "repetitions": repetitions,
            "debounce_s": debounce,
            "tick_interval_s": s.tick_interval,
            "records": {"initial": initial, "per_repetition": per_rep, "total": produced},
            "latency_s": {"db": _stats([x["db"] for x in samples]),
                          "applied": _stats([x["applied"] for x in samples])},
            "samples": samples,
            "verify": _verify(s.segments_dir, "clicks", produced),
        }
    finally:
        broker.stop()


def _store(s) -> Store | None:
    if not Path(s.db_url.removeprefix("sqlite:///")).exists():
        return None
    store = Store(s.db_url)
    try:
        if store.get("clicks") is None:
            store.close()
            return None
    except Exception:
        store.close()
        return None
    return store


def _resets(store: Store) -> int:
    return sum(1 for e in store.history("clicks") if e["action"] == "reset-and-backfill")


def _all_done(store: Store, produced: int) -> bool:
    actual = store.read_actual()
    backfills = [r for r in actual.supervisors.values() if r.kind == "backfill"]
    main_done = sum(actual.checkpoints.get("clicks", {}).values()) >= produced
    return main_done and all(r.state == "COMPLETED" for r in backfills)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repetitions", "-n", type=int, default=20)
    ap.add_argument("--debounce", type=float, default=settings_mod.Settings.debounce,
                    help="the daemon's debounce in seconds (default: the product default)")
    ap.add_argument("--initial-records", type=int, default=20_000)
    ap.add_argument("--records-per-repetition", type=int, default=2_000)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    logs.setup("INFO")
    work = Path(tempfile.mkdtemp(prefix="marker-latency-"))
    try:
        doc = run(args.repetitions, args.debounce, args.initial_records, args.records_per_repetition, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(doc, indent=2))
    if not doc["verify"]["exactly_once"]:
        sys.exit(1)


if __name__ == "__main__":
    main()

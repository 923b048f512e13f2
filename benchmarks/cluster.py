"""Ingest rate on a standalone Spark cluster (one worker) against ``local[2]``, same data, same run.

Prints ONE JSON document on stdout (logs go to stderr). Starts a Tansu broker and a
standalone Master + Worker from the installed pyspark (``devservices.spark``),
produces N records of ~100 bytes of JSON over 4 partitions, then runs
``reconciler run --until-caught-up`` as a subprocess on a fresh state directory, once
per master, over the same topic:

- ``wall``: exec to exit (Python imports, the Spark driver, on the cluster registering
  the application and launching an executor, the batches, shutdown);
- ``batches``: the daemon's own account of its batches from its log (read, parse, write,
  publish, promote), so ``batch_records_per_s`` is the rate once Spark is up.

Each run is verified: the committed Parquet holds exactly N rows and N distinct ids.

Usage: ``.venv/bin/python benchmarks/cluster.py [--records N] [--worker-cores 2]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest import _rate, _spec, _verify  # noqa: E402

import devservices  # noqa: E402
from devservices.spark import StandaloneCluster  # noqa: E402

log = logging.getLogger("bench")
PARTITIONS = 4
_BATCH = re.compile(r"published: (\d+) records \(\d+ unparseable\) in ([0-9.]+)s")


def run_daemon(work: Path, tag: str, source: dict[str, Any], n: int, master: str, max_batch: int) -> dict[str, Any]:
    """One ``reconciler run --until-caught-up`` with ``master``; wall time from exec to exit."""
    import yaml

    sid = "clicks"
    specs, state = work / tag / "specs", work / tag / "state"
    specs.mkdir(parents=True)
    (specs / f"{sid}.yaml").write_text(yaml.safe_dump(_spec(sid, source) | {"maxBatchRecords": max_batch}))
    env = {**os.environ, "RECONCILER_SPECS": str(specs), "RECONCILER_STATE_DIR": str(state),
           "RECONCILER_HTTP": "", "RECONCILER_CONFIG": os.devnull, "RECONCILER_TICK_INTERVAL": "1",
           "RECONCILER_SPARK_MASTER": master, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    started = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).with_name("reconciler")), "run", "--until-caught-up",
                           "--timeout", "900"], env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"reconciler run ({master}) exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    batches = [(int(m[1]), float(m[2])) for m in _BATCH.finditer(proc.stderr)]
    # the first batch carries the lazy session start (and, on a cluster, the executor launch)
    steady = batches[1:] or batches
    out = {"master": master, **_rate(n, wall), "batches": len(batches),
           "batch_seconds": round(sum(s for _, s in batches), 3),
           "first_batch_seconds": batches[0][1] if batches else None,
           "steady_records_per_s": round(sum(r for r, _ in steady) / sum(s for _, s in steady), 1) if steady else None}
    out["verify"] = _verify(state / "segments", sid, n)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=400_000, help="records (default 400,000)")
    ap.add_argument("--max-batch", type=int, default=100_000, help="maxBatchRecords (default 100,000: several batches)")
    ap.add_argument("--worker-cores", type=int, default=2, help="cores of the one worker (default 2)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    result: dict[str, Any] = {"records": args.records, "partitions": PARTITIONS, "maxBatchRecords": args.max_batch,
                              "cpus": os.cpu_count(), "load_at_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp, devservices.TansuBroker() as broker:
        work = Path(tmp)
        topic = broker.create_topic("bench", PARTITIONS)  # the product's spec as in ingest.py
        log.info("producing %d records", args.records)
        devservices.produce_kafka(broker.bootstrap, topic, devservices.make_records(args.records))
        source = {"type": "kafka", "bootstrapServers": broker.bootstrap, "topic": topic}
        log.info("local[2]")
        result["local"] = run_daemon(work, "local", source, args.records, "local[2]", args.max_batch)
        with StandaloneCluster(cores=args.worker_cores, memory="2g") as cluster:
            log.info("standalone %s", cluster.url)
            result["standalone"] = run_daemon(work, "standalone", source, args.records, cluster.url, args.max_batch)
    loc, sa = result["local"], result["standalone"]
    result["standalone_over_local"] = {
        "wall": round(sa["records_per_s"] / loc["records_per_s"], 3),
        "steady": round(sa["steady_records_per_s"] / loc["steady_records_per_s"], 3)
        if sa["steady_records_per_s"] and loc["steady_records_per_s"] else None}
    result["load_at_end"] = os.getloadavg()[0]
    print(json.dumps(result, indent=2))
    return 0 if loc["verify"]["exactly_once"] and sa["verify"]["exactly_once"] else 1


if __name__ == "__main__":
    sys.exit(main())

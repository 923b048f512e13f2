"""Where a batch's time goes: one Tansu topic, the product's SparkSession, ``run_batch`` timed.

Starts a Tansu broker, produces N records over 4 partitions, builds the product's
session (``reconciler.pipeline.spark.get_session``, with Spark's event log on), then
runs ``run_batch`` on the whole range ``--repeat`` times (the first in a fresh
session, the later ones warm) and prints one JSON document: the session start, each
batch's wall time, and from the event log each Spark job and stage (wall time, task
count, executor run time, the tasks' summed CPU and deserialisation time, records
read). ``--conf key=value`` adds Spark settings (for experiments); ``--alternate KEY=VALUE``
applies a Spark SQL setting to every other batch (an A/B comparison within one session);
``--pyspy DIR`` records a py-spy flame graph of the driver and its Python workers
during one batch (``--pyspy-batch``, the first by default) (needs ``pip install py-spy``).

Usage: ``.venv/bin/python benchmarks/profile_batch.py --records 200000 [--repeat 3]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import devservices  # noqa: E402

log = logging.getLogger("profile")


def _spec(sid: str, bootstrap: str, topic: str, task_count: int):
    return {
        "id": sid,
        "source": {"type": "kafka", "bootstrapServers": bootstrap, "topic": topic},
        "taskCount": task_count,
        "taskDuration": "1s",
        "maxBatchRecords": 1_000_000,
        "dataSchema": {
            "datasource": sid,
            "timestamp": {"column": "ts", "format": "millis"},
            "dimensions": ["id", "user", "page", "__partition", "__offset"],
            "metrics": [{"name": "bytes", "type": "longSum", "field": "bytes"}],
            "granularity": {"segment": "hour", "query": "none", "rollup": False},
        },
    }


def _event_log_summary(path: Path, since_ms: int) -> list[dict[str, Any]]:
    """Jobs (and their stages) that started after ``since_ms``, from a Spark event log file."""
    jobs: dict[int, dict[str, Any]] = {}
    stages: dict[int, dict[str, Any]] = {}
    stage_job: dict[int, int] = {}
    files = sorted(path.glob("events_*")) if path.is_dir() else [path]
    lines = [ln for f in files for ln in f.read_text(encoding="utf-8").splitlines()]
    for line in lines:
        ev = json.loads(line)
        kind = ev.get("Event")
        if kind == "SparkListenerJobStart":
            if ev["Submission Time"] < since_ms:
                continue
            jobs[ev["Job ID"]] = {"job": ev["Job ID"], "start": ev["Submission Time"], "stages": []}
            for sid in ev.get("Stage IDs", []):
                stage_job[sid] = ev["Job ID"]
            desc = (ev.get("Properties") or {}).get("spark.job.description") or ""
            jobs[ev["Job ID"]]["description"] = desc[:80]
        elif kind == "SparkListenerJobEnd" and ev["Job ID"] in jobs:
            j = jobs[ev["Job ID"]]
            j["seconds"] = round((ev["Completion Time"] - j["start"]) / 1000, 3)
        elif kind == "SparkListenerTaskEnd":
            sid = ev["Stage ID"]
            if sid not in stage_job:
                continue
            m = ev.get("Task Metrics") or {}
            info = ev.get("Task Info") or {}
            s = stages.setdefault(sid, {"stage": sid, "tasks": 0, "task_wall_s": 0.0, "run_s": 0.0,
                                        "cpu_s": 0.0, "deser_s": 0.0, "gc_s": 0.0, "records_in": 0,
                                        "records_out": 0, "task_walls": []})
            s["tasks"] += 1
            wall = (info.get("Finish Time", 0) - info.get("Launch Time", 0)) / 1000
            s["task_wall_s"] += wall
            s["task_walls"].append(round(wall, 2))
            s["run_s"] += m.get("Executor Run Time", 0) / 1000
            s["cpu_s"] += m.get("Executor CPU Time", 0) / 1e9
            s["deser_s"] += m.get("Executor Deserialize Time", 0) / 1000
            s["gc_s"] += m.get("JVM GC Time", 0) / 1000
            s["records_in"] += (m.get("Input Metrics") or {}).get("Records Read", 0)
            s["records_out"] += (m.get("Output Metrics") or {}).get("Records Written", 0)
        elif kind == "SparkListenerStageCompleted":
            info = ev["Stage Info"]
            sid = info["Stage ID"]
            if sid in stage_job:
                s = stages.setdefault(sid, {"stage": sid})
                s["name"] = info.get("Stage Name", "")[:60]
                if info.get("Submission Time") and info.get("Completion Time"):
                    s["seconds"] = round((info["Completion Time"] - info["Submission Time"]) / 1000, 3)
    for sid, s in stages.items():
        for k in ("task_wall_s", "run_s", "cpu_s", "deser_s", "gc_s"):
            if k in s:
                s[k] = round(s[k], 3)
        jobs[stage_job[sid]]["stages"].append(s)
    return [jobs[k] for k in sorted(jobs)]


def _tree_cpu(root: int, by: dict[str, float] | None = None) -> float:
    """CPU seconds (user + system, with reaped children) of ``root`` and its live descendants;
    ``by`` collects them per kind of process (driver, jvm, each Python worker module)."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(d)] = fields
        children.setdefault(int(fields[1]), []).append(int(d))
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        f = stats.get(pid)
        if f:
            cpu = sum(int(x) for x in f[11:15]) / tick
            total += cpu
            if by is not None:
                kind = _kind(pid, root)
                by[kind] = by.get(kind, 0.0) + cpu
                if kind == "jvm":
                    by["jvm/reaped children"] = sum(int(x) for x in f[13:15]) / tick
                    for name, t in _threads_cpu(pid).items():
                        by[f"jvm/{name}"] = by.get(f"jvm/{name}", 0.0) + t / tick
        todo.extend(children.get(pid, []))
    return total


def _threads_cpu(pid: int) -> dict[str, int]:
    """CPU ticks of a process's threads, by thread name with digits dropped."""
    out: dict[str, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")].rstrip("0123456789 #-")
        ticks = sum(int(x) for x in text.rsplit(")", 1)[1].split()[11:13])
        out[name] = out.get(name, 0) + ticks
    return out


def _kind(pid: int, root: int) -> str:
    if pid == root:
        return "driver"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return "?"
    if args and args[0].endswith(b"java"):
        return "jvm"
    text = [a.decode(errors="replace") for a in args if a]
    return "py:" + (text[-1].rsplit(".", 1)[-1] if text else "?")


def _pyspy(pid: int, out: Path, seconds: float, idle: bool = True) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("py-spy")
    return subprocess.Popen([str(exe), "record", "--pid", str(pid), "--subprocesses", *(["--idle"] if idle else []), "-r", "50",
                             "-d", str(int(seconds)), "-f", "raw", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3, help="batches over the same range (first cold, then warm)")
    ap.add_argument("--task-count", type=int, default=2)
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--conf", action="append", default=[], help="extra Spark setting key=value")
    ap.add_argument("--pyspy", metavar="DIR", help="py-spy record one batch (driver and workers) into DIR")
    ap.add_argument("--pyspy-batch", type=int, default=0, help="which batch --pyspy records (0: the cold one)")
    ap.add_argument("--pyspy-seconds", type=float, default=40)
    ap.add_argument("--pyspy-busy", action="store_true",
                    help="leave out the samples of threads waiting in a system call (py-spy's default)")
    ap.add_argument("--max-batch-rows", type=int, default=None)
    ap.add_argument("--step-ms", type=int, default=1000,
                    help="event time between records (1000: 1M records span 278 hourly chunks; 1: one)")
    ap.add_argument("--alternate", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark SQL setting applied to every other batch (odd ones), for an A/B "
                         "comparison within one session")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    work = Path(tempfile.mkdtemp(prefix="reconciler-profile-"))
    events = work / "events"
    events.mkdir()
    conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(events),
            "spark.eventLog.compress": "false"}
    for kv in args.conf:
        k, _, v = kv.partition("=")
        conf[k] = v
    doc: dict[str, Any] = {"records": args.records, "task_count": args.task_count, "conf": conf,
                           "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    with devservices.TansuBroker() as broker:
        broker.create_topic("prof", 4)
        t = time.perf_counter()
        ends = devservices.produce_kafka(broker.bootstrap, "prof", devservices.make_records(args.records))
        doc["produce_seconds"] = round(time.perf_counter() - t, 3)

        t = time.perf_counter()
        from reconciler.model import PartitionRange, SupervisorSpec
        from reconciler.pipeline.batch import run_batch
        from reconciler.pipeline.spark import get_session, stop_session
        doc["import_seconds"] = round(time.perf_counter() - t, 3)

        spec = SupervisorSpec.from_document(_spec("prof", broker.bootstrap, "prof", args.task_count))
        ranges = [PartitionRange(str(p), 0, e) for p, e in sorted(ends.items())]
        t = time.perf_counter()
        spark = get_session(args.master, conf=conf)
        doc["session_seconds"] = round(time.perf_counter() - t, 3)
        batches = []
        for i in range(args.repeat):
            spy = None
            if args.pyspy and i == args.pyspy_batch:
                Path(args.pyspy).mkdir(parents=True, exist_ok=True)
                spy = _pyspy(os.getpid(), Path(args.pyspy) / f"batch{i}.txt", args.pyspy_seconds,
                             idle=not args.pyspy_busy)
                time.sleep(1.0)
            variant = "B" if args.alternate and i % 2 else "A"
            for kv in args.alternate:
                k, _, v = kv.partition("=")
                if variant == "B":
                    spark.conf.set(k, v)
                else:
                    spark.conf.unset(k)
            since = int(time.time() * 1000)
            by0: dict[str, float] = {}
            cpu0 = _tree_cpu(os.getpid(), by0)
            t = time.perf_counter()
            # The product's batch: one Arrow task per group of sub-ranges reads, transforms and
            # writes its files; the driver gathers their descriptions.
            out = work / "data" / f"b{i}"
            written = run_batch(spark, spec, ranges, f"b{i}", data_dir=out, dead_dir=work / "dead" / f"b{i}",
                                task_count=args.task_count, max_batch_rows=args.max_batch_rows)
            secs = time.perf_counter() - t
            by1: dict[str, float] = {}
            cpu = _tree_cpu(os.getpid(), by1) - cpu0
            cpu_by = {k: round(v - by0.get(k, 0.0), 2) for k, v in sorted(by1.items())}
            files = list(out.rglob("*.parquet"))
            if spy is not None:
                spy.wait()
            batches.append({"variant": variant, "seconds": round(secs, 3), "cpu_seconds": round(cpu, 2), "cpu_by_process": cpu_by,
                            "records": written.input_rows, "dead": written.dead_rows,
                            "files": len(files), "records_per_s": round(args.records / secs, 1),
                            "since_ms": since})
            log.info("batch %d: %.2fs", i, secs)
        app = spark.sparkContext.applicationId
        stop_session()
        logs = sorted(events.iterdir())
        for b in batches:
            b["jobs"] = _event_log_summary(logs[-1], b.pop("since_ms")) if logs else []
        # jobs of batch i also appear in batch i-1's window: cut each window at the next one's start
        for i in range(len(batches) - 1):
            nxt = {j["job"] for j in batches[i + 1]["jobs"]}
            batches[i]["jobs"] = [j for j in batches[i]["jobs"] if j["job"] not in nxt]
        doc["app"] = app
        doc["batches"] = batches
    doc["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

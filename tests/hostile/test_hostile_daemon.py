"""Hostile input against a live daemon (issue 17): a separate ``reconciler run`` process on a
real Tansu broker and its own Spark, fed out-of-range times, patterned names with a newline,
numbers that are not counts, reserved columns, secrets that librdkafka echoes, and a storm of
300 SIGHUPs. The daemon must stay alive, keep reconciling and ingesting exactly once, answer
``/healthz`` truthfully, stop on the first SIGTERM, and leave the planted secret nowhere: not
in its log, any database file, the state directory, ``status``, ``history`` or ``/healthz``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

import devservices
from reconciler.errors import RetryableError
from reconciler.store.store import Store
from tests.e2e import helpers

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

PLANTED_FILE = "root:x:0:0:PLANTED-f1le-7d2c:/root:/bin/bash\nbin:x:2:2:PLANTED-f1le-0e9b:/bin:/usr/sbin/nologin"
PLANTED_ENV = "PLANTED-env-5b81c4"
MARKS = ("PLANTED-f1le", PLANTED_ENV)


def _healthz(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _wait(what: str, cond, timeout: float, proc: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the daemon exited ({proc.returncode}) while waiting for {what}:\n"
                        + log.read_text(errors="replace")[-4000:])
        value = cond()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"no {what} within {timeout}s:\n" + log.read_text(errors="replace")[-4000:])


def _hostile_files(specs: Path, bootstrap: str, secret_file: Path) -> dict[str, str]:
    """file name -> the text its error must contain (all appear while the daemon runs)."""
    src = helpers.kafka_source(bootstrap, "hostile-nowhere")
    files = {
        "neg.yaml": (helpers.spec_doc("neg", src, start_from={"timestamp": "-99999999d"}), "before 1970"),
        "nl.yaml": (helpers.spec_doc("nl\n", src), "contains a line break"),
        "dims.yaml": (helpers.spec_doc("dims", src, dimensions=["id", "__time"]), "reserved: __time"),
        "float.yaml": (helpers.spec_doc("float", src, task_count=2.0), "expected integer, got number 2.0"),
        "big.yaml": (helpers.spec_doc("big", src, max_batch_records=1.0e300), "expected integer"),
        "zero.yaml": (helpers.spec_doc("zero", src, task_duration="0ms"), "too short"),
        # a spec taking the name the next backfill of "good" would get
        "good-backfill-1.yaml": (helpers.spec_doc("good-backfill-1", src), "-backfill-<n> is reserved"),
    }
    for name, (doc, _) in files.items():
        (specs / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    (specs / "good.reset.yaml").write_text('resetTo: {timestamp: "0001-01-01T00:00:00+14:00"}\n')
    # Two supervisors whose clients echo a secret: librdkafka rejects the file's contents as
    # security.protocol (quoting a truncated copy), and warns "sasl.mechanism set to '<value>'".
    for sid, props in (("leak-file", {"security.protocol": f"${{file:{secret_file}}}"}),
                       ("leak-env", {"sasl.mechanism": "${env:HOSTILE_PLANTED}"})):
        doc = helpers.spec_doc(sid, helpers.kafka_source(bootstrap, "hostile-leak", **props))
        (specs / f"{sid}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return {name: why for name, (_, why) in files.items()}


def test_hostile_input_and_a_signal_storm_on_a_live_daemon(tmp_path, kafka_broker, topic, spark):
    bootstrap = kafka_broker.bootstrap
    port = devservices.free_port()
    s = helpers.make_settings(tmp_path, http=f"127.0.0.1:{port}", spark_master="local[1]")
    specs = Path(s.specs)
    (tmp_path / "secrets").mkdir()
    secret_file = tmp_path / "secrets" / "planted-secret"  # granted: the operator's secrets directory
    secret_file.write_text(PLANTED_FILE)

    good_topic = topic(partitions=2)
    helpers.write_spec(specs, helpers.spec_doc("good", helpers.kafka_source(bootstrap, good_topic)))
    first = devservices.make_records(2000)
    devservices.produce_kafka(bootstrap, good_topic, first)

    env = {**os.environ, **helpers.settings_env(s), "PYSPARK_PYTHON": sys.executable,
           "HOSTILE_PLANTED": PLANTED_ENV, "RECONCILER_SECRETS_DIR": str(tmp_path / "secrets"),
           "RECONCILER_SECRET_ENV": "HOSTILE_PLANTED"}
    env.pop("NOTIFY_SOCKET", None)
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(helpers.RECONCILER_BIN), "run"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    store = None
    try:
        _wait("the database", lambda: (Path(s.state_dir) / "reconciler.db").exists(), 60, proc, log)
        store = Store(s.db_url)

        def ingested() -> int:
            try:  # the file exists before the daemon's migration made its tables
                return sum(store.checkpoints("good").values()) if store.get("good") else 0
            except RetryableError:
                return 0

        _wait("the first batch", lambda: ingested() > 0, 240, proc, log)

        errors = _hostile_files(specs, bootstrap, secret_file)
        _wait("the bad marker rejected", lambda: (specs / "good.reset.yaml.rejected").exists(), 60, proc, log)
        rejected = (specs / "good.reset.yaml.rejected").read_text()
        assert "out of range" in rejected, rejected
        _wait("both leaking supervisors failing",
              lambda: all((store.get(sid) and store.get(sid).runtime_error) for sid in ("leak-file", "leak-env"))
              or None, 120, proc, log)

        # 300 SIGHUPs as fast as they can be sent: the loop must not deadlock
        for _ in range(300):
            os.kill(proc.pid, signal.SIGHUP)
        second = devservices.make_records(1000, start=2000)
        # 9999's last hour is a row like any other; the year 10000 has no chunk, no Iceberg
        # partition and no Python datetime: a dead letter, never a batch that cannot publish.
        edges = [(k, json.dumps({"id": k, "ts": ts, "user": "u", "page": "/p", "bytes": 1}).encode())
                 for k, ts in (("last-hour", 253_402_300_799_000), ("year-10000", 253_402_300_800_000))]
        ends = devservices.produce_kafka(bootstrap, good_topic, second + edges)
        late_topic = topic(partitions=1)
        helpers.write_spec(specs, helpers.spec_doc("late", helpers.kafka_source(bootstrap, late_topic)))
        _wait("a spec added after the storm reconciled", lambda: store.get("late") is not None, 60, proc, log)
        want = {str(p): e for p, e in ends.items()}
        _wait("the second wave ingested", lambda: store.checkpoints("good") == want, 240, proc, log)

        # a reset of "good" beside the refused good-backfill-1 spec: no collision, no traceback
        reset = subprocess.run([str(helpers.RECONCILER_BIN), "reset", "good", "--to", "latest"], env=env,
                               capture_output=True, text=True, timeout=120)
        assert reset.returncode == 0 and "Traceback" not in reset.stderr, reset.stderr

        code, health = _healthz(port)
        assert health["secondsSinceLoop"] is not None and health["secondsSinceLoop"] < 5, health
        assert not any("loop" in p for p in health["problems"]), health
        assert code == 503 and set(health["failing"]) >= {"leak-file"}, health  # truthful: two fail
        healthz_text = json.dumps(health)

        status = subprocess.run([str(helpers.RECONCILER_BIN), "status", "--no-lag", "-o", "json"], env=env,
                                capture_output=True, text=True, timeout=120)
        assert status.returncode == 0, status.stderr
        history = "".join(subprocess.run([str(helpers.RECONCILER_BIN), "history", sid], env=env,
                                         capture_output=True, text=True, timeout=120).stdout
                          for sid in ("leak-file", "leak-env"))
        assert "leak-file" in status.stdout

        proc.send_signal(signal.SIGTERM)  # the first SIGTERM is heard
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if store is not None:
            store.close()

    text = log.read_text(errors="replace")
    # every hostile file reported by name, with its reason; the daemon never crashed
    for name, why in errors.items():
        assert any(name in line and why in line for line in text.splitlines()), f"{name}: {why} not reported"
    assert "unexpected error" not in text  # each case met a check made for it, not the last-resort catch

    # the planted secret is nowhere
    places = {"daemon log": text, "status": status.stdout, "history": history, "/healthz": healthz_text}
    for path in Path(s.state_dir).rglob("*"):
        if path.is_file():
            places[str(path)] = path.read_bytes().decode("latin-1")
    for path in specs.iterdir():
        if path.is_file():
            places[str(path)] = path.read_bytes().decode("latin-1")
    for where, content in places.items():
        for mark in MARKS:
            assert mark not in content, f"{mark} leaked into {where}"
    assert "***" in text  # the echo was there, hidden

    # exactly once, by key, for the supervisor that kept ingesting through all of it
    helpers.assert_exactly_once(helpers.key_counts(spark, s, "good"), [*helpers.keys(first + second), "last-hour"])
    reasons = [reason for _, _, reason in helpers.deadletters(spark, s, "good")]
    assert reasons == ["timestamp out of range (years 1 to 9999): 253402300800000"], reasons

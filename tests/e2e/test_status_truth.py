"""``status`` from another process, beside a real daemon (its own process, its own Spark JVM) and a
real Tansu broker: what it says agrees with what the daemon knows (issue 46, the second newcomer run).

- Spark as the leader's ``/healthz`` says it, with a standby daemon sharing the state directory
  (a standby once replaced the leader's record with its own "not started": ``spark: None
  application - not started`` beside a ``/healthz`` that said up).
- A supervisor the database holds as IDLE is not shown IDLE beside the burst of records that
  arrived after its last look (taskDuration 60s holds that window open for the test).
- After a restart with the broker down, a supervisor whose first look failed is not shown
  IDLE (green on the page) beside LOST_CONTACT_WITH_STREAM.
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

import devservices
from devservices import free_port
from tests.e2e import helpers as h


class Daemons:
    """``reconciler run`` subprocesses, each in its own session; what is left is killed at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, s) -> tuple[subprocess.Popen, Path]:
        log = self.root / f"{name}.log"
        env = {**os.environ, **h.settings_env(s), "PYSPARK_PYTHON": sys.executable}
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(h.RECONCILER_BIN), "run"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc, log

    def stop(self, proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)


@pytest.fixture
def daemons(tmp_path):
    d = Daemons(tmp_path)
    yield d
    d.close()


def wait_for(cond, timeout: float, what: str, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    pytest.fail(f"{what}: not within {timeout}s\n{tail}")


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def healthz(port: int) -> dict | None:
    code, body = get(f"http://127.0.0.1:{port}/healthz")
    return json.loads(body) if code else None


def one(s, sid: str, *args: str) -> dict:
    """``status ID -o json``'s supervisor; ``{}`` while the daemon has not created it yet."""
    code, out = h.run_cli(s, "status", sid, *args, "-o", "json")
    return json.loads(out)["supervisors"][0] if code == 0 else {}


def test_status_says_what_the_running_daemon_knows(kafka_broker, topic, tmp_path, daemons):
    name = topic(partitions=1)
    devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(10))
    port = free_port()
    s = h.make_settings(tmp_path, spark_master="local[1]", http=f"127.0.0.1:{port}", lease_ttl=5.0)
    h.write_spec(s.specs, h.spec_doc("clicks", h.kafka_source(kafka_broker.bootstrap, name), task_duration="60s"))
    leader, log = daemons.start("leader", s)
    health = wait_for(lambda: (b := healthz(port)) and b["spark"]["state"] == "up" and b, 180,
                      "the leader's Spark session up", log)
    wait_for(lambda: one(s, "clicks", "--no-lag").get("state") == "IDLE", 120, "clicks IDLE", log)

    # a standby beside it, sharing the state directory (a second host's daemon, or a second unit)
    standby_settings = h.make_settings(tmp_path, spark_master="local[1]", http="", lease_ttl=5.0)
    _, standby_log = daemons.start("standby", standby_settings)
    # its heartbeat is written after its start-up, where it once replaced the leader's record
    wait_for(lambda: len(h.cli_json(s, "status", "--no-lag")["daemons"]) == 2, 60, "the standby's heartbeat",
             standby_log)
    code, text = h.run_cli(s, "status", "--no-lag")
    assert code == 0, text
    spark = h.cli_json(s, "status", "--no-lag")["spark"]
    assert (spark["state"], spark["appId"], spark["master"]) == ("up", health["spark"]["appId"], "local[1]"), spark
    assert spark["daemon"].split(":")[1] == str(leader.pid)
    line = next(x for x in text.splitlines() if x.startswith("spark:"))
    assert "None" not in line and f"application {health['spark']['appId']}" in line and "up since" in line

    # a burst after its last look: records behind it, so not IDLE (its next look is up to 60 s away)
    devservices.produce_kafka(kafka_broker.bootstrap, name, devservices.make_records(20_000, start=10))
    item = one(s, "clicks")
    assert item["lag"] > 0, item
    # -o json: the state as recorded (Druid's), the one shown beside it
    assert item["shownState"] == "RUNNING" and item["state"] == "IDLE" and "stateNote" in item, item
    code, text = h.run_cli(s, "status")
    row = next(x for x in text.splitlines() if x.startswith("clicks "))
    assert "IDLE" not in row, text
    assert "clicks: " in text and "arrived after its last look" in text and "taskDuration (60s)" in text

    # no daemon: said plainly, with how the last session ended
    for proc in daemons.procs:
        daemons.stop(proc)
    wait_for(lambda: not h.cli_json(s, "status", "--no-lag")["daemons"], 30, "no daemon listed")
    code, text = h.run_cli(s, "status", "--no-lag")
    line = next(x for x in text.splitlines() if x.startswith("spark:"))
    assert line.startswith("spark: no daemon is running; the last one's session stopped at ") and "None" not in line


def test_after_a_restart_with_the_broker_down_a_failed_look_is_not_shown_healthy(tmp_path, daemons):
    broker = devservices.TansuBroker()
    broker.start()
    try:
        broker.create_topic("clicks", 1)
        devservices.produce_kafka(broker.bootstrap, "clicks", devservices.make_records(10))
        port = free_port()
        s = h.make_settings(tmp_path, spark_master="local[1]", http=f"127.0.0.1:{port}", lease_ttl=5.0)
        h.write_spec(s.specs, h.spec_doc("clicks", h.kafka_source(broker.bootstrap, "clicks"), task_duration="1s"))
        first, log = daemons.start("first", s)
        wait_for(lambda: one(s, "clicks", "--no-lag").get("state") == "IDLE", 180, "clicks IDLE", log)
        daemons.stop(first)
    finally:
        broker.stop()
    _, log = daemons.start("restarted", s)
    # the first look that fails: the database keeps IDLE (a few failures in a row make it UNHEALTHY)
    item = wait_for(lambda: (i := one(s, "clicks", "--no-lag")).get("detailedState") == "LOST_CONTACT_WITH_STREAM" and i,
                    120, "the restarted daemon's first failed look", log)
    assert item["shownState"] == "UNHEALTHY_SUPERVISOR" and item["lastError"], item
    assert (item["state"], item["detailedState"]) == ("IDLE", "LOST_CONTACT_WITH_STREAM"), item
    code, page = get(f"http://127.0.0.1:{port}/")
    assert code == 200
    row = page[page.index('id="sup-clicks"'):]
    row = row[:row.index("</tr>")]
    assert "st-IDLE" not in row and "st-UNHEALTHY_SUPERVISOR" in row, row

"""A config repo shared by many teams (issue 29), against a live daemon: nine hostile cases in
the spec directory beside a supervisor that keeps ingesting from a real Tansu broker, with the
operator granting secrets through ``RECONCILER_SECRETS_DIR`` and ``RECONCILER_SECRET_ENV``.

The cases: (1) a RabbitMQ URI Python's parser rejects; (2) a ``://`` value the parser rejects
in a valid spec; (3) ``${file:}`` of a FIFO in the secrets directory, and of ``/dev/zero``;
(4) a spec and a marker whose names are not UTF-8; (5) column names that clash in case or are
reserved in another case; (6) a datasource that is another's dead-letter table, and two
supervisors of one datasource whose columns clash; (7) a spec sending another team's file and
an ungranted variable to the writer's own listener, one borrowing another team's TLS key, one
running a shell command; (8) links committed as dotfiles at the temporary names marker
retirement once used, pointing at a file outside the directory; (9) reasons carrying a line
break and terminal escapes, in a marker and on the command line.

Checked: nothing ungranted reaches the listener; no file outside the directory changes;
``validate`` refuses what the daemon cannot run (by directory and by file names); ``plan``
exits 1 without a traceback; ``status`` answers; the good supervisor ingests every key exactly
once; ``history`` prints no raw control character; ``/healthz`` answers beside 300 idle
connections.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
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
from tests.hostile.test_hostile_daemon import _wait

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

OTHER_TEAM_FILE = "OTHER-TEAM-f1le-9c2e"
OTHER_TEAM_ENV = "OTHER-TEAM-env-4d71"
GRANTED_ID = "granted-client-5a3b"
FORGED = "INC-29\n2026-11-24 09:00:00Z  reset              by cli:root  reason: approved\x1b[2J\x1b[31m\u202e"
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


class Listener:
    """The spec writer's own 'broker': a TCP listener that records every byte it is sent."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received = bytearray()
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn):
        with conn:
            while chunk := conn.recv(65536):
                self.received += chunk


def _fingerprints(root: Path, skip: tuple[Path, ...]) -> dict[str, tuple[str, int]]:
    """sha256 and mode of every regular file under ``root`` outside ``skip`` (links not followed)."""
    out = {}
    for path in root.rglob("*"):
        if any(path == s or s in path.parents for s in skip) or path.is_symlink() or not path.is_file():
            continue
        out[str(path)] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mode)
    return out


def _hostile_files(specs: Path, bootstrap: str, listener: Listener, outside: Path, victim: Path,
                   empty_topic: str) -> list[str]:
    """Writes the hostile cases; returns the spec files the daemon cannot run."""
    src = helpers.kafka_source(bootstrap, empty_topic)
    docs = {
        # (1) one spec stops everyone: a URI Python's parser rejects
        "bad-uri": helpers.spec_doc("bad-uri", helpers.rabbit_source(
            "rabbitmq-stream://guest:guest@[fd00::5:5552/%2f", ["s"])),
        # (3) a FIFO in the secrets directory, and a device
        "fifo": helpers.spec_doc("fifo", helpers.kafka_source(bootstrap, empty_topic,
                                                              **{"sasl.password": "${file:pipe}"})),
        "zero": helpers.spec_doc("zero", helpers.kafka_source(bootstrap, empty_topic,
                                                              **{"sasl.password": "${file:/dev/zero}"})),
        # (5) columns the pipeline refuses
        "columns": helpers.spec_doc("columns", src, dimensions=["user", "USER", "__TIME", "Time_Chunk"]),
        # (6) the dead-letter table of "good", and two supervisors of one table that disagree
        "sneaky": helpers.spec_doc("sneaky", src, datasource="good_deadletter"),
        "clash-a": helpers.spec_doc("clash-a", src, datasource="shared", dimensions=["id", "bytes"]),
        "clash-b": helpers.spec_doc("clash-b", src, datasource="shared", dimensions=["id"]),
        # (7) another team's secrets to the writer's own listener; another team's key; a shell
        "thief": helpers.spec_doc("thief", helpers.kafka_source(
            f"127.0.0.1:{listener.port}", "loot",
            **{"client.id": f"${{file:{outside / 'cred'}}}+${{env:OTHER_TEAM_TOKEN}}"})),
        "thief-key": helpers.spec_doc("thief-key", helpers.kafka_source(
            f"127.0.0.1:{listener.port}", "loot", **{"security.protocol": "SSL",
                                                     "ssl.key.location": str(outside / "cred")})),
        "thief-cmd": helpers.spec_doc("thief-cmd", helpers.kafka_source(
            f"127.0.0.1:{listener.port}", "loot",
            **{"sasl.kerberos.kinit.cmd": f"cp {outside / 'cred'} {victim}"})),
    }
    for name, doc in docs.items():
        (specs / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    # (2) a value the URL parser rejects in a spec that is otherwise fine (it runs)
    rack = helpers.spec_doc("rack", helpers.kafka_source(bootstrap, empty_topic, **{"client.rack": "http://[rack-a"}))
    (specs / "rack.yaml").write_text(yaml.safe_dump(rack, sort_keys=False))
    # (4) names that are not UTF-8
    raw = os.fsencode(str(specs))
    with open(os.path.join(raw, b"evil\xff.yaml"), "w") as f:
        f.write(yaml.safe_dump(helpers.spec_doc("evil", src), sort_keys=False))
    with open(os.path.join(raw, b"good\xfe.reset.yaml"), "w") as f:
        f.write("resetTo: earliest\nallowRewind: true\n")
    # (8) links at every temporary name marker retirement used, to a file outside
    for status in ("applied", "rejected"):
        for sid in ("good", "nobody"):
            (specs / f".{sid}.reset.yaml.{status}.tmp").symlink_to(victim)
    return [*docs, "evil\\xff"]


def test_nine_hostile_cases_beside_a_supervisor_that_keeps_ingesting(tmp_path, kafka_broker, topic):
    bootstrap = kafka_broker.bootstrap
    port = devservices.free_port()
    s = helpers.make_settings(tmp_path, http=f"127.0.0.1:{port}", spark_master="local[1]")
    specs, listener = Path(s.specs), Listener()
    secrets_dir, outside = tmp_path / "secrets", tmp_path / "other-team"
    secrets_dir.mkdir()
    outside.mkdir()
    (secrets_dir / "good-client-id").write_text(GRANTED_ID + "\n")
    os.mkfifo(secrets_dir / "pipe")
    (outside / "cred").write_text(OTHER_TEAM_FILE)
    victim = tmp_path / "victim.db"
    victim.write_bytes(b"SQLite format 3\x00 another database")

    good_topic, empty_topic = topic(partitions=2), topic(partitions=1)
    helpers.write_spec(specs, helpers.spec_doc("good", helpers.kafka_source(
        bootstrap, good_topic, **{"client.id": f"${{file:{secrets_dir / 'good-client-id'}}}-${{env:GRANTED_SUFFIX}}"})))
    first = devservices.make_records(2000)
    devservices.produce_kafka(bootstrap, good_topic, first)

    env = {**os.environ, **helpers.settings_env(s), "PYSPARK_PYTHON": sys.executable,
           "RECONCILER_SECRETS_DIR": str(secrets_dir), "RECONCILER_SECRET_ENV": "GRANTED_SUFFIX",
           "GRANTED_SUFFIX": "x1", "OTHER_TEAM_TOKEN": OTHER_TEAM_ENV}
    env.pop("NOTIFY_SOCKET", None)
    untouched = _fingerprints(tmp_path, (specs, Path(s.state_dir), Path(s.segments_dir)))
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(helpers.RECONCILER_BIN), "run"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    store = None

    def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(helpers.RECONCILER_BIN), *args], env=env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    try:
        _wait("the database", lambda: (Path(s.state_dir) / "reconciler.db").exists(), 90, proc, log)
        store = Store(s.db_url)

        def checkpoints(sid: str) -> dict[str, int]:
            try:  # the file exists before the daemon's migration made its tables
                return store.checkpoints(sid) if store.get(sid) else {}
            except RetryableError:
                return {}

        _wait("the first batch", lambda: sum(checkpoints("good").values()) > 0, 300, proc, log)

        cannot_run = _hostile_files(specs, bootstrap, listener, outside, victim, empty_topic)
        second = devservices.make_records(1000, start=2000)
        ends = {str(p): e for p, e in devservices.produce_kafka(bootstrap, good_topic, second).items()}
        _wait("the hostile files reported", lambda: store.get("good") and store.get("good").spec_error
              and "good_deadletter" in store.get("good").spec_error, 120, proc, log)
        _wait("the second wave ingested by 'good'", lambda: checkpoints("good") == ends, 300, proc, log)
        _wait("the valid neighbour created", lambda: store.get("rack") is not None, 60, proc, log)
        _wait("the marker named in bad UTF-8 rejected",
              lambda: os.path.exists(os.path.join(os.fsencode(str(specs)), b"good\xfe.reset.yaml.rejected")),
              60, proc, log)

        # (9) a marker's reason, and an unknown supervisor's marker, retired past the planted links
        (specs / "good.reset.yaml").write_text(f"resetTo: latest\nreason: {json.dumps(FORGED)}\n")
        (specs / "nobody.reset.yaml").write_text("resetTo: latest\n")
        _wait("both markers retired", lambda: (specs / "good.reset.yaml.applied").exists()
              and (specs / "nobody.reset.yaml.rejected").exists(), 120, proc, log)
        reset = cli("reset", "good", "--to", "latest", "--reason", FORGED)
        assert reset.returncode == 0 and "Traceback" not in reset.stderr, reset.stderr

        # validate refuses what the daemon cannot run: the directory, and the files named together
        validated = cli("validate", "-o", "json", str(specs))
        assert validated.returncode == 1
        refused = {Path(p["path"]).name for p in json.loads(validated.stdout)["problems"]}
        assert refused >= {f"{n}.yaml" for n in cannot_run} | {"good.yaml"}, refused  # good: beside 'sneaky'
        assert "rack.yaml" not in refused
        named = cli("validate", str(specs / "good.yaml"), str(specs / "sneaky.yaml"))
        assert named.returncode == 1 and "dead-letter table" in named.stdout
        # ... and the daemon ran exactly what validate accepts: nothing of the refused files
        actual = store.read_actual()
        assert set(actual.supervisors) >= {"good", "rack"}
        assert not set(actual.supervisors) & (set(cannot_run) - {"good"}), set(actual.supervisors)

        plan = cli("plan", "--no-positions")
        assert plan.returncode == 1 and "Traceback" not in plan.stderr, plan.stderr
        assert not RAW_CONTROL.search(plan.stdout + plan.stderr)

        started = time.monotonic()
        status = cli("status", timeout=60)  # asks every stream for its lag
        took = time.monotonic() - started
        assert status.returncode == 0, status.stderr
        assert {"good", "rack"} <= set(re.findall(r"^(\S+)\s", status.stdout, re.MULTILINE))
        status_json = json.loads(cli("status", "--no-lag", "-o", "json").stdout)
        assert {x["id"] for x in status_json["supervisors"]} >= {"good", "rack"}

        history = cli("history", "good")
        assert history.returncode == 0 and not RAW_CONTROL.search(history.stdout), history.stdout
        assert history.stdout.count("reason: INC-29\\n2026-11-24") >= 2  # the marker's and the command's
        exact = json.loads(cli("history", "good", "-o", "json").stdout)
        assert sum(e["reason"] == FORGED for e in exact) >= 2, "JSON keeps the reason exact"

        # /healthz beside 300 idle connections
        threads_before = len(os.listdir(f"/proc/{proc.pid}/task"))
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(300)]
        try:
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as r:
                    health = json.loads(r.read())
            except urllib.error.HTTPError as exc:  # 503 still answers, with its reasons
                health = json.loads(exc.read())
            threads = len(os.listdir(f"/proc/{proc.pid}/task"))
        finally:
            for sock in idle:
                sock.close()
        assert health["secondsSinceLoop"] is not None and health["secondsSinceLoop"] < 10, health
        assert threads - threads_before < 20, (threads_before, threads)  # a thread per socket was 300 more

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=180) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if store is not None:
            store.close()

    text = log.read_text(errors="replace")
    print(f"status took {took:.1f}s; daemon threads {threads_before}, beside 300 idle connections {threads}")
    # nothing ungranted reached the listener (no spec that names it was ever run)
    got = bytes(listener.received)
    assert OTHER_TEAM_FILE.encode() not in got and OTHER_TEAM_ENV.encode() not in got
    assert listener.connections == 0, f"the daemon connected to the writer's listener: {got[:200]!r}"
    # no file outside the directory changed, the other database included
    assert _fingerprints(tmp_path, (specs, Path(s.state_dir), Path(s.segments_dir), log)) == {
        k: v for k, v in untouched.items() if k != str(log)}
    assert victim.read_bytes() == b"SQLite format 3\x00 another database"
    # nothing ungranted anywhere the daemon wrote or said
    for where, content in {"daemon log": text, "status": status.stdout,
                           "history": history.stdout}.items():
        assert OTHER_TEAM_FILE not in content and OTHER_TEAM_ENV not in content, where
    assert "reconcile aborted" not in text and "unexpected error" not in text
    # the good supervisor: every key exactly once (it kept its last valid spec)
    helpers.assert_exactly_once(helpers.key_counts(None, s, "good"), helpers.keys(first + second))

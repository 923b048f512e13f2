"""`reconciler run` under systemd's eyes: sd_notify, watchdog, signals, config reload.

The integration tests start `<venv>/bin/reconciler run` as a separate process (its own
Spark JVM) with ``NOTIFY_SOCKET`` pointing at a bound AF_UNIX datagram socket of the
test, which records every message the way systemd would receive it.

* READY=1 once the loop runs, WATCHDOG=1 + STATUS from the loop at least every second,
  also while a (cold, long) Spark batch runs: the loop never waits on Spark;
* SIGTERM: STOPPING=1, the in-flight batch finishes and publishes, exit 0, nothing
  half-published (no staging leftovers, checkpoints == committed ranges, every key once);
* a second SIGTERM exits at once (killed by the signal); the next start recovers and
  every key is still there exactly once;
* SIGHUP: RELOADING=1 then READY=1, the new tickInterval, logLevel and logFormat
  (JSON, one event per line) in effect; a broken config file keeps the old settings;
* a hung pass silences WATCHDOG=1 (the pings come from the loop itself);
* without NOTIFY_SOCKET every notification is a no-op; log lines carry journald
  priorities when stderr is the journal.

Helpers here (``NotifySocket``, ``start_daemon``, ``wait_until``, ``assert_consistent``)
are shared with the other daemon tests.
"""

from __future__ import annotations

import collections
import io
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

import devservices
from reconciler import logs
from reconciler.daemon import notify
from reconciler.store.store import Store
from tests.e2e import helpers

N = 8_000


# --------------------------------------------------------------------------- helpers


class NotifySocket:
    """A stand-in for systemd's notification socket: a bound AF_UNIX datagram socket that
    records ``(monotonic time, {field: value})`` for every datagram it receives."""

    def __init__(self) -> None:
        # sun_path is limited to 108 bytes: pytest's tmp_path can be longer.
        self.dir = tempfile.mkdtemp(prefix="sdn-", dir="/tmp")
        self.path = os.path.join(self.dir, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append((time.monotonic(), fields))

    def times(self, key: str, value: str | None = None, *, after: float = 0.0) -> list[float]:
        return [t for t, f in list(self.messages) if key in f and (value is None or f[key] == value) and t >= after]

    def statuses(self) -> list[str]:
        return [f["STATUS"] for _t, f in list(self.messages) if "STATUS" in f]

    def wait_for(self, key: str, value: str | None = None, *, after: float = 0.0, timeout: float = 60.0,
                 proc: subprocess.Popen | None = None, log: Path | None = None) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hits = self.times(key, value, after=after)
            if hits:
                return hits[0]
            if proc is not None and proc.poll() is not None:
                pytest.fail(f"daemon exited ({proc.returncode}) before {key}={value or '*'}\n{tail(log)}")
            time.sleep(0.02)
        pytest.fail(f"no {key}={value or '*'} within {timeout}s; got {self.messages[-5:]}\n{tail(log)}")

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(timeout=2)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> NotifySocket:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def tail(log: Path | None, lines: int = 40) -> str:
    if log is None or not Path(log).exists():
        return ""
    return "\n".join(Path(log).read_text(errors="replace").splitlines()[-lines:])


def daemon_env(settings=None, **extra: str) -> dict[str, str]:
    """The test's environment minus anything systemd or the reconciler would read, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RECONCILER_", "NOTIFY_SOCKET", "WATCHDOG_", "JOURNAL_STREAM"))}
    if settings is not None:
        env.update(helpers.settings_env(settings))
    env["PYSPARK_PYTHON"] = sys.executable
    env.update(extra)
    return env


class Daemons:
    """Starts ``reconciler`` subprocesses (each in its own session) and kills leftovers at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, env: dict[str, str], *args: str) -> tuple[subprocess.Popen, Path]:
        log = self.tmp_path / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(helpers.RECONCILER_BIN), *(args or ("run",))], env=env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc, log

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
            wait_group_gone(proc.pid)


def wait_group_gone(pgid: int, timeout: float = 30.0) -> None:
    """Wait until every process of the session (the daemon's Spark JVM and Python workers) is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            return
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def daemons(tmp_path):
    d = Daemons(tmp_path)
    yield d
    d.close()


def wait_until(cond: Callable[[], object], timeout: float, what: str, *, every: float = 0.05,
               proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"daemon exited ({proc.returncode}) while waiting for {what}\n{tail(log)}")
        time.sleep(every)
    pytest.fail(f"timed out after {timeout}s waiting for {what}\n{tail(log)}")


def checkpoints(settings, sid: str) -> dict[str, int]:
    store = Store(settings.db_url)
    try:
        return store.checkpoints(sid)
    finally:
        store.close()


def supervisor(settings, sid: str):
    store = Store(settings.db_url)
    try:
        return store.get(sid)
    finally:
        store.close()


def assert_consistent(spark, settings, sid: str, datasource: str, records, partitions: int) -> dict[str, int]:
    """Nothing half-published: the committed batches cover ``[0, checkpoint)`` of every partition
    back to back, and the committed rows are exactly the records below the checkpoints, once each."""
    cps = checkpoints(settings, sid)
    covered = collections.defaultdict(list)
    for b in helpers.batches(settings, sid):
        for p, start, end in b["ranges"]:
            covered[p].append((start, end))
    for p, cp in cps.items():
        reached = 0
        for start, end in sorted(covered[p]):
            assert start == reached, f"partition {p}: committed ranges {sorted(covered[p])} not back to back"
            reached = end
        assert reached == cp, f"partition {p}: committed ranges reach {reached}, checkpoint is {cp}"
    positions = helpers.kafka_positions(records, partitions)
    expected = [k for k, (p, o) in positions.items() if o < cps.get(p, 0)]
    helpers.assert_exactly_once(helpers.key_counts(spark, settings, datasource), expected)
    assert helpers.staging_leftovers(settings) == []
    return cps


def kafka_setup(kafka_broker, topic, tmp_path, *, partitions: int = 2, n: int = N, **spec):
    name = topic(partitions=partitions)
    records = devservices.make_records(n)
    ends = devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    assert sum(ends.values()) == n
    s = helpers.make_settings(tmp_path, tick_interval=1.0, debounce=0.1, lease_ttl=5.0)
    doc = helpers.spec_doc("clicks", helpers.kafka_source(kafka_broker.bootstrap, name), **spec)
    helpers.write_spec(s.specs, doc)
    return s, records, ends, doc


def max_gap(times: list[float], start: float, end: float) -> float:
    """The longest stretch in [start, end] without a time from ``times``."""
    points = [start] + sorted(t for t in times if start <= t <= end) + [end]
    return max(b - a for a, b in zip(points, points[1:], strict=False))


# --------------------------------------------------------------------------- unit: notify, logs


def test_notify_without_socket_is_a_noop(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify.notify("READY=1") is False
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert notify.watchdog_interval() is None


def test_notify_sends_one_datagram_per_call(monkeypatch):
    with NotifySocket() as sd:
        monkeypatch.setenv("NOTIFY_SOCKET", sd.path)
        assert notify.notify("READY=1", "STATUS=leader (token 1): 0 supervisor(s)") is True
        sd.wait_for("READY", "1", timeout=5)
        assert sd.messages[0][1] == {"READY": "1", "STATUS": "leader (token 1): 0 supervisor(s)"}


def test_notify_abstract_socket(monkeypatch):
    name = f"reconciler-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify.notify("WATCHDOG=1")
        assert sock.recv(100) == b"WATCHDOG=1"
    finally:
        sock.close()


def test_notify_to_a_dead_socket_does_not_raise(monkeypatch, tmp_path):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    assert notify.notify("READY=1") is False


@pytest.mark.parametrize(("usec", "pid", "expected"), [
    ("4000000", None, 2.0),
    ("4000000", "self", 2.0),
    ("4000000", "other", None),
    (None, None, None),
])
def test_watchdog_interval_is_half_of_watchdog_sec(monkeypatch, usec, pid, expected):
    for key, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", {"self": str(os.getpid()), "other": "1"}.get(pid))):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    assert notify.watchdog_interval() == expected


def _record(level: int, msg: str, exc: bool = False, **extra) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            exc_info = sys.exc_info()
    rec = logging.LogRecord("reconciler.test", level, __file__, 1, msg, (), exc_info)
    rec.__dict__.update(extra)
    return rec


def test_text_logs_one_line_per_event_with_journald_priorities(tmp_path):
    fmt = logs._TextFormatter(journald=True)
    lines = {lvl: fmt.format(_record(lvl, "two\nlines", exc=True, supervisor="clicks"))
             for lvl in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)}
    assert [line[:3] for line in lines.values()] == ["<7>", "<6>", "<4>", "<3>", "<2>"]
    for line in lines.values():
        assert "\n" not in line and "two | lines" in line and "ValueError: boom | second line" in line
        assert "[supervisor=clicks]" in line
    plain = logs._TextFormatter(journald=False).format(_record(logging.INFO, "hello"))
    assert not plain.startswith("<") and plain.endswith("reconciler.test: hello")


def test_json_logs_one_object_per_line():
    line = logs._JsonFormatter().format(_record(logging.WARNING, "lag\nalarm", exc=True, supervisor="clicks"))
    assert "\n" not in line
    event = json.loads(line)
    assert (event["level"], event["priority"], event["msg"], event["supervisor"]) == ("warning", 4, "lag\nalarm", "clicks")
    assert "ValueError: boom" in event["exc"]


def test_journal_prefix_only_when_stderr_is_the_journal_stream(tmp_path):
    with open(tmp_path / "stream", "w") as f:
        st = os.fstat(f.fileno())
        assert logs.stderr_is_journal(f, {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
        assert not logs.stderr_is_journal(f, {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"})
        assert not logs.stderr_is_journal(f, {})
    assert not logs.stderr_is_journal(io.StringIO(), {"JOURNAL_STREAM": "1:2"})


# --------------------------------------------------------------------------- reconciler run


def test_ready_watchdog_then_sigterm_finishes_the_batch_and_exits_0(kafka_broker, topic, spark, tmp_path, daemons):
    # The signal must meet a batch in flight: it comes as soon as the first batch (a cold JVM)
    # is seen, early in the second. 2,000-record batches of 8,000 records and a 0.3 s pause once
    # did; faster reads then finished every batch inside the pause (CI: "fencing 0").
    n = 600_000
    s, records, _ends, _doc = kafka_setup(kafka_broker, topic, tmp_path, n=n, max_batch_records=250_000)
    with NotifySocket() as sd:
        proc, log = daemons.start("daemon", daemon_env(s, NOTIFY_SOCKET=sd.path))
        t_ready = sd.wait_for("READY", "1", proc=proc, log=log)
        wait_until(lambda: helpers.batches(s, "clicks"), 180, "the first batch", proc=proc, log=log, every=0.01)
        t_term = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0, tail(log)
        t_stopping = sd.wait_for("STOPPING", "1", timeout=1)
    text = log.read_text()
    assert t_ready < t_term <= t_stopping
    pings = sd.times("WATCHDOG", "1")
    assert len([t for t in pings if t_ready <= t <= t_term]) >= 2
    assert max_gap(pings, t_ready, t_term) < 2.5, "the loop stopped pinging the watchdog"
    assert any(st.startswith("leader (token 1)") for st in sd.statuses()), sd.statuses()
    assert "SIGTERM: stopping after in-flight batches" in text
    # the batch in flight when SIGTERM came finished and published before the exit
    stopping_line = next(line for line in text.splitlines() if "stopping: finishing or fencing" in line)
    assert "fencing 1 in-flight batch(es)" in stopping_line, stopping_line
    assert "published" in text.split(stopping_line, 1)[1], tail(log)
    cps = assert_consistent(spark, s, "clicks", "clicks", records, 2)
    assert 0 < sum(cps.values()) < n, "everything was published before the signal: no batch was in flight"


def test_second_sigterm_exits_at_once_and_exactly_once_still_holds(kafka_broker, topic, spark, tmp_path, daemons):
    # Batches long enough that the second signal meets one in flight: the first batch (a cold
    # JVM) is seen, and the signals come at once, early in the second. 2,000-record batches once
    # were long enough, then 25,000 with a 0.3 s pause; each faster read finished the batch
    # before the second signal (CI: the graceful stop won, the signal met the interpreter's exit).
    s, records, ends, _doc = kafka_setup(kafka_broker, topic, tmp_path, n=600_000, max_batch_records=250_000)
    with NotifySocket() as sd:
        proc, log = daemons.start("daemon", daemon_env(s, NOTIFY_SOCKET=sd.path))
        sd.wait_for("READY", "1", proc=proc, log=log)
        wait_until(lambda: helpers.batches(s, "clicks"), 180, "the first batch", proc=proc, log=log, every=0.01)
        proc.send_signal(signal.SIGTERM)
        sd.wait_for("STOPPING", "1", timeout=10, proc=proc, log=log)
        t_second = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        exit_seconds = time.monotonic() - t_second
    assert rc == -signal.SIGTERM, f"exit {rc}\n{tail(log)}"  # re-raised: systemd counts it as a clean stop
    assert exit_seconds < 3.0
    assert "second SIGTERM: exiting now" in log.read_text()
    wait_group_gone(proc.pid)  # the JVM and Python workers are gone too
    # Whatever the cut-short batch left behind publishes nothing; the next start recovers.
    before = checkpoints(s, "clicks")
    assert sum(before.values()) < sum(ends.values()), "everything was published before the signals: nothing was cut short"
    code, _daemon = helpers.run_daemon(s, until_caught_up=True, timeout=240)
    assert code == 0
    cps = assert_consistent(spark, s, "clicks", "clicks", records, 2)
    assert cps == {str(p): e for p, e in ends.items()}


def test_watchdog_keeps_pinging_while_a_spark_batch_runs(kafka_broker, topic, spark, tmp_path, daemons):
    # One batch of everything in a fresh process on one Spark core: JVM start + a Python worker +
    # 2M records, several seconds. (8k, 100k and then 400k records on two cores once took over
    # 3 s; each faster batch no longer did: 1M took 3.6 s on two cores, 4.0 s on one.)
    s, records, ends, doc = kafka_setup(kafka_broker, topic, tmp_path, n=2_000_000, max_batch_records=2_000_000)
    with NotifySocket() as sd:
        env = daemon_env(s, NOTIFY_SOCKET=sd.path, WATCHDOG_USEC="2000000",  # WatchdogSec=2s: ping every 1s
                         RECONCILER_SPARK_MASTER="local[1]")
        proc, log = daemons.start("daemon", env)
        sd.wait_for("READY", "1", proc=proc, log=log)

        def batch_running():
            rec = supervisor(s, "clicks")
            return rec is not None and rec.detailed_state == "RUNNING" and not helpers.batches(s, "clicks")

        wait_until(batch_running, 120, "the first batch to start", proc=proc, log=log)
        t_start = time.monotonic()
        # A spec change while Spark works: the loop reconciles it without waiting for the batch.
        other = dict(doc, id="other", suspended=True)
        helpers.write_spec(s.specs, other)
        wait_until(lambda: supervisor(s, "other"), 10, "the new spec to be reconciled", proc=proc, log=log)
        t_created = time.monotonic()
        wait_until(lambda: helpers.batches(s, "clicks"), 240, "the batch to publish", proc=proc, log=log)
        t_commit = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0, tail(log)
    took = t_commit - t_start
    print(f"the batch took {took:.2f} s")
    assert took > 3.0, f"the batch took {took:.2f} s: too short to tell anything"
    assert t_created < t_commit, "the spec change waited for the Spark batch"
    pings = sd.times("WATCHDOG", "1")
    # One ping a second; a loop that waited on Spark would be silent for the whole batch. The
    # margin is for a loaded machine (2 cores shared with a JVM), not for waiting.
    assert len([t for t in pings if t_start <= t <= t_commit]) >= (t_commit - t_start) / 2
    assert max_gap(pings, t_start, t_commit) < 3.0, "WATCHDOG=1 stalled while the batch ran"
    assert_consistent(spark, s, "clicks", "clicks", records, 2)
    assert checkpoints(s, "clicks") == {str(p): e for p, e in ends.items()}


def _metric(port: int, name: str, labels: str = "") -> float | None:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in body.splitlines():
        if line.startswith(f"{name}{labels} ") or (not labels and line.startswith(f"{name} ")):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_sighup_rereads_the_config_and_swaps_settings(tmp_path, daemons):
    port = devservices.free_port()
    config = tmp_path / "config.yaml"

    def write_config(tick: str, level: str, fmt: str) -> None:
        config.write_text(f"specs: {tmp_path / 'specs'}\nstateDir: {tmp_path / 'state'}\n"
                          f"tickInterval: {tick}\nlogLevel: {level}\nlogFormat: {fmt}\n"
                          f"http: 127.0.0.1:{port}\nleaseTtl: 5s\n")

    (tmp_path / "specs").mkdir()
    write_config("60s", "INFO", "text")
    passes = lambda: _metric(port, "reconciler_reconcile_passes_total", '{outcome="unchanged"}') or 0  # noqa: E731
    with NotifySocket() as sd:
        proc, log = daemons.start("daemon", daemon_env(NOTIFY_SOCKET=sd.path), "--config", str(config), "run")
        t_ready = sd.wait_for("READY", "1", proc=proc, log=log)
        wait_until(passes, 10, "the first pass", proc=proc, log=log)
        time.sleep(2.0)
        assert passes() == 1  # tickInterval 60s: no second pass yet
        write_config("300ms", "DEBUG", "json")
        t_hup = time.monotonic()
        proc.send_signal(signal.SIGHUP)
        t_reloading = sd.wait_for("RELOADING", "1", after=t_hup, timeout=10, proc=proc, log=log)
        t_ready2 = sd.wait_for("READY", "1", after=t_reloading, timeout=10, proc=proc, log=log)
        reloading = next(f for t, f in sd.messages if t == t_reloading)
        assert int(reloading["MONOTONIC_USEC"]) > 0
        time.sleep(2.0)
        assert passes() >= 4  # the new tickInterval is in effect
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, tail(log)
        sd.wait_for("STOPPING", "1", timeout=1)
    assert t_ready < t_hup < t_reloading <= t_ready2
    lines = log.read_text().splitlines()
    first_json = next(i for i, line in enumerate(lines) if line.startswith("{"))
    before, after = lines[:first_json], [json.loads(line) for line in lines[first_json:]]  # one event a line
    assert all(" DEBUG " not in line for line in before)
    assert after[0]["msg"] == ("SIGHUP: settings reloaded: tickInterval 60.0 -> 0.3; "
                               "logFormat 'text' -> 'json'; logLevel 'INFO' -> 'DEBUG' "
                               "(db, segments, objectStore, catalog, stateDir, sparkMaster, spark, snapshotsKept, readerGrace need a restart)")
    debug = [e for e in after if e["level"] == "debug"]  # the new level is in effect too
    assert any(e["msg"].startswith("reconcile pass (tick): no changes") for e in debug)
    assert all(e["priority"] == 7 for e in debug)


def test_sighup_with_a_broken_config_keeps_the_old_settings(tmp_path, daemons):
    config = tmp_path / "config.yaml"
    (tmp_path / "specs").mkdir()
    config.write_text(f"specs: {tmp_path / 'specs'}\nstateDir: {tmp_path / 'state'}\nhttp: ''\ntickInterval: 60s\n")
    with NotifySocket() as sd:
        proc, log = daemons.start("daemon", daemon_env(NOTIFY_SOCKET=sd.path), "--config", str(config), "run")
        sd.wait_for("READY", "1", proc=proc, log=log)
        config.write_text("tickInterval: soon\n")
        t_hup = time.monotonic()
        proc.send_signal(signal.SIGHUP)
        t_reloading = sd.wait_for("RELOADING", "1", after=t_hup, timeout=10, proc=proc, log=log)
        sd.wait_for("READY", "1", after=t_reloading, timeout=10, proc=proc, log=log)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, tail(log)
    assert "SIGHUP: config not reloaded, keeping the old settings" in log.read_text()


@pytest.mark.integration  # waits out a real watchdog interval
def test_a_hung_pass_silences_the_watchdog(tmp_path, monkeypatch):
    """WATCHDOG=1 comes from the loop itself: while a pass hangs, systemd hears nothing
    (and WatchdogSec= would restart the daemon); once it returns, the pings resume."""
    from reconciler import daemon as daemon_mod
    from reconciler.daemon import tick as tick_mod

    hang, release = threading.Event(), threading.Event()
    entered: list[float] = []  # when a pass first hung (a pass already past the check still pings)
    real = tick_mod.reconcile_once

    def hanging(*args, **kwargs):
        if hang.is_set():
            if not entered:
                entered.append(time.monotonic())
            release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(tick_mod, "reconcile_once", hanging)
    s = helpers.make_settings(tmp_path, tick_interval=0.2)
    with NotifySocket() as sd:
        monkeypatch.setenv("NOTIFY_SOCKET", sd.path)
        d = daemon_mod.Daemon(s)
        thread = threading.Thread(target=d.run, daemon=True)
        thread.start()
        try:
            sd.wait_for("WATCHDOG", "1", timeout=30)
            hang.set()
            wait_until(lambda: entered, 30, "a pass to hang")
            time.sleep(3.0)
            release.set()
            t_release = time.monotonic()
            sd.wait_for("WATCHDOG", "1", after=t_release, timeout=10)
        finally:
            release.set()
            d.request_stop()
            thread.join(30)
    pings = sd.times("WATCHDOG", "1")
    # Silent while the pass hung (0.1 s for a datagram sent just before it to arrive).
    assert not [t for t in pings if entered[0] + 0.1 < t < t_release], "WATCHDOG=1 while the pass hung"

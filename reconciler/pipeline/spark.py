"""The Spark adapter: one SparkSession per process, and Spark's failures in the product's words.

Starting a session costs seconds (a JVM, then Python workers on first use), so the
daemon, the CLI and the test session each share one. ``get_session`` builds it on
first call and hands back the same object afterwards; asking for another master
while one is running is an error, not a silent second cluster.

A session can die under us: a standalone master that goes away (its context stops
after "All masters are unresponsive", and every later call says "Cannot call methods
on a stopped SparkContext"), a restarted Spark Connect server (the client's session
is gone with it). ``get_session`` notices a dead session and builds a new one, and
``translate_failure`` turns a batch's Spark error into ``SparkUnavailable`` (retryable,
naming the master) so the supervisor backs off and tries again. What retrying cannot
fix (a malformed master URL, a missing package for ``sc://``, a segments directory the
executors cannot see) is ``SparkMisconfigured``, raised again at once without retrying
Spark, its message naming the fix.

On a cluster the executors' Python must have this package installed (a batch's
tasks run there): on the same host ``PYSPARK_PYTHON`` (set to this
interpreter unless the operator set it) is enough; on other hosts ship a packed
virtualenv with ``spark.archives`` (docs/operations.md, "Running on a Spark cluster"). The
segments directory must be the same path for this process, the driver and every
executor: ``check_shared_dir`` (``sparkshared``) proves it once per session. What every
session is configured with is ``sparkconf``; the local workers' daemon is ``sparkworker``.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.errors import RetryableError, SparkMisconfigured
from reconciler.pipeline import arrowpool, sparkconf, sparkhome
from reconciler.pipeline.sparkconf import DEFAULT_MASTER, LOCAL_CONF, SQL_CONF, STATIC_CONF  # noqa: F401  (callers' names)
from reconciler.pipeline.sparkshared import check_shared_dir
from reconciler.sparkurls import CONNECT_PORT, check_conf, check_master  # noqa: F401  (checked at load; here for callers)
from reconciler.sparkurls import endpoints as _endpoints

if TYPE_CHECKING:  # pyspark costs a second to import: status and settings do not need it
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

MASTER_LOST_AFTER = 15.0  # seconds a standalone master may be unreachable before the running jobs are given up
WATCH_EVERY = 2.0

_lock = threading.Lock()
_session: SparkSession | None = None
_master: str | None = None
_lost: str | None = None  # why the current session is no longer usable (set by the watchdog or a failure)
_refused: tuple[tuple, SparkMisconfigured] | None = None  # the last permanent refusal, per (master, conf)
_status_file: Path | None = None
_write_lock = threading.Lock()
_info: dict[str, Any] = {"master": None, "appId": None, "state": "not started", "reason": None, "since": None}

# What a job's error says when the cluster, not the job, is the problem.
_GONE = (
    "Cannot call methods on a stopped SparkContext",
    "SparkContext was shut down",
    "SparkContext has been shutdown",
    "All masters are unresponsive",
    "Master removed our application",
    "Answer from Java side is empty",
    "Error while sending or receiving",  # py4j: the driver JVM died
    "StatusCode.UNAVAILABLE",
    "failed to connect to all addresses",
    "INVALID_HANDLE",  # a restarted Connect server no longer knows our session
    "SESSION_CHANGED",
    "NO_SUCH_SESSION",
)


class SparkUnavailable(RetryableError):
    """The Spark cluster (master, Connect server, driver) is gone for now; the session is rebuilt."""


# --------------------------------------------------------------------------- settings


def _is_remote(master: str) -> bool:
    return master.startswith("sc://")


def _cores(master: str) -> int:
    m = re.fullmatch(r"local\[(\d+)(?:,\d+)?\]", master)
    if m:
        return max(1, int(m[1]))
    if master == "local":
        return 1
    return os.cpu_count() or 2


def _require_connect_packages(master: str) -> None:
    try:
        from pyspark.sql.connect.utils import check_dependencies

        check_dependencies()
    except ImportError as exc:  # PySparkImportError: "[PACKAGE_NOT_INSTALLED] grpcio >= 1.48.1 ..."
        raise SparkMisconfigured(
            f"Spark Connect ({master}) needs the packages of pyspark[connect], which are missing here: {exc}. "
            f"Fix: reinstall stream-reconciler in this virtualenv (`{sys.executable} -m pip install "
            "stream-reconciler`, they are its dependencies) or `pip install 'pyspark[connect]'`") from None


# --------------------------------------------------------------------------- reachability


def _reachable(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def unreachable_reason(master: str) -> str | None:
    """Why nothing answers at a cluster master's address, or None (also for local masters)."""
    if not master.startswith(("spark://", "sc://")):
        return None
    if any(_reachable(h, p) for h, p in _endpoints(master) if p is not None):
        return None
    if _is_remote(master):
        return f"Spark Connect server {master} unreachable (nothing answers at {_where(master)})"
    return f"Spark master {master} unreachable (nothing answers at {_where(master)})"


def _where(master: str) -> str:
    return ", ".join(f"{h}:{p}" for h, p in _endpoints(master))


# --------------------------------------------------------------------------- the session


def get_session(
    master: str = DEFAULT_MASTER,
    app_name: str = "stream-reconciler",
    conf: Mapping[str, Any] | None = None,
    *,
    shared_dir: str | os.PathLike[str] | None = None,
) -> SparkSession:
    """The process's SparkSession (built on first call).

    ``master`` is ``local[N]``/``local[*]``, ``spark://host:port`` (standalone, YARN-style
    URLs work the same way) or a Spark Connect URL ``sc://host:port``. ``conf`` (the
    operator's ``spark:`` settings) adds or overrides settings when a session is built.
    ``shared_dir`` (the segments directory), on a cluster, is checked once per session
    to be visible from every executor. Raises ``SparkUnavailable`` while the cluster
    cannot be reached and ``SparkMisconfigured`` when it never will be.
    """
    global _session, _master, _lost, _refused
    conf = dict(conf or {})
    with _lock:
        if _session is not None:
            if master != _master:
                raise RuntimeError(
                    f"a SparkSession for {_master!r} is already running in this process; "
                    f"cannot start another for {master!r} (call stop_session() first)"
                )
            gone = _lost or _dead(_session, master)
            if gone is None:
                return _session
            _drop(gone)
        key = (master, tuple(sorted(conf.items())), str(shared_dir or ""))
        if _refused is not None and _refused[0] == key:
            raise _refused[1]
        try:
            session = _build(master, app_name, conf, shared_dir)
        except SparkMisconfigured as exc:
            _refused = (key, exc)
            _record(master, None, "misconfigured", str(exc))
            log.error("%s", exc)
            raise
        except SparkUnavailable as exc:
            _record(master, None, "down", str(exc))
            raise
        _session, _master, _lost = session, master, None
        _record(master, _app_id(session, master), "up", None)
        log.info("Spark session up: master %s, application %s", master, _info["appId"])
        if master.startswith("spark://"):
            _watch(session, master)
        return session


def _build(master: str, app_name: str, conf: dict[str, Any], shared_dir) -> SparkSession:
    check_master(master)
    check_conf(conf)
    if _is_remote(master):
        _require_connect_packages(master)
    reason = unreachable_reason(master)
    if reason:
        raise SparkUnavailable(reason)
    settings: dict[str, str] = dict(SQL_CONF)
    settings["spark.sql.shuffle.partitions"] = str(2 * _cores(master))
    try:
        session = _remote(master, app_name, settings, conf) if _is_remote(master) else \
            _classic(master, app_name, settings, conf)
    except (SparkMisconfigured, SparkUnavailable):
        raise
    except Exception as exc:  # the JVM's or gRPC's words: say which cluster, keep the detail
        gone = failure_reason(exc, master)
        if gone:
            raise SparkUnavailable(gone) from exc
        raise
    try:
        if shared_dir is not None and not master.startswith("local"):
            check_shared_dir(session, shared_dir)
    except BaseException:
        _stop_quietly(session)
        raise
    return session


def _classic(master: str, app_name: str, settings: dict[str, str], conf: dict[str, Any]) -> SparkSession:
    from pyspark.sql import SparkSession

    # Python workers must run this interpreter, else they miss the virtualenv's
    # packages ("Python worker exited unexpectedly"). Locally always; on a cluster an
    # operator's explicit setting (PYSPARK_PYTHON, spark.pyspark.python) wins.
    if master.startswith("local"):
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # stay on loopback, no hostname guess
        sparkhome.use_private_home()  # every Python worker imports pyspark from its bytecode
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        # executors do not inherit the daemon's environment; the operator's spark conf wins
        settings[f"spark.executorEnv.{arrowpool.ENV}"] = arrowpool.preferred()
    settings.update(sparkconf.STATIC_CONF)
    if master.startswith("local"):
        settings.update(LOCAL_CONF)
        settings.update(sparkconf.local_socket_conf())
        archive = sparkconf.java_options() if sparkconf.ARCHIVE_OPTIONS_ENABLED else None
        if archive:  # Spark's classes pre-parsed: the JVM starts in ~4 s instead of ~6.5 s
            settings["spark.driver.defaultJavaOptions"] = f"{settings['spark.driver.defaultJavaOptions']} {archive}"
    settings.update({k: str(v) for k, v in conf.items()})
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in settings.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    _quiet_parquet(session)
    # getOrCreate may hand back a session someone else built: make sure the SQL
    # settings hold regardless.
    for k in SQL_CONF:
        session.conf.set(k, settings[k])
    return session


def _remote(master: str, app_name: str, settings: dict[str, str], conf: dict[str, Any]) -> SparkSession:
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    session = SparkSession.builder.remote(master).appName(app_name).getOrCreate()
    # The client's default retries wait up to 10 minutes for a server that went away; a
    # few seconds, then the supervisor's own backoff, keeps status honest meanwhile.
    session.client.set_retry_policies([DefaultPolicy(max_retries=5, max_backoff=4000)])
    settings.update({k: str(v) for k, v in conf.items()})
    for k, v in settings.items():
        try:
            session.conf.set(k, v)
        except Exception as exc:
            if k in conf and "CANNOT_MODIFY" in str(exc):
                _stop_quietly(session)
                raise SparkMisconfigured(
                    f"Spark setting {k} cannot be set by a Spark Connect client: set it where the Connect "
                    f"server starts (spark-submit --conf {k}=...), and remove it from the spark: settings"
                ) from None
            raise
    return session


def _dead(session: SparkSession, master: str) -> str | None:
    """Why a built session can no longer run jobs, or None while it can."""
    try:
        if _is_remote(master):
            stopped = session.is_stopped
        else:
            jsc = session.sparkContext._jsc
            stopped = jsc is None or jsc.sc().isStopped()
    except Exception as exc:  # the driver JVM itself is gone
        return f"the Spark driver stopped ({type(exc).__name__}) with master {master}"
    if stopped:
        return unreachable_reason(master) or f"the Spark session with master {master} was stopped"
    return unreachable_reason(master)


def _drop(reason: str) -> None:
    """Forget a dead session (stopping what is left of it) so the next call builds anew."""
    global _session, _master, _lost
    log.warning("Spark session lost: %s; building a new one", reason)
    session, master = _session, _master
    _session, _master, _lost = None, None, None
    _record(master, None, "down", reason)
    if session is not None:
        _stop_quietly(session)


def _stop_quietly(session: SparkSession) -> None:
    try:
        session.stop()
    except Exception:  # a session whose cluster is gone cannot say goodbye to it
        log.debug("stopping a dead Spark session failed", exc_info=True)


def _app_id(session: SparkSession, master: str) -> str | None:
    try:
        if not _is_remote(master):
            return session.sparkContext.applicationId
        return session.conf.get("spark.app.id")
    except Exception:  # a Connect session cannot always read the server's settings
        return None


def current_session() -> SparkSession | None:
    """The running session, if ``get_session`` built one."""
    return _session


def stop_session() -> None:
    """Stop the process's session (no-op if none); the next ``get_session`` builds anew."""
    global _session, _master, _lost, _refused
    with _lock:
        if _session is not None:
            try:
                _session.stop()
            finally:
                _record(_master, None, "stopped", None)
                _session, _master, _lost = None, None, None
        _refused = None


def _quiet_parquet(session: SparkSession) -> None:
    """Parquet's MemoryManager warns (and prints a line of its own) whenever writers share
    memory: expected here, and noise in a log of one event per line."""
    try:
        jvm = session.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.Level.ERROR
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel("org.apache.parquet", level)
    except Exception:  # a JVM without log4j 2: keep the noise rather than fail the session
        pass


# --------------------------------------------------------------------------- failures


def failure_reason(exc: BaseException, master: str | None = None) -> str | None:
    """The product's words for an error that means the cluster is gone, else None."""
    master = master or _master or str(_info.get("master") or "")
    text = f"{type(exc).__name__}: {exc}"
    hit = next((marker for marker in _GONE if marker in text), None)
    if hit is None and type(exc).__name__ not in ("Py4JNetworkError", "ConnectionRefusedError"):
        return None
    detail = hit or type(exc).__name__
    if master.startswith("sc://"):
        return f"Spark Connect server {master} unreachable or restarted ({detail})"
    if master.startswith("spark://"):
        return f"Spark master {master} unreachable ({detail})"
    return f"the Spark driver for {master or 'this process'} stopped ({detail})"


def translate_failure(exc: BaseException) -> BaseException:
    """What a supervisor should see for a batch that failed with ``exc``.

    A lost cluster becomes ``SparkUnavailable`` (and the session is rebuilt on the next
    ``get_session``); any other error is handed back unchanged (a failed job, a bug)."""
    global _lost
    if isinstance(exc, (SparkUnavailable, SparkMisconfigured)):
        return exc
    reason = _lost or failure_reason(exc)
    if reason is None:
        return exc
    with _lock:
        if _session is not None:
            _lost = reason
    return SparkUnavailable(reason)


def _watch(session: SparkSession, master: str) -> None:
    """Give up a standalone session's jobs once its master has been gone a while.

    Executors may outlive their master, but an application the master forgot can never
    get an executor again, so its next job would wait for resources forever."""

    def run() -> None:
        global _lost
        down_since = None
        while _session is session and _lost is None:
            time.sleep(WATCH_EVERY)
            reason = unreachable_reason(master)
            if reason is None:
                down_since = None
                continue
            down_since = down_since or time.monotonic()
            if time.monotonic() - down_since >= MASTER_LOST_AFTER and _session is session:
                _lost = reason
                _record(master, _info.get("appId"), "down", reason)
                log.warning("%s for %.0fs: cancelling running Spark jobs", reason, MASTER_LOST_AFTER)
                try:
                    session.sparkContext.cancelAllJobs()
                except Exception:  # a context already stopped has no job to cancel
                    log.debug("cancelAllJobs failed", exc_info=True)

    threading.Thread(target=run, name="spark-master-watch", daemon=True).start()


# --------------------------------------------------------------------------- status


def session_info() -> dict[str, Any]:
    """Which master and application this process uses, and whether it is up (for /healthz)."""
    return dict(_info)


def set_status_file(path: str | os.PathLike[str] | None) -> None:
    """Where the daemon keeps ``session_info`` for ``reconciler status`` (the state directory).

    Nothing is written until this process has a session to tell of: a standby daemon, or one
    not yet leading, sharing the state directory once replaced the leader's "up" with its own
    "not started", and ``status`` said so while ``/healthz`` said up."""
    global _status_file
    if _status_file is None and path:
        atexit.register(_exited)
    _status_file = Path(path) if path else None
    if _info["state"] != "not started":
        _write_status()


def _exited() -> None:
    """The process ends: its application with it (``status`` must not show a dead daemon's as up)."""
    if _info["state"] == "up":
        _record(_info["master"], _info["appId"], "stopped", "the daemon exited")


def read_status_file(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _record(master: str | None, app_id: str | None, state: str, reason: str | None) -> None:
    _info.update(master=master, appId=app_id, state=state, reason=reason,
                 since=datetime.now(UTC).isoformat(timespec="seconds"))
    _write_status()


def _write_status() -> None:
    """``host`` and ``pid`` tell ``status`` which daemon wrote it (a daemon's lease holder is
    host:pid:nonce). Serialised: the watchdog thread and a batch's thread may both record, and
    two writers of one temporary file could leave the older state in place."""
    if _status_file is None:
        return
    with _write_lock:
        try:
            tmp = _status_file.with_name(f".{_status_file.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({**_info, "pid": os.getpid(), "host": socket.gethostname()}), encoding="utf-8")
            os.replace(tmp, _status_file)
        except OSError:  # status is a convenience: an unwritable state dir is reported elsewhere
            log.debug("cannot write %s", _status_file, exc_info=True)

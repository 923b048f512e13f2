"""The common lifecycle of a test service, and the helpers the launchers share.

A ``Service`` starts one child process in its own process group, in a private temporary
directory (``rct-<name>-*`` under ``RECONCILER_SERVICE_TMP`` or the system temp dir),
and stops it graceful first, then terminate, then kill. Services still running when the
interpreter exits are stopped by an ``atexit`` hook registered when the first service
starts (importing this package registers nothing). A missing binary raises
``ServiceBinaryMissing`` naming the setup command; a service that does not become ready
raises ``ServiceStartError`` with the tail of its log.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SETUP_COMMAND = "scripts/setup.sh"
SETUP_TEST_SERVICES_COMMAND = "scripts/setup.sh --with-test-services"


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


def tcp_open(host: str, port: int, timeout: float = 0.5) -> bool:
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


_live: set[Service] = set()
_live_lock = threading.Lock()


_atexit_registered = False


def _stop_all_live() -> None:
    with _live_lock:
        services = list(_live)
    for svc in services:
        with contextlib.suppress(Exception):
            svc.stop()


class Service:
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
        global _atexit_registered
        with _live_lock:
            _live.add(self)
            if not _atexit_registered:
                atexit.register(_stop_all_live)
                _atexit_registered = True
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

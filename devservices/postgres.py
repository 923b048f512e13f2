"""A throwaway PostgreSQL cluster (``initdb`` + ``pg_ctl``), run as ``nobody`` when the
caller is root (initdb refuses root)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devservices.service import (
    SETUP_TEST_SERVICES_COMMAND,
    Service,
    ServiceBinaryMissing,
    ServiceStartError,
    _tail,
    free_port,
)


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


class PostgresCluster(Service):
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

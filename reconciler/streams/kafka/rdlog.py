"""librdkafka's log lines as the product wants them: a broker that cannot be reached is DEBUG.

librdkafka logs each failed connection attempt (facility ``FAIL``, ``Connection refused``)
at ERROR, once per client per retry. The product already says it in its own words: the
runtime's one WARNING per supervisor per outage, a command's ``Error: ... cannot reach
Kafka``. So those lines go to DEBUG (``--log-level DEBUG`` still shows them, and the
filter's ``held`` counts them); anything else librdkafka says, an SSL handshake or a SASL
failure among it, keeps its level.
"""

from __future__ import annotations

import logging
import re
import threading

# the OS's and the resolver's words for "nobody answered", as librdkafka quotes them
_UNREACHABLE = re.compile(
    r"Connection refused|Connection timed out|Connection reset by peer|No route to host|Network is unreachable"
    r"|Failed to resolve|Disconnected \(after|Disconnected while requesting|brokers are down"
)


def _unreachable(record: logging.LogRecord) -> bool:
    args = record.args
    if not (isinstance(args, tuple) and len(args) == 3 and args[0] == "FAIL"):
        return False  # confluent-kafka logs ("%s [%s] %s", facility, client, message)
    return bool(_UNREACHABLE.search(str(args[2])))


class BrokerDownAsDebug(logging.Filter):
    """A logger filter: an unreachable broker's ``FAIL`` lines become DEBUG records."""

    def __init__(self) -> None:
        super().__init__()
        self.held = 0
        self._lock = threading.Lock()  # librdkafka logs from its own threads

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG or not _unreachable(record):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        with self._lock:
            self.held += 1
        # the level was checked before this filter ran: check it again for the new level
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def install(logger: logging.Logger) -> BrokerDownAsDebug:
    """The logger's filter (added once; its ``held`` counts the lines it turned into DEBUG)."""
    for f in logger.filters:
        if isinstance(f, BrokerDownAsDebug):
            return f
    f = BrokerDownAsDebug()
    logger.addFilter(f)
    return f

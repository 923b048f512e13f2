"""Logging to stderr, one event per line, as text or JSON, at levels journald understands.

Under systemd (``JOURNAL_STREAM`` set) text lines carry a ``<N>`` syslog priority
prefix so journald files each line at its level.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        event = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in ("supervisor", "batch", "action"):
            if hasattr(record, key):
                event[key] = getattr(record, key)
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        return json.dumps(event, default=str)


class _TextFormatter(logging.Formatter):
    def __init__(self, journald: bool):
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record).replace("\n", " | ")
        return f"<{_PRIORITY.get(record.levelno, 6)}>{line}" if self.journald else line


def setup(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _TextFormatter(bool(os.environ.get("JOURNAL_STREAM"))))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("py4j", "alembic", "urllib3", "watchdog", "rstream"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

"""Logging to stderr, one event per line, as text or JSON, at levels journald understands.

Text lines look like ``2026-11-21 13:07:41,972 INFO    reconciler.runtime.supervisor:
batch 1d53 published: 5000 records ... [supervisor=clicks batch=1d53...]``: the
structured fields a record carries (supervisor, batch, action) are appended, and a
multi-line message or traceback is folded onto its line with `` | ``.

Text a person or a broker supplied can hold control characters: the text format escapes
them (``printable``; a newline inside a message is folded to `` | ``), so no value forges a
line or sends a terminal escape; the JSON format keeps every value exact.

When stderr is connected to the journal (``JOURNAL_STREAM`` names stderr's device
and inode, as systemd sets it for ``StandardError=journal``), every line starts with
a ``<N>`` syslog priority (``<3>`` error, ``<4>`` warning, ``<6>`` info, ``<7>``
debug), so journald files each line at its level (``journalctl -p warning``). The
JSON format carries the same number as ``priority``.

Every record, the client libraries' own included (librdkafka's logger is routed here),
passes ``secrets.scrub`` before it is written: a library that echoes a secret it was
given must not put it in the journal.

The client libraries (librdkafka, rstream, py4j) repeat themselves while a broker is
down: every consumer, every reconnect, a line. Their records are collapsed: a message
(numbers ignored) is written once per ``REPEAT_WINDOW`` seconds, and the next time it is
written it says how many copies were held back; a new message (the broker's state
changed) is written at once.

A command (everything but the daemon) says a broker's failure once, in its own ``Error:``
or table: ``quiet_clients`` holds back the client libraries' lines for the whole command,
unless ``--log-level DEBUG`` asks for them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime

from reconciler.errors import printable
from reconciler.spec import secrets

FIELDS = ("supervisor", "batch", "action")
LIBRARY_LOGGERS = ("reconciler.streams.kafka.librdkafka", "rstream", "py4j", "pika")
REPEAT_WINDOW = 60.0  # seconds a repeated library message stays quiet
_NUMBERS = re.compile(r"\d+")
CLIENT_LOGGERS = ("reconciler.streams.kafka.librdkafka", "rstream", "pika")  # the brokers' clients
__all__ = ["printable", "printable_lines", "setup", "quiet_clients", "priority", "stderr_is_journal"]


def printable_lines(text: object) -> list[str]:
    """Multi-line text of our own making (one problem a line), each line made ``printable``."""
    return [printable(line) for line in str(text or "").split("\n")]


def priority(levelno: int) -> int:
    """The syslog priority of a logging level (journald's ``PRIORITY``)."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


class _CollapseRepeats(logging.Filter):
    """Writes each distinct library message once per window, then once more with a count."""

    MAX_KEYS = 512

    def __init__(self, window: float = REPEAT_WINDOW) -> None:
        super().__init__()
        self.window = window
        self._seen: OrderedDict[tuple[str, int, str], list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(LIBRARY_LOGGERS):
            return True
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: let the handler report it as logging does
            return True
        key = (record.name, record.levelno, _NUMBERS.sub("#", message))
        now = time.monotonic()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.window:
                seen[1] += 1
                return False
            held = int(seen[1]) if seen is not None else 0
            self._seen[key] = [now, 0]
            self._seen.move_to_end(key)
            while len(self._seen) > self.MAX_KEYS:
                self._seen.popitem(last=False)
        if held:
            record.msg, record.args = f"{message} (and {held} more like it in the last {self.window:.0f}s)", None
        return True


class _ScrubSecrets(logging.Filter):
    """Hides every known secret (and any long fragment of one) in the message and traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: let the handler report it as logging does
            return True
        clean = secrets.scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = secrets.scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = secrets.scrub(record.stack_info)
        return True


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        event = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "priority": priority(record.levelno),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in FIELDS:
            if hasattr(record, key):
                event[key] = getattr(record, key)
        if record.exc_info or record.exc_text:
            event["exc"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(event, default=str)


class _TextFormatter(logging.Formatter):
    def __init__(self, journald: bool):
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        if record.args:  # the values (a reason, a broker's error) are escaped whole; the message's own lines fold
            record = logging.makeLogRecord({**record.__dict__, "msg": _escaped_message(record), "args": None})
        line = super().format(record)
        extra = " ".join(f"{k}={getattr(record, k)}" for k in FIELDS if getattr(record, k, None) is not None)
        if extra:
            line = f"{line} [{extra}]"
        line = " | ".join(printable(part) for part in line.replace("\r", "").split("\n"))
        return f"<{priority(record.levelno)}>{line}" if self.journald else line


def _escaped_message(record: logging.LogRecord) -> str:
    def esc(value):
        return printable(value) if isinstance(value, str | BaseException) else value

    try:
        args = record.args
        if isinstance(args, dict):
            return str(record.msg) % {k: esc(v) for k, v in args.items()}
        return str(record.msg) % tuple(esc(a) for a in args)
    except Exception:  # a bad format string: as logging itself would show it
        return record.getMessage()


def stderr_is_journal(stream=None, env=None) -> bool:
    """True when ``stream`` (stderr) is the journal stream systemd announced in ``JOURNAL_STREAM``.

    Checking device and inode (not only that the variable is set) keeps the prefix out
    of a child process's output that inherited the variable but writes elsewhere.
    """
    value = (os.environ if env is None else env).get("JOURNAL_STREAM", "")
    dev, _, ino = value.partition(":")
    if not dev or not ino:
        return False
    try:
        st = os.fstat((stream or sys.stderr).fileno())
        return st.st_dev == int(dev) and st.st_ino == int(ino)
    except (OSError, ValueError, AttributeError):
        return False


def setup(level: str = "INFO", fmt: str = "text") -> None:
    """Route every logger to one stderr handler (replacing earlier ones: SIGHUP calls this again)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _TextFormatter(stderr_is_journal()))
    handler.addFilter(_CollapseRepeats())
    handler.addFilter(_ScrubSecrets())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("py4j", "alembic", "urllib3", "watchdog", "rstream"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def quiet_clients(level: str = "INFO") -> Callable[[], None]:
    """A command's logging: the brokers' clients are silent (the command reports what they
    failed at), unless ``level`` is DEBUG. Returns what puts their levels back (a command run
    in-process, as a test does, must not silence the daemon that runs after it)."""
    loggers = [] if level.upper() == "DEBUG" else [logging.getLogger(name) for name in CLIENT_LOGGERS]
    before = [(log, log.level) for log in loggers]
    for log in loggers:
        log.setLevel(logging.CRITICAL)

    def restore() -> None:
        for log, was in before:
            log.setLevel(was)

    return restore

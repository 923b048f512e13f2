"""The few exception types the product raises, named for what the caller does.

* ``RetryableError``: try again later (broker unreachable, database busy, lease lost).
* ``PermanentError``: retrying will not help until a person changes something.
* ``SpecInvalid``: a spec or marker file is wrong; carries path, line, column and field.
* ``PublishConflict``: a compare-and-swap publish lost (checkpoint or epoch moved); the
  batch's output is discarded, which is the exactly-once mechanism working, not a fault.

Adapters translate library exceptions into these at the boundary so the rest of the
code never catches ``confluent_kafka.KafkaException`` or ``sqlalchemy.exc.*``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# C0, DEL, C1 (ESC's 8-bit twin CSI among them), the line and paragraph separators and the
# bidirectional overrides: what can forge a line, drive a terminal or reorder what is read.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    ch = m.group(0)
    if ch in _NAMED:
        return _NAMED[ch]
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def printable(value: object) -> str:
    """``value`` as one line of text a terminal shows as it is: every control character
    escaped (a newline too); None is empty. For text meant for people: JSON stays exact."""
    if value is None:
        return ""
    return _UNPRINTABLE.sub(_escape, str(value))


class ReconcilerError(Exception):
    """Base class of every error the product raises on purpose."""


class RetryableError(ReconcilerError):
    """A transient failure: the same operation may succeed after a delay (callers back off
    on their own schedule)."""


class CommitOutcomeUnknown(RetryableError):
    """The database connection failed while a transaction was committing: it may or may
    not have committed. Never guess: a write of files is fenced before any is deleted."""


class StaleRequest(RetryableError):
    """A request decided on a state that has moved since (a lag policy's reset, planned on an
    observation from before another reset): not applied, and not handled, so the next pass
    decides again on what is true then."""


class PermanentError(ReconcilerError):
    """A failure that needs a person: bad configuration, missing topic, bad request."""


class PublishConflict(ReconcilerError):
    """A publish lost its compare-and-swap: someone else moved the checkpoint or epoch."""


@dataclass(frozen=True)
class SpecProblem:
    """One problem in one file: where it is and what is wrong."""

    path: str
    line: int | None
    column: int | None
    field: str
    message: str

    def __str__(self) -> str:
        """``file:line:column: field: message`` on one line, whatever the file's name or the
        message quotes (``SpecInvalid`` joins problems with line breaks; text output splits on them)."""
        where = printable(self.path)
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        field = f" {printable(self.field)}:" if self.field else ""
        return f"{where}:{field} {printable(self.message)}"


class SpecInvalid(PermanentError):
    """A spec or marker file does not parse or validate; lists every problem found."""

    def __init__(self, problems: list[SpecProblem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    @property
    def first(self) -> SpecProblem:
        return self.problems[0]


class Misconfigured(PermanentError):
    """A setting cannot work as given (the message names the setting and the fix): the
    command line says so in one line and exits 2."""


class SparkMisconfigured(Misconfigured):
    """Spark cannot work with these settings until a person changes them (the message says how)."""

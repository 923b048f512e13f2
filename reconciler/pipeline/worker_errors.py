"""The product's own message out of an error Spark wraps around a Python worker's exception.

A reader in a Spark Python worker raises ``PermanentError("offsets [500, 8500) of stream
'x' are no longer available ...")``; the driver receives a ``PythonException`` whose text
is "An exception was thrown from the Python worker. Please see the stack trace below.
Traceback (most recent call last): File ...". ``status`` should show the first, and the log
keep the second. ``product_message`` finds the last ``module.Class: message`` line of the
worker's traceback, and says whether it was one of ours (retryable or not).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WRAPPED = "exception was thrown from the Python worker"
# The last line of a Python traceback: "reconciler.errors.PermanentError: offsets [...] ..."
_FINAL = re.compile(r"^(?P<cls>[A-Za-z_][\w.]*(?:Error|Exception|Conflict|Invalid|Unavailable)): (?P<msg>.+)$")
_OURS = {
    "reconciler.errors.RetryableError": "retryable",
    # a schema registry that does not answer: the batch waits, its records are no dead letters
    "reconciler.pipeline.formats.registry.RegistryUnavailable": "unavailable",
    "reconciler.pipeline.formats.FormatUnavailable": "unavailable",
    "reconciler.errors.PermanentError": "permanent",
    "reconciler.errors.SpecInvalid": "permanent",
    "reconciler.errors.PublishConflict": "conflict",
}


@dataclass(frozen=True)
class WorkerError:
    message: str  # what the worker's code said, without Spark's wrapper
    kind: str  # retryable | unavailable (a format's registry) | permanent | conflict | other (a bug, a library's)


def product_message(exc: BaseException) -> WorkerError | None:
    """The worker's own error inside ``exc``, or None when ``exc`` is not a wrapped worker error."""
    text = str(exc)
    if _WRAPPED not in text and "Traceback (most recent call last)" not in text:
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        m = _FINAL.match(lines[i])
        if m:
            # a message may run over several lines: keep the ones after it that are not Spark's
            tail = [ln for ln in lines[i + 1:] if not ln.startswith(("at ", "JVM stacktrace", "org.apache"))]
            message = " ".join([m["msg"], *tail]).strip()
            return WorkerError(message, _OURS.get(m["cls"], "other"))
    return None

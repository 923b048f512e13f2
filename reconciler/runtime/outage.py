"""One supervisor's failures as its log says them: once per outage, not once per retry.

A broker that is down for an hour fails every step of every supervisor reading it; the
log says it when it starts (a WARNING naming the supervisor), again only when the problem
changes, and once more, at INFO, when a step works again. The retries in between are DEBUG:
``status`` and the page hold the count and the last error.
"""

from __future__ import annotations

import logging
import re

_NUMBERS = re.compile(r"\d+")


class Outage:
    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.last: str | None = None  # the failure said last, until a step works again
        self.attempts = 0  # failed in this outage: the runtime's own count restarts with a new spec
        self.new_spec = False  # a spec or epoch changed since the last failure: its first failure is said

    def failed(self, supervisor_id: str, message: str, failures: int, delay: float) -> None:
        # numbers are masked so a retry's changed timings are not "a new problem"; a new spec is,
        # though its error may differ only in digits (another broker address that is down too)
        same = (not self.new_spec and self.last is not None
                and _NUMBERS.sub("#", message) == _NUMBERS.sub("#", self.last))
        self.log.log(logging.DEBUG if same else logging.WARNING, "%s (failure %d, retry in %.1fs)", message,
                     failures, delay, extra={"supervisor": supervisor_id})
        self.last, self.new_spec = message, False
        self.attempts += 1

    def reconsidered(self) -> None:
        """The spec or the epoch changed (``SupervisorRuntime.reconsider``)."""
        self.new_spec = True

    def ended(self, supervisor_id: str, failures: int) -> None:
        if self.last is not None:
            self.log.info("working again after %d failed attempts (the last: %s)", self.attempts, self.last,
                          extra={"supervisor": supervisor_id})
        self.last, self.attempts, self.new_spec = None, 0, False

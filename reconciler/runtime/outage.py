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

    def failed(self, supervisor_id: str, message: str, failures: int, delay: float) -> None:
        same = self.last is not None and _NUMBERS.sub("#", message) == _NUMBERS.sub("#", self.last)
        self.log.log(logging.DEBUG if same else logging.WARNING, "%s (failure %d, retry in %.1fs)", message,
                     failures, delay, extra={"supervisor": supervisor_id})
        self.last = message

    def ended(self, supervisor_id: str, failures: int) -> None:
        if self.last is not None:
            self.log.info("working again after %d failed attempts (the last: %s)", failures, self.last,
                          extra={"supervisor": supervisor_id})
        self.last = None

"""Named crash points for fault-injection tests.

``RECONCILER_CRASH_AT=before-commit`` (or a comma-separated list) makes the process
kill itself with SIGKILL when it reaches that point, the way a power cut would.
``RECONCILER_CRASH_AFTER=N`` lets the first N hits pass; ``RECONCILER_CRASH_SUPERVISOR=ID``
limits the points to supervisors whose id starts with ID (e.g. ``clicks-backfill``). Unset in production: the
check is one dictionary lookup.

Points: after-write (files staged, nothing committed), before-commit, after-commit
(committed, files not yet moved into place), inside-reset (reset transaction open),
after-reset (committed, marker not yet renamed), after-breach (a lag policy's breach
recorded, its reset not yet planned).
"""

from __future__ import annotations

import os
import signal

_hits: dict[str, int] = {}


def crash_point(name: str, supervisor: str | None = None) -> None:
    wanted = os.environ.get("RECONCILER_CRASH_AT")
    if not wanted or name not in wanted.split(","):
        return
    only = os.environ.get("RECONCILER_CRASH_SUPERVISOR")
    if only and not (supervisor or "").startswith(only):
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] > int(os.environ.get("RECONCILER_CRASH_AFTER", "0")):
        os.kill(os.getpid(), signal.SIGKILL)

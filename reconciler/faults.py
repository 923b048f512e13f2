"""Named points for fault injection: crash points for the fault suite, and a hook for
the schedule explorer (``tests/explorer``).

``RECONCILER_CRASH_AT=before-commit`` (or a comma-separated list) makes the process
kill itself with SIGKILL when it reaches that point, the way a power cut would.
``RECONCILER_CRASH_AFTER=N`` lets the first N hits pass; ``RECONCILER_CRASH_SUPERVISOR=ID``
limits the points to supervisors whose id starts with ID (e.g. ``clicks-backfill``). Unset in
production: the check is one dictionary lookup.

Points: after-write (files staged, nothing committed), before-commit, after-commit
(committed, files not yet moved into place), inside-reset (reset transaction open),
after-reset (committed, marker not yet renamed), after-breach (a lag policy's breach
recorded, its reset not yet planned). With an external catalog (``catalog: {type: glue}``):
between-commits (the table committed the batch, the database not yet), after-fence (a
reset moved the table's fence and rolled forward, nothing captured yet).

``install(hook)`` makes every point (and ``commit_point``, the two sides of a database
COMMIT) call ``hook(name, subject)`` first: the explorer schedules threads and injects
faults there. Nothing installs a hook outside the tests.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

_hits: dict[str, int] = {}
_hook: Callable[[str, object], object] | None = None


def install(hook: Callable[[str, object], object] | None) -> None:
    """Route every point through ``hook`` (None removes it)."""
    global _hook
    _hook = hook


def point(name: str, subject: str | None = None) -> None:
    """A named step of a write path: a scheduling and fault point for the explorer."""
    if _hook is not None:
        _hook(name, subject)


def commit_point(when: str, handle: object = None) -> object:
    """Just before (``before``, with the open (connection, transaction)) and after
    (``after``) a database COMMIT. A true answer means the hook took the transaction over."""
    if _hook is not None:
        return _hook(f"commit-{when}", handle)
    return None


def crash_point(name: str, supervisor: str | None = None) -> None:
    if _hook is not None:
        _hook(name, supervisor)
    wanted = os.environ.get("RECONCILER_CRASH_AT")
    if not wanted or name not in wanted.split(","):
        return
    only = os.environ.get("RECONCILER_CRASH_SUPERVISOR")
    if only and not (supervisor or "").startswith(only):
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] > int(os.environ.get("RECONCILER_CRASH_AFTER", "0")):
        os.kill(os.getpid(), signal.SIGKILL)

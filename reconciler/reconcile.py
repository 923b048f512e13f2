"""One reconcile pass: load the spec directory, read the database, plan, apply.

Shared by the daemon's tick and ``reconciler apply``, so both do exactly the same. The
daemon hands in its ``SpecCache`` so that files unchanged since the last pass are not
parsed and validated again: a pass over a thousand unchanged specs stays in milliseconds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from reconciler.apply import ActionResult, Applier
from reconciler.plan import Plan, PlanSettings, desired_from_directory, plan
from reconciler.spec.loader import SpecCache, load_directory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassResult:
    plan: Plan
    results: tuple[ActionResult, ...]


def reconcile_once(specs_dir: str, applier: Applier, settings: PlanSettings | None = None, *,
                   check_permissions: bool = True, stable: Callable[[], bool] | None = None,
                   cache: SpecCache | None = None) -> PassResult | None:
    """One pass. With ``stable`` (the daemon's watcher), a directory that changed while it was
    being read (an editor's save, a ``git checkout`` under way) is not acted on: None is
    returned and the daemon reads it again once it is quiet, so no pass sees half of a change."""
    state = load_directory(specs_dir, check_permissions=check_permissions, cache=cache)
    if stable is not None and not stable():
        return None
    _report(specs_dir, state)
    desired = desired_from_directory(state)
    actual = applier.store.read_actual()
    p = plan(desired, actual, settings=settings or PlanSettings())
    results = tuple(applier.apply(p.actions))
    applier.render_missing_backfills(actual)  # a crash after a reset committed skipped its rendering
    return PassResult(p, results)


# What was last reported per directory: each problem is logged once while it lasts.
_reported: dict[str, frozenset[str]] = {}


def _report(specs_dir: str, state) -> None:
    """Log each invalid file, rejected marker, directory refusal and spec warning once (WARNING),
    until it changes."""
    found = [state.error] if not state.ok and state.error else []
    found += [f"invalid: {p}" for p in state.problems]
    found += [f"warning: {w}" for w in getattr(state, "warnings", ())]
    before = _reported.get(specs_dir, frozenset())
    for message in found:
        if message not in before:
            log.warning("%s", message)
    _reported[specs_dir] = frozenset(found)

"""One reconcile pass: load the spec directory, read the database, plan, apply.

Shared by the daemon's tick and ``reconciler apply``, so both do exactly the same.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from reconciler.apply import ActionResult, Applier
from reconciler.plan import Plan, PlanSettings, desired_from_directory, plan
from reconciler.spec.loader import load_directory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassResult:
    plan: Plan
    results: tuple[ActionResult, ...]


def reconcile_once(specs_dir: str, applier: Applier, settings: PlanSettings | None = None) -> PassResult:
    state = load_directory(specs_dir)
    for problem in state.problems:
        log.debug("invalid: %s", problem)
    desired = desired_from_directory(state)
    actual = applier.store.read_actual()
    p = plan(desired, actual, settings=settings or PlanSettings())
    return PassResult(p, tuple(applier.apply(p.actions)))

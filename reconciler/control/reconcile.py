"""One reconcile pass: load the spec directory, read the database, plan, apply.

Shared by the daemon's tick and ``reconciler apply``, so both do exactly the same. The
daemon hands in its ``SpecCache`` so that files unchanged since the last pass are not
parsed and validated again: a pass over a thousand unchanged specs stays in milliseconds.

The daemon also hands in ``leading``: a first pass over ten thousand files takes longer
than the leader lease lasts, so the lease is renewed during the pass (at each file,
before the database is read, before each action), and a pass whose leader lost the
lease on the way applies nothing more (``PassResult.fenced``): its plan may be stale, and
another daemon leads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from reconciler.control.apply import ActionResult, Applier
from reconciler.control.plan import Action, Plan, PlanSettings, desired_from_directory, plan
from reconciler.spec import grants as grants_mod
from reconciler.spec.loader import SpecCache, load_directory
from reconciler.spec.markerfiles import retire
from reconciler.spec.names import BAD_NAME

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassResult:
    plan: Plan
    results: tuple[ActionResult, ...]
    fenced: bool = False  # the leader lease was lost during the pass: the actions after ``results`` were not applied


def reconcile_once(specs_dir: str, applier: Applier, settings: PlanSettings | None = None, *,
                   check_permissions: bool = True, stable: Callable[[], bool] | None = None,
                   cache: SpecCache | None = None, leading: Callable[[], bool] | None = None,
                   grants: grants_mod.Grants | None = None) -> PassResult | None:
    """One pass. With ``stable`` (the daemon's watcher), a directory that changed while it was
    being read (an editor's save, a ``git checkout`` under way) is not acted on: None is
    returned and the daemon reads it again once it is quiet, so no pass sees half of a change.

    With ``leading`` (the daemon's lease keeper: renews the lease when due, True while this
    process still holds it without a break), it is called before each spec file is loaded,
    before the database is read and before each action; once it answers False nothing more
    is applied and the result says ``fenced``.

    ``grants`` (default: this process's, see ``spec.grants``): a spec naming a secret the
    operator did not grant is invalid, always; the pass never runs without them."""
    state = load_directory(specs_dir, check_permissions=check_permissions, cache=cache, progress=leading,
                           grants=grants or grants_mod.current())
    if stable is not None and not stable():
        return None
    _report(specs_dir, state)
    desired = desired_from_directory(state)
    if leading is not None and not leading():  # the plan must rest on a state read while leading
        return PassResult(Plan(()), (), fenced=True)
    actual = applier.store.read_actual()
    lag = applier.store.lag_states()  # what the lag observer persisted: the lag policies' input
    p = plan(desired, actual, settings=settings or PlanSettings(), now=datetime.now(UTC), lag=lag)
    for path in state.bad_markers.values():  # never stored, never applied: renamed, reported once
        retire(path, "rejected", {"reason": BAD_NAME})
    gate = _Gate(leading)
    results = tuple(applier.apply(gate.admit(p.actions)))
    if gate.closed:
        return PassResult(p, results, fenced=True)
    applier.render_missing_backfills(actual)  # a crash after a reset committed skipped its rendering
    return PassResult(p, results)


class _Gate:
    """Lets actions through while ``leading()`` says so; closed for good at its first False."""

    def __init__(self, leading: Callable[[], bool] | None):
        self.leading = leading
        self.closed = False

    def admit(self, actions: Iterable[Action]) -> Iterator[Action]:
        for action in actions:
            if self.leading is not None and not self.leading():
                self.closed = True
                log.error("leader lease lost during the pass: %s %s and the rest of the plan not applied",
                          action.kind, action.supervisor_id)
                return
            yield action


# What was last reported per directory: each problem is logged once while it lasts.
_reported: dict[str, frozenset[str]] = {}


def _report(specs_dir: str, state) -> None:
    """Log each invalid file, rejected marker, directory refusal and spec warning once (WARNING),
    until it changes."""
    found = [state.error] if not state.ok and state.error else []
    found += [f"invalid: {p}" for p in state.problems]
    found += [f"warning: {w}" for w in getattr(state, "warnings", ())]
    found += [state.hint] if getattr(state, "hint", None) else []
    before = _reported.get(specs_dir, frozenset())
    for message in found:
        if message not in before:
            log.warning("%s", message)
    _reported[specs_dir] = frozenset(found)

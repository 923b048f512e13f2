"""The reconcile pass, the STATUS summary, and what ``--until-caught-up`` waits for.

A pass runs when the spec directory changed and has settled, or when the safety-net tick is
due (it too waits for a busy directory). A pass whose files changed while they were being
read is dropped and redone: no pass acts on half a change. Nothing one pass does ends the
loop: an unexpected error is logged with its traceback and counted as an aborted pass.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from reconciler.control.actual import Kind, State
from reconciler.control.apply import ActionResult, Applier
from reconciler.control.plan import ActionKind, PlanSettings
from reconciler.control.reconcile import reconcile_once
from reconciler.errors import ReconcilerError
from reconciler.observe.metrics import Metrics
from reconciler.runtime import startedover
from reconciler.runtime.batching import caught_up
from reconciler.runtime.supervisor import RUNNABLE
from reconciler.settings import Settings
from reconciler.spec.grants import Grants
from reconciler.spec.loader import SpecCache
from reconciler.store.store import Store
from reconciler.streams import adapter_for

from .leadership import Leadership
from .watcher import SpecWatcher

log = logging.getLogger("reconciler.daemon")  # the name in every line, as before the split

SUMMARY_EVERY = 2.0  # seconds between refreshes of the STATUS line and the state gauges
UNHEALTHY_GRACE = 60.0  # seconds --until-caught-up waits for an UNHEALTHY supervisor to recover


class Tick:
    """The leader's reconcile passes and the summary behind its STATUS line.

    ``settings`` is asked at each use, so a SIGHUP's new settings apply to the next pass."""

    def __init__(self, store: Store, settings: Callable[[], Settings], holder: str, metrics: Metrics,
                 leadership: Leadership):
        self._store = store
        self._settings = settings
        self._holder = holder
        self._metrics = metrics
        self._leadership = leadership
        self.passes = 0  # reconcile passes that applied at least one action
        self.concluded = 0  # passes that concluded (changed or unchanged): not aborted, fenced or deferred
        self.summary = "starting"
        self._summary_at = 0.0
        self._notes: tuple[str, ...] = ()
        self._spec_cache = SpecCache()  # files unchanged since the last pass are not parsed again
        self._requested = False  # a lag policy's reset is due: reconcile without waiting for the tick

    def request_pass(self) -> None:
        """Reconcile at the loop's next turn (the lag observer, from its thread; a flag only)."""
        self._requested = True

    def maybe_reconcile(self, watcher: SpecWatcher, next_tick: float) -> float:
        """Reconcile if files changed or the tick is due, once the directory is quiet; the next tick time."""
        files = watcher.pending()
        # a new term's runtimes wait for its first pass (Leadership.pass_ended): it is due now
        first = self._leadership.first_pass_due()
        if not files and time.monotonic() < next_tick and not self._requested and not first:
            return next_tick
        if watcher.blocked(self._settings().debounce):
            return next_tick
        self._requested = False
        mark = watcher.consume()
        outcome = self._reconcile("files" if files else "tick", lambda: watcher.unchanged_since(mark))
        # A deferred pass is redone when the directory is quiet; an aborted one (the database)
        # is tried again at once while the term's runtimes wait for it (``first_pass_due``),
        # within their bound: released, they would read the backlog a marker may skip.
        if outcome not in ("deferred", "aborted"):
            self._leadership.pass_ended()
        if outcome == "deferred":
            return time.monotonic()  # again as soon as the directory is quiet
        if outcome == "fenced":  # again once the lease is settled: by this daemon only if it leads again
            return time.monotonic() + min(1.0, self._settings().lease_ttl / 5)
        return time.monotonic() + self._settings().tick_interval

    def _reconcile(self, trigger: str, stable: Callable[[], bool]) -> str:
        started = time.monotonic()
        settings = self._settings()
        applier = Applier(self._store, actor=f"daemon:{self._holder}", state_dir=settings.state_path,
                          warehouse=settings.warehouse, catalog=settings.catalog,
                          started_over=startedover.asker(self._store))  # markers and stanzas, as the CLI's reset
        ps = PlanSettings(max_termination_share=settings.max_termination_share)
        self._leadership.begin_pass()
        try:
            result = reconcile_once(settings.specs, applier, ps,
                                    check_permissions=not settings.allow_insecure_specs, stable=stable,
                                    cache=self._spec_cache, leading=self._leadership.leading_in_pass,
                                    grants=Grants.from_settings(settings))
        except ReconcilerError as exc:
            log.error("reconcile aborted (nothing concluded): %s", exc)
            self._metrics.reconcile_done("aborted", time.monotonic() - started, error=str(exc))
            return "aborted"
        except Exception as exc:  # noqa: BLE001 (a bug or an input no check foresaw: report, go on)
            log.exception("reconcile aborted by an unexpected error (nothing concluded; the daemon "
                          "goes on): %s", exc)
            self._metrics.reconcile_done("aborted", time.monotonic() - started,
                                         error=f"unexpected error: {type(exc).__name__}: {exc}")
            return "aborted"
        if result is None:
            log.debug("the spec directory changed while it was read: pass dropped, redone when quiet")
            self._metrics.reconcile_done("deferred", time.monotonic() - started)
            return "deferred"
        if result.fenced:
            self._count_resets(result.results)
            log.error("reconcile pass (%s) stopped: the leader lease was lost or could not be renewed; "
                      "%d of %d action(s) applied, the rest left to the leader", trigger, len(result.results),
                      len(result.plan.actions))
            self._leadership.settle_soon()
            self._metrics.reconcile_done("aborted", time.monotonic() - started,
                                         error="the leader lease was lost during the pass")
            return "fenced"
        if result.plan.notes != self._notes:
            for note in result.plan.notes:
                log.warning("%s", note)
            self._notes = result.plan.notes
        manager = self._leadership.manager
        if manager is not None:
            manager.poke()
        self._count_resets(result.results)
        elapsed = time.monotonic() - started
        outcome = "changed" if result.results else "unchanged"
        self.concluded += 1
        if result.results:
            self.passes += 1
            failed = sum(1 for r in result.results if not r.ok)
            log.info("reconcile pass (%s): %d action(s) applied, %d failed, in %.3fs",
                     trigger, len(result.results), failed, elapsed)
        else:
            log.debug("reconcile pass (%s): no changes, %.3fs", trigger, elapsed)
        self._metrics.reconcile_done(outcome, elapsed)
        self._summary_at = 0.0  # refresh the STATUS line now
        return outcome

    def _count_resets(self, results: tuple[ActionResult, ...]) -> None:
        for r in results:
            if r.ok and r.action.kind in (ActionKind.RESET, ActionKind.RESET_AND_BACKFILL) \
                    and not r.details.get("appliedBefore"):
                trigger = r.action.request.trigger if r.action.request else "unknown"
                self._metrics.resets.labels(r.action.supervisor_id, trigger).inc()

    def sleep_for(self, leader: bool, next_tick: float, watcher: SpecWatcher, until_caught_up: bool,
                  ping_due: float) -> float:
        """How long the loop may wait: ``ping_due`` is the time until the next WATCHDOG=1."""
        settings = self._settings()
        cap = min(ping_due, 0.5 if until_caught_up else 1.0)
        if not leader:
            return min(cap, settings.lease_ttl / 5)
        horizon = max(0.02, next_tick - time.monotonic())
        hint = watcher.wait_hint(settings.debounce)
        if hint is not None:
            horizon = min(horizon, hint)
        return min(horizon, cap, settings.lease_ttl / 5)

    def refresh_summary(self) -> None:
        now = time.monotonic()
        if now - self._summary_at < SUMMARY_EVERY:
            return
        self._summary_at = now
        try:
            actual = self._store.read_actual()
        except ReconcilerError:
            return
        states = {sid: str(r.state) for sid, r in actual.supervisors.items()}
        self._metrics.set_states(states, [str(x) for x in State])
        self._metrics.prune_failing(sid for sid, r in actual.supervisors.items() if r.state in RUNNABLE)
        counts = Counter(s for s in states.values() if s != State.TERMINATED)
        text = f"{sum(counts.values())} supervisor(s)"
        if counts:
            text += ": " + ", ".join(f"{n} {st}" for st, n in sorted(counts.items()))
        manager = self._leadership.manager
        busy = len(manager.running) if manager else 0
        if busy:
            text += f"; {busy} batch(es) in flight"
        if self._metrics.failing:
            text += f"; {len(self._metrics.failing)} failing"
        self.summary = text


class CatchUp:
    """What ``--until-caught-up`` waits for: the latest offsets seen at the first check, every
    backfill completed, and no batch in flight; and the supervisors it gives up on."""

    def __init__(self, store: Store, leadership: Leadership, concluded: Callable[[], bool] = lambda: True):
        self._store = store
        self._leadership = leadership
        # Targets are fixed only after a pass concluded: a pass fenced by a lost lease (a slow
        # start under load) applied nothing, and its empty targets were "caught up" at once.
        self._concluded = concluded
        self._targets: dict[str, dict[str, int]] | None = None
        self._unhealthy_since: dict[str, float] = {}
        self.stuck: list[str] = []

    def caught_up(self) -> bool:
        try:
            actual = self._store.read_actual()
        except ReconcilerError as exc:  # e.g. the database connection dropped: ask again next loop
            log.warning("cannot read the state to check catch-up yet: %s", exc)
            return False
        self._note_stuck(actual)  # first: a supervisor whose stream cannot even be asked is stuck too
        if self._targets is None:
            if not self._concluded():
                return False
            targets = {}
            for sid, rec in actual.supervisors.items():
                if rec.kind == Kind.MAIN and rec.state in RUNNABLE:
                    try:
                        adapter = adapter_for(rec.spec.source)
                        try:
                            targets[sid] = adapter.latest()
                        finally:
                            adapter.close()
                    except Exception as exc:  # noqa: BLE001 - one supervisor's surprise, reported on it
                        log.warning("%s: cannot read latest offsets yet: %s", sid, exc)
                        return False
            self._targets = targets
            log.info("--until-caught-up targets: %s", targets)
        manager = self._leadership.manager
        # idle_or_notify: a step still in flight rings the loop when it ends (not at the next check)
        return not self._pending(actual) and (manager is None or manager.idle_or_notify())

    def _pending(self, actual) -> list[str]:
        """What keeps ``--until-caught-up`` waiting, one phrase per supervisor."""
        out = []
        for sid, target in (self._targets or {}).items():
            rec = actual.supervisors.get(sid)
            if rec is None or rec.state not in RUNNABLE:
                continue
            checkpoint = actual.checkpoints.get(sid, {})
            if not caught_up(checkpoint, target):
                lag = sum(max(0, end - checkpoint.get(p, 0)) for p, end in target.items())
                out.append(f"{sid} ({rec.state}, {lag} records behind)")
        out += [f"{sid} ({r.state}, backfill not completed)" for sid, r in sorted(actual.supervisors.items())
                if r.kind == Kind.BACKFILL and r.state not in (State.COMPLETED, State.TERMINATED)]
        return out

    def pending_text(self) -> str:
        try:
            return ", ".join(self._pending(self._store.read_actual())) or "in-flight batches"
        except ReconcilerError as exc:
            return f"unknown (the database cannot be read: {exc})"

    def _note_stuck(self, actual) -> None:
        """Supervisors UNHEALTHY for longer than the grace period: --until-caught-up gives up on them."""
        now = time.monotonic()
        unhealthy = {sid: r for sid, r in actual.supervisors.items()
                     if r.state in (State.UNHEALTHY_SUPERVISOR, State.UNHEALTHY_TASKS)}
        self._unhealthy_since = {sid: self._unhealthy_since.get(sid, now) for sid in unhealthy}
        self.stuck = [f"{sid} has been {r.state} for {now - self._unhealthy_since[sid]:.0f}s: {r.last_error}"
                      for sid, r in sorted(unhealthy.items()) if now - self._unhealthy_since[sid] >= UNHEALTHY_GRACE]

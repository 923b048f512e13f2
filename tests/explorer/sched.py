"""A deterministic scheduler of real threads, and the faults it injects.

Every actor (a daemon's runtime, a compaction, a ``reconciler maintain``, a reset...) runs
the product's code in its own thread, but only one runs at a time: at each named point of
a write path (``reconciler.faults``: after the files are written, before a commit, after
it, before a deletion...) the running thread parks and the scheduler, drawing from one
seeded ``random.Random``, picks who runs next. The same seed gives the same interleaving,
the same faults and so the same outcome.

Faults, drawn at the points as well:

* ``kill``: the actor's process dies (SIGKILL): it runs no further code that has an effect
  (every later point of its threads raises ``Killed``, and every effect of the product
  passes a point first: a database write passes its COMMIT's);
* ``power``: a power cut: every process dies, and the files not yet fsynced are lost
  (``disk.Ledger``; applied when the schedule ends);
* ``drop-before`` / ``drop-after``: the database connection drops with the COMMIT: rolled
  back, or committed, the caller cannot tell (``CommitOutcomeUnknown``);
* ``limbo``: the connection drops while the server still holds the transaction: it
  commits (or rolls back) a little later, from another thread, after the caller was told
  the outcome is unknown (what PostgreSQL does with a COMMIT it received);
* ``enospc``: the disk is full where a file is written or synced.

Points inside a transaction (``commit-before``, ``commit-after``, ``inside-reset``) or a
lock (``table-created``: the catalog's) inject faults but never switch threads: a parked
writer there would hold the database's lock, or its process's.
"""

from __future__ import annotations

import errno
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa

from reconciler import faults

NO_SWITCH = {"commit-before", "commit-after", "inside-reset", "table-created"}
FILE_POINTS = {"job-file", "job-sync", "write-metadata"}
HANG = 30.0  # seconds an actor may run between two points before the schedule counts as hung


class Killed(BaseException):
    """The actor's process is dead: unwind without running anything else that has an effect."""


@dataclass
class FaultPlan:
    """Probabilities per point, and faults forced at (actor, point, occurrence)."""

    kill: float = 0.0
    power: float = 0.0
    drop: float = 0.0  # each of drop-before, drop-after at a commit
    limbo: float = 0.0
    enospc: float = 0.0
    forced: dict[tuple[str, str, int], str] = field(default_factory=dict)
    # (actor, point) -> (a later point, fault): once the actor passed the first point, the
    # fault strikes at the next occurrence of the second (e.g. the COMMIT of the publish).
    armed: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)

    def decide(self, rng: random.Random, actor: str, point: str, occurrence: int) -> str | None:
        forced = self.forced.get((actor, point, occurrence))
        if forced is not None:
            return forced
        if point in ("start", "idle"):  # idle: a command not started yet (replay.py) has nothing to kill
            return None
        x = rng.random()
        if point == "commit-before":
            if x < self.drop:
                return "drop-before"
            if x < self.drop + self.limbo:
                return "limbo"
            x = rng.random()
        elif point == "commit-after":
            if x < self.drop:
                return "drop-after"
            x = rng.random()
        elif point in FILE_POINTS:
            if x < self.enospc:
                return "enospc"
            x = rng.random()
        if x < self.kill:
            return "kill"
        if x < self.kill + self.power:
            return "power"
        return None


@dataclass
class Actor:
    name: str
    process: str
    fn: Callable[[], None]
    state: str = "new"  # new | parked | running | done
    point: str | None = None
    outcome: str = ""
    thread: threading.Thread | None = None
    wake: threading.Condition | None = None  # on the scheduler's lock: only this actor waits on it


class Scheduler:
    def __init__(self, rng: random.Random, plan: FaultPlan, *, limbo_commits: Callable[[], bool] | None = None,
                 hang: float = HANG):
        self.rng = rng
        self.hang = hang
        self.plan = plan
        self._mutex = threading.Lock()
        self.cond = threading.Condition(self._mutex)  # the scheduler waits on it; each actor on its own
        self.actors: dict[str, Actor] = {}
        self._by_thread: dict[int, Actor] = {}
        self.dead: set[str] = set()  # processes
        self.power_cut = False
        self.trace: list[str] = []
        self.faults: list[str] = []
        self._occurrences: dict[tuple[str, str], int] = {}
        self._limbo: list[threading.Thread] = []
        self._limbo_commits = limbo_commits or (lambda: rng.random() < 0.5)
        self.script: list[tuple[str, str | None]] = []  # (actor, run until it parks at this point)
        self._stepped: set[str] = set()  # scripted actors released since their step began
        self._pending: dict[str, tuple[str, str]] = {}  # armed faults waiting for their point
        self.observe: Callable[[str, Actor], None] | None = None  # sees every point an actor reaches

    # -- set-up --------------------------------------------------------------------------

    def spawn(self, name: str, process: str, fn: Callable[[], None]) -> None:
        self.actors[name] = Actor(name, process, fn, wake=threading.Condition(self._mutex))

    def kill_process(self, process: str) -> None:
        self.dead.add(process)

    # -- the hook (runs in the actors' threads) ---------------------------------------------

    def hook(self, point: str, handle: object) -> object:
        actor = self._by_thread.get(threading.get_ident())
        if actor is None:  # the explorer's own thread, a pool, a limbo committer: no scheduling
            return None
        if actor.process in self.dead:
            raise Killed(actor.process)
        if self.observe is not None:
            self.observe(point, actor)
        key = (actor.name, point)
        occurrence = self._occurrences.get(key, 0)
        self._occurrences[key] = occurrence + 1
        fault = self.plan.decide(self.rng, actor.name, point, occurrence)
        pending = self._pending.get(actor.name)
        if pending is not None and pending[0] == point:
            fault = pending[1]
            del self._pending[actor.name]
        if (actor.name, point) in self.plan.armed:
            self._pending[actor.name] = self.plan.armed[(actor.name, point)]
        self.trace.append(f"{actor.name}@{point}" + (f"!{fault}" if fault else ""))
        if fault is not None:
            self.faults.append(f"{fault} {actor.name}@{point}")
        if fault == "kill":
            self.dead.add(actor.process)
            raise Killed(actor.process)
        if fault == "power":
            self.power_cut = True
            self.dead |= {a.process for a in self.actors.values()}
            raise Killed("power")
        if fault == "drop-before" and point == "commit-before":
            raise _dropped("before COMMIT")
        if fault == "drop-after" and point == "commit-after":
            raise _dropped("after COMMIT")
        if fault in ("limbo", "limbo-commit", "limbo-abort") and point == "commit-before":
            self._take_over(handle, {"limbo-commit": True, "limbo-abort": False}.get(fault))
            return True
        if fault == "enospc" and point in FILE_POINTS:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        if point not in NO_SWITCH:
            self._park(actor, point)
            if actor.process in self.dead:
                raise Killed(actor.process)
        return None

    def _take_over(self, handle, commit: bool | None = None) -> None:
        conn, trans = handle
        commit = self._limbo_commits() if commit is None else commit

        def finish():
            time.sleep(0.03)
            try:
                if commit and not self.power_cut:
                    trans.commit()
                else:
                    trans.rollback()
            except sa.exc.SQLAlchemyError:
                pass
            finally:
                conn.close()

        t = threading.Thread(target=finish, name="limbo", daemon=True)
        self._limbo.append(t)
        t.start()

    def _park(self, actor: Actor, point: str) -> None:
        with self.cond:
            actor.state, actor.point = "parked", point
            self.cond.notify()  # the scheduler: the only one waiting on ``cond``
            while actor.state != "running":
                actor.wake.wait()

    # -- running ---------------------------------------------------------------------------

    def _body(self, actor: Actor) -> None:
        self._by_thread[threading.get_ident()] = actor
        try:
            self.hook("start", None)
            actor.fn()
            actor.outcome = "done"
        except Killed:
            actor.outcome = "killed"
        except BaseException as exc:  # noqa: BLE001 - an actor's own failure is part of the outcome
            actor.outcome = f"error: {type(exc).__name__}: {exc}"[:300]
        finally:
            with self.cond:
                actor.state = "done"
                self.cond.notify()

    def run(self) -> None:
        """Run every actor to its end (or death), one at a time."""
        for actor in self.actors.values():
            actor.thread = threading.Thread(target=self._body, args=(actor,), name=f"actor-{actor.name}",
                                            daemon=True)
            actor.thread.start()
        while True:
            with self.cond:
                deadline = time.monotonic() + self.hang
                while any(a.state in ("new", "running") for a in self.actors.values()):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        running = [f"{a.name}@{a.point}" for a in self.actors.values() if a.state != "done"]
                        raise Hang(f"no point reached within {self.hang:.0f}s: {running}")
                    self.cond.wait(left)
                parked = sorted((a for a in self.actors.values() if a.state == "parked"), key=lambda a: a.name)
                if not parked:
                    break
                actor = self._next(parked)
                actor.state = "running"
                actor.wake.notify()  # that actor alone, not every parked thread
        for actor in self.actors.values():
            actor.thread.join(5)
        for t in self._limbo:
            t.join(5)

    def _next(self, parked: list[Actor]) -> Actor:
        """The script's next actor while it lasts (run until it parks at the named point),
        else one drawn from the seed. Dead actors go first: they only unwind."""
        dead = [a for a in parked if a.process in self.dead]
        if dead:
            return dead[0]
        while self.script:
            name, until = self.script[0]
            actor = self.actors.get(name)
            if actor is None or actor.state == "done":
                self.script.pop(0)
                continue
            if name in self._stepped and (until is None or actor.point == until):
                self._stepped.discard(name)  # arrived: the step is done
                self.script.pop(0)
                continue
            self._stepped.add(name)
            return actor
        return self.rng.choice(parked)


class Hang(Exception):
    """An actor neither reached a point nor ended: a deadlock, or a wait that never ends."""


def _dropped(when: str) -> sa.exc.OperationalError:
    return sa.exc.OperationalError(f"(injected) connection dropped {when}", {}, ConnectionError(when))


def installed(scheduler: Scheduler):
    """Context manager: the scheduler's hook on every fault point, for the run."""

    class _Installed:
        def __enter__(self):
            faults.install(scheduler.hook)
            return scheduler

        def __exit__(self, *exc):
            faults.install(None)

    return _Installed()

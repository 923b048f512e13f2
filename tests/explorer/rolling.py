"""Rolling compaction in the explorer (issue 45): the leader's merge of the partitions still
being written (``reconciler.table.rolling.compact_open``) as an actor of the daemon's
process, beside its ingestion, a reset, expiry, orphan clean-up and a takeover.

Its "now" is the model stream's first instant, so every time partition the records fall
in is open: the run selects the files older than its last ``keep_recent`` commits, the very
files the publishes of the same process keep adding to. Its switch and fault points are
compaction's own (``compact-written``, ``compact-commit``, ``compact-unknown``, and its
commit's), so the random fault plan strikes it like any other write, and a publish that
moves the table between its plan and its commit makes it plan again. The truth
(``check.truth``) is unchanged: every key exactly once across the tables, no file lost,
no garbage left after healing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from reconciler import faults
from reconciler.table.rolling import compact_open
from tests.explorer.model import T0
from tests.explorer.world import DATASOURCE, MAIN, World

if TYPE_CHECKING:
    from tests.explorer.schedules import Schedule

END = ""  # schedules.END: run the actor to its end


def roller(times: int = 1, keep_recent: int = 1, turns: int = 60) -> Callable:
    """The leader's rolling compaction, ``times`` runs, once the table has a few snapshots
    (waiting up to ``turns`` switches)."""

    def bind(world: World, process: str) -> Callable[[], None]:
        proc = world.process(process)

        def run():
            for _ in range(turns):
                if has_work(world, proc, keep_recent):
                    break
                faults.point("idle", "rolling")  # not yet a command: nothing to kill (as replay.py)
            for _ in range(times):
                try:
                    roll(world, proc, keep_recent)
                except Exception as exc:  # noqa: BLE001 - one failed run; the leader's next run goes on
                    world.notes.append(f"{process}: rolling: {type(exc).__name__}: {exc}"[:300])
        return run

    return bind


def _rollup(world: World):
    from reconciler.table.compact import Rollup

    return Rollup(("id", "__partition", "__offset"), (("count", "count"),)) if world.rollup else None


def has_work(world: World, proc, keep_recent: int) -> bool:
    """Whether a run would merge something now (its own plan, dry: the snapshot count says
    little where publishes expire the history as they go)."""
    if proc.tables.load(DATASOURCE) is None:
        return False
    result = compact_open(proc.tables, DATASOURCE, store=proc.store, rollup=_rollup(world), keep_recent=keep_recent,
                          now=T0, target_file_size=1 << 30, dry_run=True)
    return bool(result.partitions)


def roll(world: World, proc, keep_recent: int) -> None:
    result = compact_open(proc.tables, DATASOURCE, store=proc.store, rollup=_rollup(world), keep_recent=keep_recent,
                          now=T0, target_file_size=1 << 30, attempts=3)
    if result.committed and result.files_before > result.files_after:
        world.reached.add("rolled")
        if result.attempts > 1:
            world.reached.add("rolled-after-race")
    world.notes.append(f"{proc.name}: rolling: {result.message} (attempts {result.attempts})")


def add_random(s: Schedule, rng) -> None:
    """4 in 10 random schedules run the leader's rolling compaction in the daemon's process;
    half of those with one fault placed on its own points (the plan's rates strike them
    rarely: its waits take most of its switches)."""
    if rng.random() >= 0.4:
        return
    s.actors.append(("rolling", "daemon", roller(rng.choice([1, 2, 3]), rng.choice([0, 0, 1, 2]),
                                                 rng.randint(20, 150))))
    x = rng.random()
    if x < 0.25:
        s.plan.forced[("rolling", rng.choice(["compact-written", "write-metadata"]), 0)] = rng.choice(
            ["kill", "kill", "power", "enospc"])
    elif x < 0.5:
        s.plan.armed[("rolling", "compact-commit")] = rng.choice(
            [("commit-before", "kill"), ("commit-before", "drop-before"), ("commit-before", "limbo"),
             ("commit-after", "kill"), ("commit-after", "drop-after"), ("commit-after", "power")])


# --------------------------------------------------------------------------- named schedules


def named() -> tuple:
    """The named schedules (built on schedules.py's helpers: asked for at the end of that module)."""
    from tests.explorer.schedules import Schedule, _ingest, _op, _plain, _seq

    def rolling_loses_the_race() -> Schedule:
        """A publish of the same leader lands between the rolling run's staging and its commit:
        the run plans again with the same cutoff and commits on the new table."""
        s = Schedule("rolling-loses-the-race", 31)
        s.actors = [("main", "daemon", _ingest(4)), ("rolling", "daemon", roller(1, keep_recent=1)),
                    ("producer", "producer", _plain(lambda w: w.produce(7))),
                    ("more", "daemon", _seq(_op("step", MAIN, 2)))]
        s.script = [("main", END), ("rolling", "compact-commit"), ("producer", END), ("more", END),
                    ("rolling", END)]
        s.expect = lambda world, tables, store: ([] if "rolled-after-race" in world.reached else
                                                 [f"the rolling run did not commit after a lost race: {world.notes}"])
        return s

    def power_cut_after_rolling() -> Schedule:
        """A power cut right after the rolling compaction committed."""
        s = Schedule("power-cut-after-rolling", 32)
        s.actors = [("main", "daemon", _ingest(6)), ("rolling", "daemon", roller(1, keep_recent=1))]
        s.script = [("main", END), ("rolling", END)]
        from tests.explorer.sched import FaultPlan

        s.plan = FaultPlan(armed={("rolling", "compact-commit"): ("commit-after", "power")})
        return s

    def takeover_during_rolling() -> Schedule:
        """The leader pauses past its lease with its rolling run written, not committed: the
        new leader's recovery fences the write, which then cannot commit."""
        s = Schedule("takeover-during-rolling", 33)
        s.actors = [("main", "daemon", _ingest(6)), ("rolling", "daemon", roller(1, keep_recent=0)),
                    ("takeover", "daemon2", _seq(_op("take_over", 3, 0, 1)))]
        s.script = [("main", END), ("rolling", "compact-commit"), ("takeover", END), ("rolling", END)]
        return s

    return (rolling_loses_the_race, power_cut_after_rolling, takeover_during_rolling)

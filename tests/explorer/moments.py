"""Named schedules that set up one rare moment each, found by the mutation audit
(``scripts/mutations``): random schedules reach them too seldom to be relied on.

* a takeover while another process's write is in flight: the new leader's recovery must
  fence the write before deleting its files (a compaction, a CLI, does not check the
  leader's lease: only the fence stops it committing files that are gone);
* a reset to latest while the checkpoint lies above the end the broker reports (a lagging
  replica): the checkpoint must stay, never move back onto records already read;
* a batch committed between the start of a reset and its transaction: the reset must
  read the checkpoints inside its transaction (``reset-begin``), not before.
"""

from __future__ import annotations

import random

from reconciler import faults
from tests.explorer.schedules import END, Schedule, _ingest, _op, _plain, _seq
from tests.explorer.world import MAIN, World


def takeover_during_compaction() -> Schedule:
    """A standby takes the lapsed lease over while a compaction has written its files and
    not yet committed: recovery fences the compaction's write, which then cannot commit."""
    s = Schedule("takeover-during-compaction", 21)
    s.actors = [("main", "daemon", _ingest(6)), ("compact", "cli-compact", _seq(_op("compact"))),
                ("takeover", "daemon2", _seq(_op("take_over", 3, 0, 1)))]
    s.script = [("main", END), ("compact", "compact-commit"), ("takeover", END), ("compact", END)]
    return s


def takeover_during_publish() -> Schedule:
    """The same moment for a batch: written, not yet published, when the standby takes over."""
    s = Schedule("takeover-during-publish", 22)
    s.actors = [("main", "daemon", _ingest(3)), ("takeover", "daemon2", _seq(_op("take_over", 3, 0, 2)))]
    s.script = [("main", "before-commit"), ("takeover", END), ("main", END)]
    return s


class _ShortEnd:
    """The broker's end always the most it may be short (``lag_rng``'s one use)."""

    @staticmethod
    def randint(low: int, high: int) -> int:
        return high


def _caught_up_then_lagging(world: World) -> None:
    """The main supervisor read its whole stream; from now on the broker reports an end 4 short."""
    proc = world.process("setup")
    world.lead(proc)
    for _ in range(10):
        world.step(proc, MAIN, 1)
    proc.runtimes.clear()
    world.stream.under_report, world.stream.lag_rng = 4, _ShortEnd()


def _true_end(world: World) -> None:
    world.stream.under_report = 0


def reset_above_reported_end() -> Schedule:
    """A reset to latest while the checkpoint is above the end the broker reports: the
    checkpoint stays (moving it back would read 4 records again, twice in the table)."""
    s = Schedule("reset-above-reported-end", 23)
    s.setup = _caught_up_then_lagging
    s.actors = [("reset", "cli-reset", _seq(_op("reset"), _plain(_true_end))),
                ("main", "daemon", _ingest(2))]
    s.script = [("reset", END), ("main", END)]
    return s


def _behind(world: World) -> None:
    """The main supervisor read its stream, then 10 more records per partition arrived."""
    proc = world.process("setup")
    world.lead(proc)
    for _ in range(10):
        world.step(proc, MAIN, 1)
    proc.runtimes.clear()
    world.produce(10)


def batch_before_reset_transaction() -> Schedule:
    """A reset captured the stream's end; before its transaction began the daemon committed
    a batch. The transaction must read the checkpoint that batch moved: its backfill then
    starts there, not where the checkpoint was (records in the table twice)."""
    s = Schedule("batch-before-reset-transaction", 24)
    s.setup = _behind
    s.actors = [("reset", "cli-reset", _seq(_op("reset"))),
                ("main", "daemon", _seq(_op("lead"), _op("step", MAIN, 1))),
                ("backfills", "daemon", _seq(*[_op("step_backfills", 1) for _ in range(4)]))]
    s.script = [("reset", "reset-begin"), ("main", END), ("reset", END), ("backfills", END)]
    return s


def _near_end(turns: int):
    """Wait (up to ``turns`` switches) until the main checkpoint is within the broker's
    under-report of the stream's true end: a reset to latest then may see an end below it."""

    def bind(world: World, process: str):
        proc = world.process(process)

        def run():
            for _ in range(turns):
                at = proc.store.read_actual().checkpoints.get(MAIN, {})
                latest = world.stream.latest()
                if at and all(at.get(p, 0) >= end - world.stream.under_report for p, end in latest.items()):
                    return
                faults.point("wait", "near-end")
        return run

    return bind


def bias(s: Schedule) -> None:
    """Random schedules meet the reset above the reported end more often: in a world whose
    broker under-reports, the reset mostly waits until the checkpoint is near the end.
    Drawn from a generator of its own: the seed's other draws stay as they were."""
    rng = random.Random(s.seed * 104729 + 11)
    at = {a[0]: i for i, a in enumerate(s.actors)}
    if "reset" in at and s.world.get("under_report") and rng.random() < 0.7:
        s.actors[at["reset"]] = ("reset", "cli-reset", _seq(_near_end(rng.randint(20, 80)), _op("reset")))


SCHEDULES = (takeover_during_compaction, takeover_during_publish, reset_above_reported_end,
             batch_before_reset_transaction)

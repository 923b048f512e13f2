"""Dead-letter replay in the explorer (issue 43): ``reconciler deadletter replay`` as a
process of a schedule, beside ingestion, compaction, expiry, a reset and another replay.

The model stream's dead letters are real JSON values: a record that does not parse has
an ISO ``ts`` under the spec's ``format: millis`` (fixable), or one in three a ``ts`` no
format parses. ``fix_spec`` stores the supervisor's spec with ``format: auto``, as
``reconciler apply`` of the edited file would; from then on the model job ingests the
fixable ones as rows. A replay actor waits until the spec is fixed and there are dead
letters, then runs the product's ``replay`` (its points ``replay-written``,
``replay-commit``, ``replay-unknown``, ``replay-committed`` and its commit's are switch
and fault points like any other). The truth (``check.truth``) counts a record by its key
across the data and dead-letter tables, so a record that moved is still there once; after
healing, one more replay (no faults, as the operator's) must leave no fixable record in
the dead letters and no unfixable one in the data table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from reconciler import faults
from reconciler.model import SupervisorSpec
from reconciler.table.catalog import Tables, deadletter_table
from reconciler.table.replay import ReplayRefused, replay
from tests.explorer.sched import FaultPlan
from tests.explorer.world import DATASOURCE, MAIN, Process, World, spec_document

if TYPE_CHECKING:
    from tests.explorer.schedules import Schedule

END = ""  # schedules.END: run the actor to its end


def fix_spec(world: World, store=None) -> None:
    doc = spec_document(rollup=world.rollup, timestamp_format="auto")
    (store or world.shared).update_spec(SupervisorSpec.from_document(doc), None, actor="explorer")
    world.spec_fixed = True
    world.reached.add("spec-fixed")


def dead_letters(proc: Process) -> int:
    table = proc.tables.load(deadletter_table(DATASOURCE))
    snap = table.current_snapshot() if table is not None else None
    return int(snap.summary["total-records"]) if snap is not None else 0


def run_replay(world: World, proc: Process) -> None:
    try:
        result = replay(proc.tables, proc.store, DATASOURCE, actor=proc.name)
    except ReplayRefused as exc:  # no dead letters (yet): the command says so and changes nothing
        world.notes.append(f"{proc.name}: replay refused: {exc}")
        return
    if result.committed and result.replayed:
        world.reached.add("replayed")
    world.notes.append(f"{proc.name}: replay: {result.message} (attempts {result.attempts})")


def replayer(times: int = 1, turns: int = 60) -> Callable:
    """An operator's ``deadletter replay``, ``times`` in a row, once the spec is fixed and
    there are dead letters (waiting up to ``turns`` switches, or not at all)."""

    def bind(world: World, process: str) -> Callable[[], None]:
        proc = world.process(process)

        def run():
            for _ in range(turns):
                if world.spec_fixed and dead_letters(proc):
                    break
                faults.point("idle", "replay")
            if not world.spec_fixed:
                return
            for _ in range(times):
                try:
                    run_replay(world, proc)
                except Exception as exc:  # noqa: BLE001 - the command failed; the schedule goes on
                    world.notes.append(f"{process}: {type(exc).__name__}: {exc}"[:300])
        return run

    return bind


def fixer(turns: int = 0) -> Callable:
    """The operator edits the spec (``format: auto``), once there are dead letters (waiting
    up to ``turns`` switches) or at once."""

    def bind(world: World, process: str) -> Callable[[], None]:
        proc = world.process(process)

        def run():
            for _ in range(turns):
                if dead_letters(proc):
                    break
                faults.point("idle", "dead-letters")
            fix_spec(world, proc.store)
        return run

    return bind


def add_random(s: Schedule, rng) -> None:
    """3 in 10 random schedules fix the spec and replay, one replay actor or two."""
    if rng.random() >= 0.3 or s.world.get("rollup"):
        return
    if not s.world.get("bad_every"):
        s.world["bad_every"] = rng.choice([4, 5])
    s.actors.append(("fixer", "editor", fixer(rng.choice([5, 30, 100]))))
    s.actors.append(("replay", "cli-replay", replayer(rng.choice([1, 1, 2]), rng.randint(30, 150))))
    if rng.random() < 0.3:
        s.actors.append(("replay2", "cli-replay-2", replayer(1, rng.randint(30, 150))))
    # The plan's rates strike the replay's few points rarely (its waits take most): half the
    # time one fault is placed on them.
    x = rng.random()
    if x < 0.25:
        at = rng.choice(["replay-written", "write-metadata", "replay-committed"])
        s.plan.forced[("replay", at, 0)] = rng.choice(["kill", "kill", "power"] + ["enospc"] * (at == "write-metadata"))
    elif x < 0.5:
        s.plan.armed[("replay", "replay-commit")] = rng.choice(
            [("commit-before", "kill"), ("commit-before", "drop-before"), ("commit-before", "limbo"),
             ("commit-after", "kill"), ("commit-after", "drop-after")])


def after_heal(world: World, proc: Process) -> list[str]:
    """The operator's last replay once everything is ingested, then where each record is."""
    if world.sched is not None and any(f.split()[-1].startswith("replay") and not f.endswith("@idle")
                                       for f in world.sched.faults):
        world.reached.add("replay-faulted")  # a fault struck a replay inside the command
    if not world.spec_fixed:
        return []
    run_replay(world, proc)
    return placed(world, Tables(proc.store.engine, world.warehouse))


def placed(world: World, tables: Tables) -> list[str]:
    """No fixable record among the dead letters, no unfixable one among the rows."""
    fixable = {r.key for r in world.stream.records() if r.fixable}
    unfixable = {r.key for r in world.stream.records() if r.bad and not r.fixable}
    dead_keys, row_keys = set(), set()
    dead = tables.load(deadletter_table(DATASOURCE))
    if dead is not None and dead.current_snapshot() is not None:
        dead_keys = {k.decode() for k in dead.scan(selected_fields=("key",)).to_arrow().column("key").to_pylist()}
    table = tables.load(DATASOURCE)
    if table is not None and table.current_snapshot() is not None:
        row_keys = set(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())
    out = []
    if dead_keys & fixable:
        out.append(f"after a replay of the fixed spec, {len(dead_keys & fixable)} fixable record(s) are still "
                   f"dead letters, e.g. {sorted(dead_keys & fixable)[:3]}")
    if row_keys & unfixable:
        out.append(f"{len(row_keys & unfixable)} record(s) no spec parses are rows: {sorted(row_keys & unfixable)[:3]}")
    return out


# --------------------------------------------------------------------------- named schedules

_WORLD = dict(partitions=1, records=30, bad_every=3)  # past the 2 set-up batches: 1 fixable, 1 not


def _ingested(fixed: bool, steps: int = 2) -> Callable[[World], None]:
    """Set-up: ``steps`` batches (with dead letters) ingested, the spec fixed or not yet."""

    def setup(world: World) -> None:
        proc = world.process("setup")
        world.lead(proc)
        world.step(proc, MAIN, steps)
        proc.runtimes.clear()
        if fixed:
            fix_spec(world)

    return setup


def _back(world: World, tables: Tables, store) -> list[str]:
    out = [] if "replayed" in world.reached else [f"no replay committed: {world.notes[-3:]}"]
    return out + placed(world, tables)


def _named(name: str, seed: int) -> Schedule:
    from tests.explorer.schedules import Schedule  # it imports this module: at call time

    s = Schedule(name, seed)
    s.world = dict(_WORLD)
    s.setup = _ingested(True)
    s.actors = [("replay", "cli-replay", replayer(1, 0))]
    s.expect = _back
    return s


def two_replays() -> Schedule:
    """Two replays at once, both planned on one version of the dead letters: the second to
    commit must plan again and find them gone, never append them twice."""
    s = _named("two-replays", 43)
    s.actors.append(("replay2", "cli-replay-2", replayer(1, 0)))
    s.script = [("replay", "replay-commit"), ("replay2", END), ("replay", END)]
    return s


def replay_killed() -> Schedule:
    """Three replays of the same letters, one after the other, each killed: once its files
    are written (before anything is staged), at its COMMIT (staged, not committed), right
    after its COMMIT (before it marks its staging committed or tidies up: done). Then the
    operator's fourth finds nothing to do; recovery fences and deletes the first two's files."""
    s = _named("replay-killed", 44)
    s.actors = [(f"replay{i}", f"cli-replay-{i}", replayer(1, 0)) for i in (1, 2, 3)]
    s.actors.append(("again", "cli-replay-again", replayer(1, 0)))
    s.script = [("replay1", END), ("replay2", END), ("replay3", END), ("again", END)]
    s.plan = FaultPlan(forced={("replay1", "replay-written", 0): "kill"},
                       armed={("replay2", "replay-commit"): ("commit-before", "kill"),
                              ("replay3", "replay-commit"): ("commit-after", "kill")})
    s.expect = lambda w, tables, store: placed(w, tables) + ([] if len(w.sched.faults) == 3 else
                                                             [f"not every kill struck: {w.sched.faults}"])
    return s


def replay_then_publish() -> Schedule:
    """A batch written under the old spec (its dead letters fixable) waits at its COMMIT;
    the spec is fixed and a replay commits; the batch's publish meets a moved dead-letter
    table and must stage again on it, its letters appended, not lost."""
    from tests.explorer.schedules import Schedule, _op, _plain, _seq

    s = Schedule("replay-then-publish", 48)
    s.world = dict(_WORLD)
    s.setup = _ingested(False)
    # The set-up's daemon goes on (a new leader's recovery would fence the replay: below).
    s.actors = [("main", "setup", _seq(_op("step", MAIN, 1))), ("fixer", "editor", _plain(fix_spec)),
                ("replay", "cli-replay", replayer(1, 0))]
    s.script = [("main", "before-commit"), ("fixer", END), ("replay", END), ("main", END)]
    s.expect = lambda w, tables, store: [] if "replayed" in w.reached else [f"no replay committed: {w.notes[-3:]}"]
    return s


def publish_during_replay() -> Schedule:
    """A replay staged at its COMMIT while a batch publishes new dead letters: the replay's
    compare-and-swap fails, it plans again with the new letters and commits once."""
    s = replay_then_publish()
    s.name, s.seed = "publish-during-replay", 49
    s.script = [("fixer", END), ("replay", "replay-commit"), ("main", END), ("replay", END)]
    s.expect = _back
    return s


def replay_fenced_by_recovery() -> Schedule:
    """A replay staged at its COMMIT when a daemon starts (its recovery fences the replay's
    write and deletes its files) and a batch publishes: the replay plans again and must end
    with a message an operator can act on, not fail on its own deleted files."""
    from tests.explorer.schedules import _ingest

    s = publish_during_replay()
    s.name, s.seed = "replay-fenced-by-recovery", 50
    s.actors[0] = ("main", "daemon", _ingest(1))
    s.expect = lambda w, tables, store: [f"the fenced replay failed: {n}" for n in w.notes if "Error" in n]
    return s


NAMED = (two_replays, replay_killed, replay_then_publish, publish_during_replay, replay_fenced_by_recovery)

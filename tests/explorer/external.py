"""The external-catalog path in the explorer (issue 44): the same worlds with their tables in
pyiceberg's ``GlueCatalog`` on moto (devservices/glue.py: ``UpdateTable`` refuses a stale
``VersionId`` as AWS does), the table committed first and the database following it
(``runtime.publish_external``, ``table/catalogs/fence.py``).

Why Glue on moto and not pyiceberg's SQL catalog in a file of its own: the product opens the
catalog by its setting (``open_tables``), so a Glue setting runs exactly the code a deployment
runs, Glue's optimistic ``VersionId`` check included; one moto server per explorer session
(the parent process's) serves every worker, each in a Glue database of its own, and a
schedule starts from the set-up tables by registering their metadata again (a few
milliseconds), so a schedule costs about what an SQL one does plus the catalog's round trips.

Faults of this path, on top of the random plan's: a kill between the table's commit and the
database's (``between-commits``), around a reset's fence (after its fence commit, before the
roll-forward and the reset's transaction; after the roll-forward, ``after-fence``), a
deposed leader's batch after a takeover, and the catalog's reply lost after (or before) a
commit (``catalog-lost-after`` / ``-before`` at ``external-commit``: the outcome unknown to
the caller, ``CatalogUnreachable``). Operations the product refuses on an external catalog
(expiry, orphan clean-up, tags, replay) are not drawn.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from reconciler.table.catalog import Tables, deadletter_table
from tests.explorer.model import DEAD_SCHEMA, ROW_SCHEMA
from tests.explorer.world import DATASOURCE, World

LOST = ("catalog-lost-after", "catalog-lost-before")


class GlueNamespace:
    """One Glue database on the session's moto server, for one runner's schedules."""

    def __init__(self, properties: dict[str, str]):
        from pyiceberg.catalog import load_catalog

        self.properties = dict(properties)
        self.namespace = f"explorer_{uuid.uuid4().hex[:12]}"
        self.catalog = load_catalog("explorer", **{"type": "glue", **self.properties})
        self.catalog.create_namespace(self.namespace)

    def setting(self) -> dict:
        return {"type": "glue", "namespace": self.namespace, "properties": dict(self.properties)}

    def restore(self, registered: dict[str, str]) -> None:
        """The tables as set up: those of the last schedule dropped (their files went with its
        directory), the set-up ones registered again at their metadata files, copied back."""
        for ident in self.catalog.list_tables(self.namespace):
            self.catalog.drop_table(ident)
        for name, location in registered.items():
            self.catalog.register_table((self.namespace, name), location)


def setup(root: Path, store, glue: GlueNamespace, *, rollup: bool, warehouse_name: str,
          tables: bool) -> dict[str, str]:
    """``World.setup`` with the tables in Glue; their metadata files, to register again."""
    from reconciler.table.catalogs.external import ExternalTables

    glue.restore({})
    World.setup(root, store, rollup=rollup, warehouse_name=warehouse_name, tables=False)
    if not tables:
        return {}
    ext = ExternalTables(store.engine, Path(root) / warehouse_name, glue.setting())
    ext.ensure(DATASOURCE, ROW_SCHEMA, "hour", rollup=rollup)
    ext.ensure(deadletter_table(DATASOURCE), DEAD_SCHEMA, None)
    return {n: ext.load(n).metadata_location for n in (DATASOURCE, deadletter_table(DATASOURCE))}


def tables_of(world: World, store):
    """The tables as a reader of the world's catalog sees them (the checks' view)."""
    if world.catalog is None:
        return Tables(store.engine, world.warehouse)
    from reconciler.table.catalogs.external import ExternalTables

    return ExternalTables(store.engine, world.warehouse, world.catalog, snapshots_kept=world.snapshots_kept,
                          reader_grace=world.reader_grace)


class _Seen:
    """The runtime's metrics, only to see a batch the fence refused (``publish_conflict``)."""

    def __init__(self, world: World):
        self._world = world

    def publish_conflict(self, supervisor_id: str) -> None:
        self._world.reached.add("fence-refused-batch")

    def __getattr__(self, name):
        return lambda *a, **k: None


class ExternalWorld(World):
    """A world whose tables are in the lake's catalog (``catalog`` setting of type glue)."""

    def __init__(self, root: Path, db_url: str, *, catalog: dict, **kw):
        super().__init__(root, db_url, **kw)
        self.catalog = catalog
        self.reset_unfinished = False  # a reset killed after it may have fenced: the operator runs it again
        self.orphans_refused = False
        self.cancel_unfinished = False  # a cancel killed after its fence: the operator runs it again

    def process(self, name: str):
        fresh = name not in self.processes
        proc = super().process(name)
        if fresh:
            proc.ctx.metrics = _Seen(self)
            _lose_replies(self, proc.ctx.tables())
        return proc

    def reset(self, proc, backfill: bool = True) -> None:
        self.reset_unfinished, notes = True, len(self.notes)
        super().reset(proc, backfill)
        self.reset_unfinished = len(self.notes) > notes  # "reset failed: ..."

    def cancel(self, proc) -> None:
        self.cancel_unfinished = True
        super().cancel(proc)
        self.cancel_unfinished = False

    def orphans(self, proc, now=None) -> None:
        """Orphan clean-up where the product runs it on an external catalog; where it refuses
        (naming the setting), what a clean-up would take is left, and not judged as garbage."""
        from reconciler.errors import PermanentError

        try:
            super().orphans(proc, now)
        except PermanentError:
            self.orphans_refused = True

    def deposed_commits(self) -> list[str]:
        """A deposed leader's batch may land in the table (on top of the supervisor's last
        commit: the fence tag had not moved) and be rolled forward (RELIABILITY.md, "External
        catalogs"): counted, and judged by the invariants (no range twice, none skipped,
        every referenced file present), not refused as with sql."""
        if super().deposed_commits():
            self.reached.add("zombie-batch-landed")
        return []

    def heal(self, rounds: int = 60) -> list[str]:
        if self.reset_unfinished:  # RELIABILITY.md: a CLI reset that crashed after its fence is run again
            proc = self.process(f"operator-{uuid.uuid4().hex[:6]}")
            self.lead(proc)
            self.reset(proc)
            self.reached.add("reset-run-again")
            proc.runtimes.clear()
        if self.cancel_unfinished:  # its fence holds the backfill until the cancel's transaction ends it
            proc = self.process(f"operator-{uuid.uuid4().hex[:6]}")
            self.cancel(proc)
            self.reached.add("cancel-run-again")
        return super().heal(rounds)


def _lose_replies(world: World, tables) -> None:
    """The catalog's reply lost (``catalog-lost-after``: the commit applied) or the request
    (``-before``: not applied) where the schedule's plan struck ``external-commit``: what a
    dropped connection to Glue does. The caller sees the catalog unreachable."""
    catalog = getattr(tables, "catalog", None)
    if catalog is None or getattr(catalog, "_explorer_wrapped", False):
        return
    real = catalog.commit_table

    def commit_table(table, requirements, updates):
        fault = _struck(world)
        if fault == "catalog-lost-before":
            raise ConnectionError("connection to the catalog lost before the request (injected)")
        response = real(table, requirements, updates)
        if fault == "catalog-lost-after":
            world.reached.add("catalog-reply-lost")
            raise ConnectionError("connection to the catalog lost after the request (injected)")
        return response

    catalog.commit_table = commit_table
    catalog._explorer_wrapped = True


def _struck(world: World) -> str | None:
    """The lost-connection fault the plan put on this actor's last ``external-commit``."""
    sched = world.sched
    actor = sched._by_thread.get(threading.get_ident()) if sched is not None else None
    if actor is None:
        return None
    for entry in reversed(sched.trace):
        if entry.startswith(f"{actor.name}@"):
            point, _, fault = entry.partition("@")[2].partition("!")
            return fault if point == "external-commit" and fault in LOST else None
    return None


# --------------------------------------------------------------------------- schedules


def random_schedule(seed: int):
    """A random schedule of the external-catalog path: ingestion, resets with backfills, a
    compaction, a cancel, a standby's takeover, a producer and retention, under the random
    fault plan and, in most, one fault placed on this path's own points."""
    import random

    from tests.explorer.sched import FaultPlan
    from tests.explorer.schedules import Schedule, _op, _plain, _seq, _wait
    from tests.explorer.world import MAIN

    rng = random.Random(seed * 7 + 44)
    s = Schedule("random", seed)
    s.world = dict(catalog="glue", partitions=rng.choice([1, 2, 2]), records=rng.choice([18, 30]),
                   marker_every=rng.choice([0, 0, 7]), bad_every=rng.choice([0, 0, 9]), tables=rng.random() < 0.8,
                   snapshots_kept=rng.choice([1, 3, 25, 25]), under_report=rng.choice([0, 0, 4]),
                   reader_grace=rng.choice([0.0, 600.0]))
    s.actors.append(("main", "daemon", _seq(_op("lead"), *[_op("step", MAIN, 1) for _ in range(rng.randint(3, 8))])))
    if rng.random() < 0.7:
        s.actors.append(("reset", "cli-reset", _seq(*[_op("reset") for _ in range(rng.choice([1, 1, 2]))])))
        s.actors.append(("backfills", "daemon", _seq(*[_op("step_backfills", 1) for _ in range(rng.randint(1, 4))])))
        if rng.random() < 0.3:
            s.actors.append(("cancel", "cli-cancel", _seq(_wait("backfill-in-flight", rng.randint(20, 120)),
                                                          _op("cancel"))))
    if rng.random() < 0.4:
        s.actors.append(("compact", "cli-compact", _seq(_wait("compact", rng.randint(5, 60)), _op("compact"))))
    if rng.random() < 0.4:
        s.actors.append(("takeover", "daemon2", _seq(_op("take_over", rng.randint(3, 60),
                                                         rng.choice([0, 2, 5, -1, -1, None]), rng.randint(1, 3)))))
    if rng.random() < 0.3:
        s.actors.append(("producer", "producer", _plain(lambda w: w.produce(7))))
    if rng.random() < 0.1:
        s.actors.append(("retention", "broker", _plain(lambda w: w.retain("0", 5))))
    quiet = rng.random() < 0.25
    s.plan = FaultPlan() if quiet else FaultPlan(kill=0.012, power=0.004, drop=0.03, limbo=0.03, enospc=0.02)
    _place_fault(s, rng)
    return s


def _place_fault(s, rng) -> None:
    """One fault on this path's own points (the plan's rates strike them rarely)."""
    actors = {a[0] for a in s.actors}
    choices = [("main", "between-commits", "kill"), ("main", "between-commits", "power"),
               ("main", "external-commit", "catalog-lost-after"), ("main", "external-commit", "catalog-lost-before")]
    if "reset" in actors:
        choices += [("reset", "after-fence", "kill"), ("reset", "fence-then-db", "kill"),
                    ("backfills", "between-commits", "kill"), ("backfills", "external-commit", "catalog-lost-after")]
    if rng.random() < 0.25:
        return
    actor, point, fault = rng.choice(choices)
    if point == "fence-then-db":  # after the fence's commit, at the next database commit (roll-forward or the reset's)
        s.plan.armed[(actor, "external-commit")] = ("commit-before", fault)
    else:
        s.plan.forced[(actor, point, rng.choice([0, 0, 1, 2]))] = fault


def _verify_right_between_commits(world: World, tables, store) -> list[str]:
    """``reconciler verify`` between the two commits (the table holds a batch the database
    does not yet: the next step or leader rolls it forward) must not call the table broken."""
    from tests.explorer.check import run_verify, truth

    report = run_verify(world, tables, store, deep=False)
    if report is None or report.ok or not truth(world, tables, store, final=False).ok:
        return []
    return [f"verify between the two commits says FAILED while the table is right (the next step rolls the "
            f"batch forward): {[f.to_dict() for f in report.findings if f.fails][:2]}"]


def named() -> tuple:
    """The interleavings of the external path worth replaying every run."""
    from tests.explorer.sched import FaultPlan
    from tests.explorer.schedules import END, Schedule, _ingest, _op, _seq
    from tests.explorer.world import MAIN

    def glue(name: str, seed: int) -> Schedule:
        s = Schedule(name, seed)
        s.world = dict(catalog="glue")
        return s

    def crash_between_commits() -> Schedule:
        """The daemon killed between the table's commit and the database's: the next leader
        rolls the batch forward (never read again, never lost)."""
        s = glue("glue-crash-between-commits", 41)
        s.actors = [("main", "daemon", _ingest(4))]
        s.plan = FaultPlan(forced={("main", "between-commits", 1): "kill"})
        s.expect = _verify_right_between_commits
        return s

    def reset_fences_batch_in_flight() -> Schedule:
        """A reset fences the table while a main batch is written, not committed: the batch's
        commit fails, the backfill takes its range."""
        s = glue("glue-reset-fences-batch-in-flight", 42)
        s.actors = [("main", "daemon", _ingest(4)), ("reset", "cli-reset", _seq(_op("reset"))),
                    ("backfills", "daemon", _seq(*[_op("step_backfills", 1) for _ in range(3)]))]
        s.script = [("main", "external-commit"), ("reset", END), ("main", END), ("backfills", END)]
        s.expect = lambda w, tables, store: ([] if "fence-refused-batch" in w.reached else
                                             [f"the batch in flight was not refused by the fence: {w.notes}"])
        return s

    def reset_killed_after_fence() -> Schedule:
        """A reset killed after its fence and roll-forward, before it captured offsets and
        bumped the epoch: the main supervisor waits; the operator runs the reset again."""
        s = glue("glue-reset-killed-after-fence", 43)
        s.actors = [("main", "daemon", _ingest(3)), ("reset", "cli-reset", _seq(_op("reset"))),
                    ("more", "daemon", _seq(_op("step", MAIN, 2)))]
        s.script = [("main", END), ("reset", END), ("more", END)]
        s.plan = FaultPlan(forced={("reset", "after-fence", 0): "kill"})
        return s

    def reset_killed_before_roll_forward() -> Schedule:
        """A batch in the table not yet in the database (its daemon killed between the
        commits), then a reset killed right after its fence, at the roll-forward's commit."""
        s = glue("glue-reset-killed-before-roll-forward", 44)
        s.actors = [("main", "daemon", _ingest(3)), ("reset", "cli-reset", _seq(_op("reset")))]
        s.script = [("main", END), ("reset", END)]
        s.plan = FaultPlan(forced={("main", "between-commits", 1): "kill"},
                           armed={("reset", "external-commit"): ("commit-before", "kill")})
        return s

    def zombie_after_takeover() -> Schedule:
        """The leader pauses past its lease with a batch written; a standby takes over (its
        recovery fences the write) and ingests; then the deposed leader's batch commits."""
        s = glue("glue-zombie-after-takeover", 45)
        s.actors = [("main", "daemon", _ingest(3)), ("takeover", "daemon2", _seq(_op("take_over", 3, 0, 2)))]
        s.script = [("main", "external-commit"), ("takeover", END), ("main", END)]
        return s

    def zombie_before_new_leader_commits() -> Schedule:
        """The same, the new leader committing nothing before the deposed one's batch: the
        fence tag has not moved, so the batch may land (on top of the last commit)."""
        s = glue("glue-zombie-before-new-leader-commits", 46)
        s.actors = [("main", "daemon", _ingest(3)), ("takeover", "daemon2", _seq(_op("take_over", 3, 0, 0)))]
        s.script = [("main", "external-commit"), ("takeover", END), ("main", END)]
        return s

    def reply_lost_then_reset() -> Schedule:
        """The catalog applied a batch's commit and the reply was lost (outcome unknown to
        the daemon); a reset comes before the next step: its roll-forward records the batch."""
        s = glue("glue-reply-lost-then-reset", 47)
        s.actors = [("main", "daemon", _ingest(3)), ("reset", "cli-reset", _seq(_op("reset"))),
                    ("backfills", "daemon", _seq(*[_op("step_backfills", 1) for _ in range(3)]))]
        s.script = [("main", END), ("reset", END), ("backfills", END)]
        s.plan = FaultPlan(forced={("main", "external-commit", 1): "catalog-lost-after"})
        return s

    def backfill_and_main_conflict() -> Schedule:
        """A backfill's commit and the main supervisor's race for the same table (Glue's
        VersionId refuses the second): it stages again with its own fence kept."""
        s = glue("glue-backfill-and-main-conflict", 48)
        s.actors = [("main", "daemon", _ingest(2)), ("reset", "cli-reset", _seq(_op("reset"))),
                    ("more", "daemon", _seq(_op("step", MAIN, 3))),
                    ("backfills", "daemon", _seq(*[_op("step_backfills", 1) for _ in range(3)]))]
        s.script = [("main", END), ("reset", END), ("backfills", "external-commit"), ("more", "external-commit"),
                    ("backfills", END), ("more", END)]
        return s

    def cancel_backfill_in_flight() -> Schedule:
        """``backfill cancel`` while the backfill's batch is about to commit to the table: the
        range the cancel records as unread must not reach the table afterwards."""
        from tests.explorer.schedules import _behind_with_backfill

        s = glue("glue-cancel-backfill-in-flight", 49)
        s.setup = _behind_with_backfill
        s.actors = [("backfill", "daemon", _seq(_op("step_backfills", 1))), ("cancel", "cli-cancel", _seq(_op("cancel")))]
        s.script = [("backfill", "external-commit"), ("cancel", END), ("backfill", END)]
        return s

    def reset_before_first_batch() -> Schedule:
        """A reset of a datasource whose table the first batch has yet to create: its fence
        finds no table; the first batch creates it and commits to it; then the reset's
        transaction. The batch's range and the backfill's must not overlap."""
        s = glue("glue-reset-before-first-batch", 50)
        s.world = dict(catalog="glue", tables=False)
        s.actors = [("main", "daemon", _ingest(3)), ("reset", "cli-reset", _seq(_op("reset"))),
                    ("backfills", "daemon", _seq(*[_op("step_backfills", 1) for _ in range(3)]))]
        s.script = [("reset", "reset-captured"), ("main", "between-commits"), ("reset", END), ("main", END),
                    ("backfills", END)]
        return s

    def reset_fences_during_takeover() -> Schedule:
        """A new leader's recovery stages its fence (no reset pending yet); a reset fences the
        table and parks before its capture; recovery's fence then lands on top of the reset's
        (explorer seed 1006). It must keep the reset's epoch: recorded with the supervisor's
        old one it let the new leader's batch read checkpoints before the reset's capture and
        land after it, the backfill reading the same range again (12 records twice)."""
        s = glue("glue-reset-fences-during-takeover", 51)
        s.actors = [("main", "daemon", _ingest(3)), ("takeover", "daemon2", _seq(_op("take_over", 3, 0, 2))),
                    ("reset", "cli-reset", _seq(_op("reset"))),
                    ("backfills", "daemon", _seq(*[_op("step_backfills", 1) for _ in range(3)]))]
        s.script = [("main", "external-commit"), ("takeover", "external-commit"), ("reset", "after-fence"),
                    ("takeover", "before-commit"), ("reset", END), ("takeover", END), ("main", END),
                    ("backfills", END)]
        return s

    def reset_killed_at_fence_commit() -> Schedule:
        """A reset killed with its fence recorded as committing and its manifest list written,
        before the catalog's commit (explorer seed 1013); the operator runs it again, its new
        fence moves ``main``. Orphan clean-up then deletes the first fence's manifest list (its
        commit asserted a ``main`` that is gone), which the committing row kept for ever."""
        s = glue("glue-reset-killed-at-fence-commit", 52)
        s.actors = [("main", "daemon", _ingest(2)), ("reset", "cli-reset", _seq(_op("reset")))]
        s.script = [("main", END), ("reset", END)]
        s.plan = FaultPlan(forced={("reset", "external-commit", 0): "kill"})
        return s

    def compaction_unknown(fault: str, seed: int, lands: bool) -> Callable[[], Schedule]:
        """A compaction whose ``committing`` row's transaction ends unknown (explorer seed
        1373336393). Its catalog commit comes after that row: when the row landed, the
        compaction must go on to commit the catalog, not call itself committed with its files
        referenced by nothing (left for ever, the row saying committing); when it did not, it
        is fenced and its files go."""

        def schedule() -> Schedule:
            s = glue(f"glue-compaction-row-{fault}", seed)
            s.actors = [("main", "daemon", _ingest(3)), ("compact", "cli-compact", _seq(_op("compact"))),
                        ("more", "daemon", _seq(_op("step", MAIN, 1)))]
            s.script = [("main", END), ("compact", END), ("more", END)]
            s.plan = FaultPlan(armed={("compact", "compact-commit"): ("commit-after" if fault == "drop-after"
                                                                      else "commit-before", fault)})
            s.expect = lambda w, tables, store: _compaction_landed(w, tables, lands)
            return s

        schedule.__name__ = f"compaction_row_{fault.replace('-', '_')}"
        return schedule

    return (crash_between_commits, reset_fences_batch_in_flight, reset_killed_after_fence,
            reset_killed_before_roll_forward, zombie_after_takeover, zombie_before_new_leader_commits,
            reply_lost_then_reset, backfill_and_main_conflict, cancel_backfill_in_flight, reset_before_first_batch,
            reset_fences_during_takeover, reset_killed_at_fence_commit,
            compaction_unknown("drop-after", 53, True), compaction_unknown("drop-before", 54, False),
            compaction_unknown("limbo-commit", 55, True), compaction_unknown("limbo-abort", 56, False))


def _compaction_landed(world: World, tables, lands: bool) -> list[str]:
    """The compaction committed exactly when its row did, and then the catalog holds its files."""
    table = tables.load(DATASOURCE)
    merged = [f for f in (_data_files(table) if table is not None else []) if "/data/compacted/" in f]
    if lands and ("compacted" not in world.reached or not merged):
        return [f"the compaction's row committed, but the catalog holds no compacted file ({world.notes})"]
    if not lands and ("compacted" in world.reached or merged):
        return [f"the compaction's row did not commit, but it reported or left a commit ({world.notes})"]
    return []


def _data_files(table) -> list[str]:
    return [task.file.file_path for task in table.scan().plan_files()]

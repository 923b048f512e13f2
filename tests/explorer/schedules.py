"""Schedules: random ones drawn from a seed, and named ones that replay the interleavings
reviews found (each defect of issue 28 is one).

A schedule is a world (partitions, records, markers, dead letters, rollup), a set of
actors (each a process's thread doing product operations), a fault plan and optionally a
script (whose actor runs until which point) and a sabotage. ``run`` executes it and
returns the problems the invariants found (empty: it passed).
"""

from __future__ import annotations

import random
import shutil
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from reconciler.model import SupervisorSpec
from reconciler.store.store import Store
from reconciler.table.catalog import Tables, deadletter_table, local_path
from tests.explorer import check, external
from tests.explorer.disk import Ledger, install, uninstall
from tests.explorer.sched import FaultPlan, Hang, Scheduler, installed
from tests.explorer.world import DATASOURCE, MAIN, World

SABOTAGES = ("delete-file", "rollback-pointer", "foreign-append")


@dataclass
class Schedule:
    name: str
    seed: int
    world: dict = field(default_factory=dict)
    actors: list[tuple[str, str, Callable[[World], Callable[[], None]]]] = field(default_factory=list)
    plan: FaultPlan = field(default_factory=FaultPlan)
    script: list[tuple[str, str | None]] = field(default_factory=list)
    sabotage: str | None = None
    setup: Callable[[World], None] | None = None
    expect: Callable[[World, Tables, Store], list[str]] | None = None  # extra checks of a named schedule
    heal: bool = True
    hang: float = 30.0  # seconds an actor may run between two points


@dataclass
class Result:
    name: str
    seed: int
    db: str
    problems: list[str]
    faults: list[str]
    outcomes: dict[str, str]
    seconds: float
    trace: list[str] = field(default_factory=list)
    reached: list[str] = field(default_factory=list)  # coverage: what the schedule got to do

    @property
    def ok(self) -> bool:
        return not self.problems


# --------------------------------------------------------------------------- random schedules


def _op(fn_name: str, *args, **kw) -> Callable[[World], Callable[[], None]]:
    """An actor's body: the world's operation ``fn_name`` in its process."""

    def bind(world: World, process: str) -> Callable[[], None]:
        proc = world.process(process)
        return lambda: getattr(world, fn_name)(proc, *args, **kw)

    return bind


def _seq(*steps: Callable) -> Callable:
    def bind(world: World, process: str) -> Callable[[], None]:
        bodies = [s(world, process) for s in steps]

        def run():
            for body in bodies:
                try:
                    body()
                except Exception as exc:  # noqa: BLE001 - one failed operation; the process goes on
                    world.notes.append(f"{process}: {type(exc).__name__}: {exc}"[:300])
        return run

    return bind


def _wait(what: str, turns: int, more: int = 0) -> Callable:
    """Wait (up to ``turns`` switches) until ``what`` has work: ``more`` snapshots beyond its need."""
    return _op("wait_for", what, turns, more)


def _plain(fn: Callable[[World], None]) -> Callable:
    def bind(world: World, process: str) -> Callable[[], None]:
        return lambda: fn(world)

    return bind


def random_schedule(seed: int) -> Schedule:
    rng = random.Random(seed)
    s = Schedule("random", seed)
    s.world = dict(partitions=rng.choice([1, 2, 2]), records=rng.choice([18, 30]),
                   marker_every=rng.choice([0, 0, 7]), bad_every=rng.choice([0, 0, 9]),
                   tables=rng.random() < 0.8,  # else the first batch creates them, under the faults
                   snapshots_kept=rng.choice([1, 3, 25, 25]),  # small: publishes expire as they commit
                   under_report=rng.choice([0, 0, 4]),
                   reader_grace=rng.choice([0.0, 600.0]))  # 600: every logged version's snapshots kept  # the broker's end a few offsets short
    main_steps = rng.randint(3, 8)
    s.actors.append(("main", "daemon", _seq(_op("lead"), *[_op("step", MAIN, 1) for _ in range(main_steps)])))
    if rng.random() < 0.6:
        s.actors.append(("reset", "cli-reset", _seq(_op("reset"))))
        s.actors.append(("backfills", "daemon", _seq(*[_op("step_backfills", 1) for _ in range(rng.randint(1, 4))])))
    # Maintenance waits until there is work (or is scheduled later), as an operator's cron
    # would meet it: a compaction, an expiry, a cancel that finds nothing to do tests nothing.
    if rng.random() < 0.5:
        s.actors.append(("compact", "cli-compact", _seq(_wait("compact", rng.randint(5, 60)),
                                                        *[_op("compact") for _ in range(rng.randint(1, 2))])))
    if rng.random() < 0.6:
        retain = rng.choice([1, 1, 1, 2, 3])
        s.actors.append(("maintain", "cli-maintain", _seq(
            _wait("expire", rng.randint(20, 120), more=retain),
            _op("expire", retain_last=retain, keep_back=rng.choice([None, None, None, 2])),
            _op("orphans"))))
    if rng.random() < 0.3:
        s.actors.append(("tagger", "cli-iceberg", _seq(_wait("expire", rng.randint(1, 30)), *[
            _op("tag", f"ref{i}", branch=rng.random() < 0.4, back=rng.randint(0, 2)) for i in range(rng.randint(1, 2))])))
    if len(s.actors) > 1 and s.actors[1][0] == "reset" and rng.random() < 0.6:  # a backfill to cancel
        s.actors.append(("cancel", "cli-cancel", _seq(_wait("backfill-in-flight", rng.randint(20, 120)),
                                                      _op("cancel"))))
    if rng.random() < 0.3:  # a standby's leadership loop; the leader's lease lapses at some turn
        # (-1: while a write is in flight, -2: a compaction's), or never
        s.actors.append(("takeover", "daemon2", _seq(_op("take_over", rng.randint(3, 60),
                                                         rng.choice([0, 2, 5, -1, -2, -2, None]), rng.randint(1, 3)))))
    if rng.random() < 0.3:
        s.actors.append(("producer", "producer", _plain(lambda w: w.produce(7))))
    if rng.random() < 0.1:
        s.actors.append(("retention", "broker", _plain(lambda w: w.retain("0", 5))))
    quiet = rng.random() < 0.25
    s.plan = FaultPlan() if quiet else FaultPlan(kill=0.012, power=0.004, drop=0.03, limbo=0.03, enospc=0.02)
    if rng.random() < 0.25:
        s.sabotage = rng.choice(SABOTAGES)
    from tests.explorer import moments  # its own generator: the draws above stay as they were

    moments.bias(s)
    from tests.explorer import replay  # drawn last: the other draws of a seed stay as they were

    replay.add_random(s, rng)
    from tests.explorer import rolling  # drawn after replay's: a seed's earlier draws stay as they were

    rolling.add_random(s, rng)
    return s


# --------------------------------------------------------------------------- running


@dataclass(frozen=True)
class _Rows:
    """A PostgreSQL snapshot of the set-up world: its tables, and how to restore them."""

    names: frozenset[str]
    delete_order: list[sa.Table]  # children first
    inserts: list[tuple[sa.Table, list[dict]]]  # parents first
    sequences: str  # one SELECT of every setval


class Runner:
    """Runs schedules one after another in one directory and one database, each from a
    snapshot of the set-up world (the schema, the supervisor, the two tables): restored in
    milliseconds instead of built again. The paths stay the same (the tables' metadata
    holds them), so restoring is copying files back (and, on PostgreSQL, rows)."""

    def __init__(self, db_url: str, workdir: Path, db_name: str = "sqlite", glue: dict | None = None):
        self.db_url = db_url
        self.workdir = Path(workdir)
        self.db_name = db_name
        self.postgres = db_url.startswith("postgresql")
        self.store = Store(db_url)
        self._snapshots: dict[tuple, tuple[Path, _Rows | None, dict]] = {}
        self.glue = glue  # the moto server's catalog properties (external.py), for worlds with ``catalog``
        self._glue = None  # this runner's Glue database, made at its first external world

    def close(self) -> None:
        self.store.close()

    def fresh(self, rollup: bool, warehouse_name: str, tables: bool = True, catalog: str | None = None) -> None:
        key = (rollup, warehouse_name, tables, catalog)
        self.store.engine.dispose()
        if key not in self._snapshots:
            self._wipe()
            registered = {}
            if catalog is None:
                World.setup(self.workdir, self.store, rollup=rollup, warehouse_name=warehouse_name, tables=tables)
            else:
                registered = external.setup(self.workdir, self.store, self._glue_namespace(), rollup=rollup,
                                            warehouse_name=warehouse_name, tables=tables)
            self.store.engine.dispose()
            saved = self.workdir.with_name(f"{self.workdir.name}.template{len(self._snapshots)}")
            shutil.rmtree(saved, ignore_errors=True)
            shutil.copytree(self.workdir, saved)
            self._snapshots[key] = (saved, self._rows() if self.postgres else None, registered)
            return
        saved, rows, registered = self._snapshots[key]
        shutil.rmtree(self.workdir, ignore_errors=True)
        shutil.copytree(saved, self.workdir)
        if self.postgres:
            self._restore(rows)
        if catalog is not None:
            self._glue_namespace().restore(registered)

    def _glue_namespace(self) -> external.GlueNamespace:
        if self.glue is None:
            raise RuntimeError("an external-catalog schedule needs moto's Glue: the runner was given none "
                               "(python -m tests.explorer starts one; in pytest, the explorer_glue fixture)")
        if self._glue is None:
            self._glue = external.GlueNamespace(self.glue)
        return self._glue

    def _wipe(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(parents=True)
        if self.postgres:
            with self.store.engine.begin() as c:
                c.exec_driver_sql("DROP SCHEMA public CASCADE")
                c.exec_driver_sql("CREATE SCHEMA public")
            self.store.engine.dispose()

    def _rows(self) -> _Rows:
        """The set-up world's rows, and what restoring them needs, reflected once: the
        tables (to insert into, children before parents to delete from) and the sequences
        to put back. Restoring is then one transaction of a few statements: reflecting the
        schema again each time took about 300 ms a schedule, and TRUNCATE (new files for
        every table and index) four times what DELETE of a few rows costs."""
        with self.store.engine.connect() as c:
            meta = sa.MetaData()
            meta.reflect(c)
            rows = {t.name: [dict(r) for r in c.execute(sa.select(t)).mappings()] for t in meta.sorted_tables}
            sequences = []
            for table in meta.sorted_tables:
                if "id" not in table.c or not isinstance(table.c.id.type, sa.Integer):
                    continue
                seq = c.exec_driver_sql(f"SELECT pg_get_serial_sequence('\"{table.name}\"', 'id')").scalar()
                if seq is not None:  # as RESTART IDENTITY would leave it, then past the ids restored
                    top = max((r["id"] for r in rows[table.name]), default=None)
                    sequences.append(f"setval('{seq}', {top if top is not None else 1}, {top is not None})")
        return _Rows(frozenset(rows), [t for t in reversed(meta.sorted_tables)],
                     [(t, rows[t.name]) for t in meta.sorted_tables if rows[t.name]],
                     "SELECT " + ", ".join(sequences) if sequences else "")

    def _restore(self, rows: _Rows) -> None:
        with self.store.engine.begin() as c:
            present = {r[0] for r in c.exec_driver_sql(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}
            for extra in present - rows.names:  # a table made after the snapshot goes too
                c.exec_driver_sql(f'DROP TABLE "{extra}" CASCADE')
            for table in reversed(rows.delete_order):  # and one another world's set-up dropped comes back
                if table.name not in present:  # (the SQL catalog's tables, after an external world's)
                    table.create(c)
            for table in rows.delete_order:
                c.execute(table.delete())
            for table, data in rows.inserts:
                c.execute(table.insert(), data)
            if rows.sequences:
                c.exec_driver_sql(rows.sequences)

    def run(self, schedule: Schedule) -> Result:
        started = time.monotonic()
        problems: list[str] = []
        rng = random.Random(schedule.seed * 7919 + 13)
        world_args = dict(schedule.world)
        catalog = world_args.pop("catalog", None)
        self.fresh(world_args.get("rollup", False), world_args.get("warehouse_name", "segments"),
                   world_args.pop("tables", True), catalog)
        if catalog is None:
            world = World(self.workdir, self.db_url, store=self.store, **world_args)
        else:
            world = external.ExternalWorld(self.workdir, self.db_url, store=self.store,
                                           catalog=self._glue_namespace().setting(), **world_args)
        world.stream.lag_rng = random.Random(schedule.seed * 31 + 7)
        if schedule.setup is not None:
            schedule.setup(world)
        ledger = Ledger(world.warehouse)
        install(ledger)
        sched = Scheduler(rng, schedule.plan, hang=schedule.hang)
        sched.script = list(schedule.script)
        world.sched = sched
        sched.observe = lambda point, actor: world.recovering(actor.process) if point == "recover" else None
        try:
            for name, process, bind in schedule.actors:
                sched.spawn(name, process, bind(world, process))
            with installed(sched):
                try:
                    sched.run()
                except Hang as exc:
                    problems.append(f"hang: {exc}")
            if sched.power_cut and world.catalog is None:  # an external catalog's files: an object store's, durable once written
                world.notes.append(f"power cut: lost {ledger.power_cut()}")
            problems += world.deposed_commits()
            world.close()
            problems += world.violations
            tables = external.tables_of(world, self.store)
            problems += check.check_now(world, tables, self.store)
            if schedule.expect is not None:
                problems += schedule.expect(world, tables, self.store)
            if schedule.heal and not problems:
                problems += world.heal()
                tables = external.tables_of(world, self.store)
                problems += check.check_final(world, tables, self.store)
                if schedule.sabotage and not problems:
                    _sabotage(schedule.sabotage, world, tables, self.store, rng)
                    tables = external.tables_of(world, self.store)
                    problems += check.check_verdict(world, tables, self.store, schedule.sabotage)
        except Exception:  # noqa: BLE001 - the explorer's own failure is a finding too
            problems.append("explorer error: " + traceback.format_exc(limit=8)[-1500:])
        finally:
            uninstall(ledger)
            world.close()
        outcomes = {a.name: a.outcome for a in sched.actors.values()}
        return Result(schedule.name, schedule.seed, self.db_name, problems, sched.faults, outcomes,
                      time.monotonic() - started, sched.trace + [f"note: {n}" for n in world.notes],
                      sorted(world.reached | _reached(sched.trace)))


def _reached(trace: list[str]) -> set[str]:
    """Coverage read from the trace: a batch committed after a fault struck (a kill, a
    dropped connection...), and a batch committed at all."""
    out, faulted = set(), False
    for entry in trace:
        if "!" in entry:
            faulted = True
        elif entry.endswith("@after-commit"):
            out.add("committed")
            if faulted:
                out.add("committed-under-faults")
    return out


def _sabotage(kind: str, world: World, tables: Tables, store: Store, rng: random.Random) -> None:
    table = tables.load(DATASOURCE)
    if table is None or table.current_snapshot() is None:
        return
    files = sorted(t.file.file_path for t in table.scan().plan_files())
    if kind == "delete-file" and files:
        local_path(rng.choice(files)).unlink()
    elif kind == "rollback-pointer":  # the catalog's pointers restored from before their last commits
        for name in (DATASOURCE, deadletter_table(DATASOURCE)):
            t = tables.load(name)
            older = [e.metadata_file for e in (t.metadata.metadata_log if t else ())
                     if local_path(e.metadata_file).exists()]
            if older:
                with store.engine.begin() as c:
                    c.execute(sa.text("UPDATE iceberg_tables SET metadata_location = :m WHERE table_name = :t"),
                              {"m": older[-1], "t": name})
    elif kind == "foreign-append" and files:
        from reconciler.table.writeids import new_write_id

        wid = new_write_id()
        store.begin_write(wid, "batch", tables=[DATASOURCE])
        commit = tables.stage_append(DATASOURCE, [rng.choice(files)], {"reconciler.operation": "foreign"},
                                     write_id=wid)
        store.commit_tables(wid, "foreign", [commit])



# --------------------------------------------------------------------------- named schedules
#
# Each replays an interleaving a review found (issue 28), or a fault at an exact place.
# ``until=""`` in a script: run the actor to its end.

END = ""


def _ingest(steps: int = 6) -> Callable:
    return _seq(_op("lead"), *[_op("step", MAIN, 1) for _ in range(steps)])


def orphans_during_publish() -> Schedule:
    """Defect 1: orphan clean-up ran while a batch was written but not yet published."""
    s = Schedule("orphans-during-publish", 1)
    s.actors = [("main", "daemon", _seq(_op("lead"), _op("step", MAIN, 1))),
                ("maintain", "cli-maintain", _seq(_op("orphans")))]
    s.script = [("main", "before-commit"), ("maintain", END), ("main", END)]
    return s


def orphans_during_compaction() -> Schedule:
    """Defect 1, compaction: its output, written and not yet committed, met an orphan clean-up."""
    s = Schedule("orphans-during-compaction", 2)
    s.actors = [("main", "daemon", _ingest(6)), ("compact", "cli-compact", _seq(_op("compact"))),
                ("maintain", "cli-maintain", _seq(_op("orphans")))]
    s.script = [("main", END), ("compact", "compact-commit"), ("maintain", END), ("compact", END)]
    return s


def ambiguous_commit() -> Schedule:
    """Defect 2: the connection dropped after COMMIT was sent; the server commits a moment
    after the daemon was told the outcome is unknown."""
    s = Schedule("ambiguous-commit", 3)
    s.actors = [("main", "daemon", _seq(_op("lead"), _op("step", MAIN, 1)))]
    s.plan = FaultPlan(armed={("main", "before-commit"): ("commit-before", "limbo-commit")})
    return s


def power_cut_after_commit() -> Schedule:
    """Defect 3: a power cut right after the publish committed, the table created by that
    first batch: everything the database points at must have been on stable storage."""
    s = Schedule("power-cut-after-commit", 4)
    s.world = dict(tables=False)
    s.actors = [("main", "daemon", _seq(_op("lead"), _op("step", MAIN, 1)))]
    s.plan = FaultPlan(forced={("main", "after-commit", 0): "power"})
    return s


def power_cut_after_compaction() -> Schedule:
    """Defect 3, compaction: a power cut right after the compaction committed."""
    s = Schedule("power-cut-after-compaction", 5)
    s.actors = [("main", "daemon", _ingest(6)), ("compact", "cli-compact", _seq(_op("compact")))]
    s.script = [("main", END), ("compact", END)]
    s.plan = FaultPlan(armed={("compact", "compact-commit"): ("commit-after", "power")})
    return s


def two_upgrades() -> Schedule:
    """Defect 4: two ``db upgrade`` runs at once import the old layout."""
    s = Schedule("two-upgrades", 6)
    s.world = dict(tables=False, partitions=1, records=24)
    s.setup = _old_layout
    s.actors = [("up1", "upgrade-1", _plain(lambda w: _import(w, "upgrade-1"))),
                ("up2", "upgrade-2", _plain(lambda w: _import(w, "upgrade-2")))]
    s.script = [("up1", "import-commit"), ("up2", "import-commit"), ("up1", END), ("up2", END)]
    return s


def many_batch_directories(count: int = 70_000) -> Schedule:
    """Defect 5: a leader starts beside more batch directories than one query can name."""
    s = Schedule("many-batch-directories", 7)
    s.setup = lambda w: _batch_dirs(w, count)
    s.actors = [("main", "daemon", _seq(_op("lead"), _op("step", MAIN, 2)))]
    s.expect = lambda w, tables, store: _no_stray_batch_dirs(w)
    s.hang = 600.0
    return s


def cancel_during_publish() -> Schedule:
    """Defect 6: ``backfill cancel`` while the backfill's publish is committing: the range
    it records as left unread must not hold a record the publish committed."""
    s = Schedule("cancel-during-publish", 8)
    s.setup = _behind_with_backfill
    s.actors = [("backfill", "daemon", _seq(_op("step_backfills", 1))),
                ("cancel", "cli-cancel", _seq(_op("cancel")))]
    s.plan = FaultPlan(armed={("backfill", "before-commit"): ("commit-before", "limbo-commit")})
    s.script = [("backfill", "abandon"), ("cancel", END), ("backfill", END)]
    return s


def rollup_flip() -> Schedule:
    """Defect 7: a datasource's spec changes from ``rollup: false`` to ``true``; compaction
    must never merge the raw rows into rolled-up ones (a null count)."""
    s = Schedule("rollup-flip", 9)
    s.actors = [("main", "daemon", _ingest(3)),
                ("flip", "editor", _plain(_flip_rollup)),
                ("after", "daemon-after", _seq(_op("lead"), _op("step", MAIN, 2), _op("compact")))]
    s.script = [("main", END), ("flip", END), ("after", END)]
    s.expect = _rollup_kept
    s.heal = False
    return s


def verify_missing_file() -> Schedule:
    """Defect 8: a committed data file deleted by hand; verify must fail."""
    s = Schedule("verify-missing-file", 10)
    s.actors = [("main", "daemon", _ingest(6))]
    s.sabotage = "delete-file"
    return s


def verify_lost_commit() -> Schedule:
    """Defect 8: the tables' pointers restored from before their last commit while the
    checkpoints stay: verify must see the checkpoint ahead of the table."""
    s = Schedule("verify-lost-commit", 11)
    s.actors = [("main", "daemon", _ingest(6))]
    s.sabotage = "rollback-pointer"
    return s


def verify_foreign_append() -> Schedule:
    """Defect 8: a data file appended again by another writer: verify --deep must fail."""
    s = Schedule("verify-foreign-append", 12)
    s.actors = [("main", "daemon", _ingest(6))]
    s.sabotage = "foreign-append"
    return s


def two_expiries() -> Schedule:
    """Two expiries at once, the second keeping more snapshots than the first: it must plan
    again on the first's result, never fail, never bring back a snapshot whose files the
    first deleted, nor lose the first's folded ranges."""
    s = Schedule("two-expiries", 13)
    s.actors = [("main", "daemon", _ingest(6)), ("exp1", "cli-maintain-1", _seq(_op("expire", retain_last=1, check=False))),
                ("exp2", "cli-maintain-2", _seq(_op("expire", retain_last=3, check=False)))]
    s.script = [("main", END), ("exp2", "expire-commit"), ("exp1", END), ("exp2", END)]
    s.expect = lambda w, tables, store: [f"an expiry failed: {n}" for n in w.notes if "Error" in n]
    return s


def fresh_start() -> Schedule:
    """After a ``freshStart`` (a new source whose offsets start again at 0), verify must not
    report the new source's ranges as overlaps with the old one's."""
    s = Schedule("fresh-start", 14)
    s.actors = [("main", "daemon", _ingest(6)), ("switch", "editor", _plain(_fresh_start)),
                ("after", "daemon-after", _seq(_op("lead"), *[_op("step", MAIN, 1) for _ in range(6)]))]
    s.script = [("main", END), ("switch", END), ("after", END)]
    s.expect = _verify_ok
    s.heal = False
    return s


def continuous_expiry() -> Schedule:
    """Issue 34: publishes that expire old snapshots as they commit (keep 1), beside a
    compaction and an orphan clean-up, and a power cut between a commit and the deletion
    of what it superseded."""
    s = Schedule("continuous-expiry", 16)
    s.world = dict(partitions=2, records=90, snapshots_kept=1)
    s.actors = [("main", "daemon", _ingest(16)), ("compact", "cli-compact", _seq(_op("compact"), _op("compact"))),
                ("maintain", "cli-maintain", _seq(_op("orphans"), _op("orphans")))]
    s.plan = FaultPlan(forced={("main", "superseded-delete", 10): "power"})
    return s


def tags_then_expire() -> Schedule:
    """Issue 41.14: an expiry on a table with a tag and a branch on older snapshots, keeping
    the last 3: it must keep those, and the tagged and branched snapshots with their files."""
    s = Schedule("tags-then-expire", 21)
    s.world = dict(partitions=1, records=120, snapshots_kept=25, reader_grace=0.0)
    s.actors = [("main", "daemon", _ingest(10)),
                ("tagger", "cli-iceberg", _seq(_op("tag", "audit-2026", branch=False, back=4),
                                               _op("tag", "experiment", branch=True, back=3))),
                ("maintain", "cli-maintain", _seq(_op("expire", retain_last=3)))]
    s.script = [("main", END), ("tagger", END), ("maintain", END)]
    s.expect = lambda w, tables, store: ([] if {"tagged", "expired"} <= w.reached else
                                         [f"the schedule did not get to tag and expire: {sorted(w.reached)}"])
    return s


def percent_path() -> Schedule:
    """A warehouse path that needs percent-encoding: clean-up must look where pyiceberg wrote."""
    s = Schedule("percent-path", 15)
    s.world = dict(warehouse_name="seg ments%20#x")
    s.actors = [("main", "daemon", _ingest(6)), ("compact", "cli-compact", _seq(_op("compact"))),
                ("maintain", "cli-maintain", _seq(_op("expire"), _op("orphans")))]
    s.script = [("main", END), ("compact", END), ("maintain", END)]
    return s


def orphans_read_then_publish() -> Schedule:
    """Review of the fences: orphan clean-up read the table's metadata, a batch committed,
    then the clean-up asked the database about the unreferenced files' writes. The batch's
    files were unreferenced in what it had read and "committed" in what the database said."""
    s = Schedule("orphans-read-then-publish", 16)
    s.actors = [("main", "daemon", _seq(_op("lead"), _op("step", MAIN, 1))),
                ("maintain", "cli-maintain", _seq(_op("orphans")))]
    s.script = [("main", "before-commit"), ("maintain", "orphans-judge"), ("main", END), ("maintain", END)]
    return s


def orphans_read_then_compaction() -> Schedule:
    """The same moment for a compaction: committed, it leaves no row in ``writes`` and no
    batch, so the clean-up took it for a write nobody recorded and fenced it."""
    s = Schedule("orphans-read-then-compaction", 17)
    s.actors = [("main", "daemon", _ingest(6)), ("compact", "cli-compact", _seq(_op("compact"))),
                ("maintain", "cli-maintain", _seq(_op("orphans")))]
    s.script = [("main", END), ("compact", "compact-commit"), ("maintain", "orphans-judge"), ("compact", END),
                ("maintain", END)]
    return s


def compaction_unknown_then_orphans() -> Schedule:
    """A compaction's commit landed but its connection dropped (outcome unknown). Before it
    asks its fence, an orphan clean-up finds the write's output for a partition another
    compaction took meanwhile (unreferenced), sees no row for the write (the commit deleted
    it) and records it as discarded; the compaction's fence must still say "committed"."""
    from datetime import timedelta

    from tests.explorer.model import T0

    s = Schedule("compaction-unknown-then-orphans", 18)
    s.actors = [("main", "daemon", _ingest(6)), ("compact", "cli-compact", _seq(_op("compact"))),
                ("compact2", "cli-compact-2", _seq(_op("compact", now=T0 + timedelta(hours=1, minutes=30)))),
                ("maintain", "cli-maintain", _seq(_op("orphans")))]
    s.plan = FaultPlan(armed={("compact", "compact-commit"): ("commit-after", "drop-after")})
    s.script = [("main", END), ("compact", "compact-commit"), ("compact2", END), ("compact", "compact-unknown"),
                ("maintain", END), ("compact", END)]
    return s


def power_cut_table_created() -> Schedule:
    """Defect 3, a new table: a power cut after pyiceberg committed the table's creation
    (the catalog row) and before its metadata was made durable."""
    s = Schedule("power-cut-table-created", 19)
    s.world = dict(tables=False)
    s.actors = [("main", "daemon", _seq(_op("lead"), _op("step", MAIN, 1)))]
    s.plan = FaultPlan(forced={("main", "table-created", 0): "power"})
    return s


def fresh_start_deep() -> Schedule:
    """``verify --deep`` after a ``freshStart``: the new source's offsets start again at 0,
    so (partition, offset) repeats across the two sources while no record is in the table
    twice. Deep's verdict must equal the truth."""
    s = fresh_start()
    s.name, s.seed, s.expect = "fresh-start-deep", 20, _deep_verdict
    return s


# -- set-ups and checks of the named schedules --------------------------------------------------


def _old_layout(world: World) -> None:
    """Committed files of the layout before the tables (``<segments>/<D>/time_chunk=...``),
    the batches that wrote them in the database, and the checkpoint after them."""
    import json
    from datetime import UTC, datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    from reconciler.store.tables import batches, checkpoints
    from tests.explorer.model import ROW_SCHEMA

    store = world.shared
    records = [r for r in world.stream.records() if r.partition == "0" and r.offset < 12 and not r.bad]
    for i, chunk in enumerate((records[:6], records[6:12])):
        batch_id = f"old{i}"
        for hour in sorted({r.time.hour for r in chunk}):  # one file per batch and time chunk, as then
            rows = [r for r in chunk if r.time.hour == hour]
            path = world.warehouse / DATASOURCE / f"time_chunk=20261101T{hour:02d}00Z" / f"{batch_id}-{hour}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({
                "__time": pa.array([r.time for r in rows], pa.timestamp("us", tz="UTC")),
                "id": [r.key for r in rows], "__partition": [r.partition for r in rows],
                "__offset": pa.array([r.offset for r in rows], pa.int64())}, schema=ROW_SCHEMA), path)
        with store.engine.begin() as c:
            c.execute(sa.insert(batches).values(
                batch_id=batch_id, supervisor_id=MAIN, datasource=DATASOURCE, epoch=1, status="committed",
                ranges=json.dumps([["0", i * 6, i * 6 + 6]]), rows=len(chunk), records=len(chunk), unparseable=0,
                committed_at=datetime.now(UTC)))
    with store.engine.begin() as c:
        c.execute(sa.insert(checkpoints).values(supervisor_id=MAIN, partition="0", next_offset=12, first_offset=0))


def _import(world: World, process: str) -> None:
    from reconciler.table.upgrade import import_segments

    proc = world.process(process)
    import_segments(proc.tables, proc.store, world.warehouse, DATASOURCE, granularity="hour")


def _batch_dirs(world: World, count: int) -> None:
    """Uncommitted batch directories of a version before the write fences (ids of 32 hex
    digits), as a crash loop of such a version leaves them."""
    import uuid

    data = world.warehouse / "default" / DATASOURCE / "data"
    for _ in range(count):
        (data / f"batch={uuid.uuid4().hex}").mkdir(parents=True)


def _no_stray_batch_dirs(world: World) -> list[str]:
    data = world.warehouse / "default" / DATASOURCE / "data"
    batch_dirs = [d for d in data.iterdir() if d.name.startswith("batch=")] if data.is_dir() else []
    empty = [d for d in batch_dirs if not any(d.iterdir())]
    return [f"{len(empty)} uncommitted batch directories left after the leader's start"] if empty else []


def _behind_with_backfill(world: World) -> None:
    """The main supervisor ingested its stream, then fell behind and was reset with a backfill."""
    proc = world.process("setup")
    world.lead(proc)
    for _ in range(8):
        world.step(proc, MAIN, 1)
    world.produce(20)
    world.reset(proc)
    proc.runtimes.clear()


def _flip_rollup(world: World) -> None:
    from tests.explorer.world import spec_document

    spec = SupervisorSpec.from_document(spec_document(rollup=True))
    world.shared.update_spec(spec, None, actor="explorer")
    world.produce(10)


def _rollup_kept(world: World, tables: Tables, store: Store) -> list[str]:
    from tests.explorer.world import rows_without_count

    problems = []
    if rows_without_count(tables):
        problems.append(f"{rows_without_count(tables)} row(s) merged into rolled-up rows without a count")
    error = store.get(MAIN).runtime_error or ""
    if "rollup" not in error:
        problems.append(f"the flipped spec was not refused with the reason: {error!r}")
    return problems


def _fresh_start(world: World) -> None:
    from tests.explorer.model import ModelStream
    from tests.explorer.world import spec_document

    doc = spec_document()
    doc["source"]["topic"] = "clicks-v2"
    doc["freshStart"] = True
    world.shared.update_spec(SupervisorSpec.from_document(doc), None, actor="explorer",
                             fresh_start="topic clicks -> clicks-v2")
    old = ModelStream(prefix=world.stream.prefix)
    old.partitions, old.earliest_offset = world.stream.partitions, world.stream.earliest_offset
    world.retired.append(old)
    new = ModelStream(prefix="v2-")
    for p in sorted(old.partitions):
        new.produce(p, 12)
    # The adapters and the job read ``world.stream``'s partitions: swapped in place.
    world.stream.partitions, world.stream.earliest_offset, world.stream.prefix = (
        new.partitions, new.earliest_offset, new.prefix)


def _deep_verdict(world: World, tables: Tables, store: Store) -> list[str]:
    report = check.run_verify(world, tables, store, deep=True)
    t = check.truth(world, tables, store, final=False)
    if report is not None and report.ok != t.ok:
        deep = report.deep.to_dict() if report.deep else None
        return [f"verify --deep says {'ok' if report.ok else 'FAILED'} but the truth is "
                f"{'ok' if t.ok else 'broken'}: {str(deep)[:300]}"]
    return []


def _verify_ok(world: World, tables: Tables, store: Store) -> list[str]:
    report = check.run_verify(world, tables, store, deep=False)
    bad = [f.to_dict() for f in report.findings if f.fails] if report is not None else []
    return [f"verify after a fresh start: {bad}"] if bad else []


NAMED: dict[str, Callable[[], Schedule]] = {f().name: f for f in (
    orphans_during_publish, orphans_during_compaction, ambiguous_commit, power_cut_after_commit,
    power_cut_after_compaction, two_upgrades, many_batch_directories, cancel_during_publish, rollup_flip,
    verify_missing_file, verify_lost_commit, verify_foreign_append, two_expiries, fresh_start, percent_path,
    continuous_expiry, tags_then_expire, orphans_read_then_publish, orphans_read_then_compaction, compaction_unknown_then_orphans, power_cut_table_created,
    fresh_start_deep)}

from tests.explorer import replay as _replay  # noqa: E402 - its schedules build on the helpers above

NAMED.update({f().name: f for f in _replay.NAMED})


# The moments the mutation audit needed (a module of their own: this one is long already).
from tests.explorer import moments  # noqa: E402 - they are built from this module's helpers

NAMED.update({f().name: f for f in moments.SCHEDULES})

from tests.explorer import rolling as _rolling  # noqa: E402 - the leader's rolling compaction (issue 45)

NAMED.update({f().name: f for f in _rolling.named()})

NAMED.update({f().name: f for f in external.named()})  # the external-catalog path (issue 44): moto's Glue

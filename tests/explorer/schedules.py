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

from reconciler.store.store import Store
from reconciler.table.catalog import Tables, deadletter_table, local_path
from tests.explorer import check
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


def _plain(fn: Callable[[World], None]) -> Callable:
    def bind(world: World, process: str) -> Callable[[], None]:
        return lambda: fn(world)

    return bind


def random_schedule(seed: int) -> Schedule:
    rng = random.Random(seed)
    s = Schedule("random", seed)
    s.world = dict(partitions=rng.choice([1, 2, 2]), records=rng.choice([18, 30]),
                   marker_every=rng.choice([0, 0, 7]), bad_every=rng.choice([0, 0, 9]),
                   tables=rng.random() < 0.8)  # else the first batch creates them, under the faults
    main_steps = rng.randint(2, 6)
    s.actors.append(("main", "daemon", _seq(_op("lead"), *[_op("step", MAIN, 1) for _ in range(main_steps)])))
    if rng.random() < 0.6:
        s.actors.append(("reset", "cli-reset", _seq(_op("reset"))))
        s.actors.append(("backfills", "daemon", _seq(*[_op("step_backfills", 1) for _ in range(rng.randint(1, 4))])))
    if rng.random() < 0.5:
        s.actors.append(("compact", "cli-compact", _seq(*[_op("compact") for _ in range(rng.randint(1, 2))])))
    if rng.random() < 0.5:
        s.actors.append(("maintain", "cli-maintain", _seq(_op("expire"), _op("orphans"))))
    if rng.random() < 0.2:
        s.actors.append(("cancel", "cli-cancel", _seq(_op("cancel"))))
    if rng.random() < 0.2:
        s.actors.append(("takeover", "daemon2", _seq(_op("lead"), _op("step", MAIN, rng.randint(1, 3)))))
    if rng.random() < 0.3:
        s.actors.append(("producer", "producer", _plain(lambda w: w.produce(7))))
    if rng.random() < 0.1:
        s.actors.append(("retention", "broker", _plain(lambda w: w.retain("0", 5))))
    quiet = rng.random() < 0.25
    s.plan = FaultPlan() if quiet else FaultPlan(kill=0.012, power=0.004, drop=0.03, limbo=0.03, enospc=0.02)
    if rng.random() < 0.25:
        s.sabotage = rng.choice(SABOTAGES)
    return s


# --------------------------------------------------------------------------- running


class Runner:
    """Runs schedules one after another in one directory and one database, each from a
    snapshot of the set-up world (the schema, the supervisor, the two tables): restored in
    milliseconds instead of built again. The paths stay the same (the tables' metadata
    holds them), so restoring is copying files back (and, on PostgreSQL, rows)."""

    def __init__(self, db_url: str, workdir: Path, db_name: str = "sqlite"):
        self.db_url = db_url
        self.workdir = Path(workdir)
        self.db_name = db_name
        self.postgres = db_url.startswith("postgresql")
        self.store = Store(db_url)
        self._snapshots: dict[tuple, tuple[Path, dict]] = {}

    def close(self) -> None:
        self.store.close()

    def fresh(self, rollup: bool, warehouse_name: str, tables: bool = True) -> None:
        key = (rollup, warehouse_name, tables)
        self.store.engine.dispose()
        if key not in self._snapshots:
            self._wipe()
            World.setup(self.workdir, self.store, rollup=rollup, warehouse_name=warehouse_name, tables=tables)
            self.store.engine.dispose()
            saved = self.workdir.with_name(f"{self.workdir.name}.template{len(self._snapshots)}")
            shutil.rmtree(saved, ignore_errors=True)
            shutil.copytree(self.workdir, saved)
            self._snapshots[key] = (saved, self._rows() if self.postgres else {})
            return
        saved, rows = self._snapshots[key]
        shutil.rmtree(self.workdir, ignore_errors=True)
        shutil.copytree(saved, self.workdir)
        if self.postgres:
            self._restore(rows)

    def _wipe(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(parents=True)
        if self.postgres:
            with self.store.engine.begin() as c:
                c.exec_driver_sql("DROP SCHEMA public CASCADE")
                c.exec_driver_sql("CREATE SCHEMA public")
            self.store.engine.dispose()

    def _rows(self) -> dict[str, list[dict]]:
        with self.store.engine.connect() as c:
            names = sa.inspect(c).get_table_names()
            return {n: [dict(r) for r in c.execute(sa.text(f'SELECT * FROM "{n}"')).mappings()] for n in names}

    def _restore(self, rows: dict[str, list[dict]]) -> None:
        with self.store.engine.begin() as c:
            c.exec_driver_sql("TRUNCATE " + ", ".join(f'"{n}"' for n in rows) + " RESTART IDENTITY CASCADE")
            meta = sa.MetaData()
            for name, data in rows.items():
                table = sa.Table(name, meta, autoload_with=c)
                if data:
                    c.execute(table.insert(), data)
                if "id" in table.c and data and isinstance(table.c.id.type, sa.Integer):
                    c.exec_driver_sql(f"SELECT setval(pg_get_serial_sequence('\"{name}\"', 'id'), "
                                      f"(SELECT max(id) FROM \"{name}\"))")
        self.store.engine.dispose()

    def run(self, schedule: Schedule) -> Result:
        started = time.monotonic()
        problems: list[str] = []
        rng = random.Random(schedule.seed * 7919 + 13)
        world_args = dict(schedule.world)
        self.fresh(world_args.get("rollup", False), world_args.get("warehouse_name", "segments"),
                   world_args.pop("tables", True))
        world = World(self.workdir, self.db_url, store=self.store, **world_args)
        if schedule.setup is not None:
            schedule.setup(world)
        ledger = Ledger(world.warehouse)
        install(ledger)
        sched = Scheduler(rng, schedule.plan)
        sched.script = list(schedule.script)
        try:
            for name, process, bind in schedule.actors:
                sched.spawn(name, process, bind(world, process))
            with installed(sched):
                try:
                    sched.run()
                except Hang as exc:
                    problems.append(f"hang: {exc}")
            if sched.power_cut:
                world.notes.append(f"power cut: lost {ledger.power_cut()}")
            world.close()
            tables = Tables(self.store.engine, world.warehouse)
            problems += check.check_now(world, tables, self.store)
            if schedule.expect is not None:
                problems += schedule.expect(world, tables, self.store)
            if schedule.heal and not problems:
                problems += world.heal()
                tables = Tables(self.store.engine, world.warehouse)
                problems += check.check_final(world, tables, self.store)
                if schedule.sabotage and not problems:
                    _sabotage(schedule.sabotage, world, tables, self.store, rng)
                    tables = Tables(self.store.engine, world.warehouse)
                    problems += check.check_verdict(world, tables, self.store, schedule.sabotage)
        except Exception:  # noqa: BLE001 - the explorer's own failure is a finding too
            problems.append("explorer error: " + traceback.format_exc(limit=8)[-1500:])
        finally:
            uninstall(ledger)
            world.close()
        outcomes = {a.name: a.outcome for a in sched.actors.values()}
        return Result(schedule.name, schedule.seed, self.db_name, problems, sched.faults, outcomes,
                      time.monotonic() - started, sched.trace + [f"note: {n}" for n in world.notes])


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


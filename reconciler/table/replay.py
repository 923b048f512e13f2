"""Dead letters come back: parse them again with the current spec, append the ones that
now parse to the datasource's table, and take them out of ``<D>_deadletter``, in ONE commit.

The protocol, and why a dead letter lands in the table once whatever happens:

1. Plan on one version ``Vd`` of the dead-letter table: read its live files (each one's
   supervisor from its path, ``deadletters``), parse the selected rows with the spec of
   the supervisor's lineage (a backfill parses with its main's spec: the fix is made in
   the main's file) through the same ``Transformer`` the Arrow tasks run, in-process,
   given what a batch's tasks get (``replayspecs``: the format's schema file, the table's
   types), so a letter decodes and types as the batch would have.
   A file is *changed* when a row of it now parses or its reason changed.
2. Record the write (``begin_write``, kind ``replay``) before any file exists; write the
   new rows under ``<D>/data/compacted/<write id>/`` and the changed files' remaining
   dead letters (unselected rows unchanged, still-failing ones with their new reason)
   under ``<D>_deadletter/data/compacted/<write id>/supervisor=<id>/``; make them durable.
3. Stage two snapshots: an append to the data table whose summary says
   ``reconciler.operation=replay`` and carries the replayed (supervisor, partition,
   offset) set as ranges under ``reconciler.replayed-offsets``, and NO
   ``reconciler.ranges`` (``verify``'s range walk skips it, as it skips compaction); and
   an overwrite of the dead-letter table that deletes the changed files and adds their
   rewrites, staged with ``expected=Vd``.
4. Commit both pointer moves (compare-and-swap on each metadata location), finish the
   write and record the audit entries in ONE database transaction (``store.replays``).

Two replays of the same letters both delete the same file of ``Vd``: the second one's
compare-and-swap on the dead-letter pointer fails, it plans again on the new version and
finds the letters gone. Ingestion (new dead letters, new rows), compaction and expiry move
a pointer too: the replay re-plans (files already parsed and written are reused while the
changed set is the same) and retries, at most ``COMMIT_ATTEMPTS`` times; it never appends
without deleting. A replay killed before its commit committed nothing: its files are an
uncommitted write, fenced and deleted by recovery or orphan clean-up; killed after, it is
done and a second run finds nothing to do. A replay still running when a clean-up (a new
leader's recovery) fences its write and deletes its files cannot commit that write, so
before it reuses its files it checks the write is still live; a fenced one is started
over under a new write (recorded first, files written again): nothing of it committed.
A reset moves checkpoints only, never a table: it does not meet a replay. After a replay
each record is in exactly one of the two tables, so ``verify --deep`` counts it once,
inside the range of the batch that first read it.

Rollup: allowed. The replayed records aggregate into new rows (a count of 1 each, sums of
their values), which compaction merges with the others like any batch's.
Stream time: dead letters do not keep it, so ``__stream_time`` is null in replayed rows,
and a spec timed by ``__stream_time`` leaves its dead letters where they are, reasons and
all (parsing them would only say the stream time is missing). So does every spec with an
undecodable RabbitMQ entry's letters: no record is in them (``deadletters.cannot_come_back``).
Partitioning: the new rows are split by the time chunks of the granularity the data table
is partitioned by NOW, whatever each lineage's spec says (two supervisors of one datasource
may segment by hour and by day: a day's file fits no hour partition), and the append is
staged with that granularity.
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
from pyiceberg.exceptions import ValidationException

from reconciler import faults
from reconciler.errors import CommitOutcomeUnknown, ReconcilerError
from reconciler.model import SEGMENT
from reconciler.pipeline import sink
from reconciler.pipeline.transform import DEAD_SCHEMA, TIME, Transformer, chunk_strings
from reconciler.store.batches import TableConflict
from reconciler.store.replays import commit_replay
from reconciler.store.writes import WRITING, WriteFenced
from reconciler.table import durable
from reconciler.table.catalog import DATASOURCE, Tables, deadletter_table, local_path, tagged
from reconciler.table.catalog import TableConflict as StagedOnOtherVersion
from reconciler.table.datafiles import describe
from reconciler.table.deadletters import (
    SUPERVISOR_DIR,
    DeadFile,
    cannot_come_back,
    count_reasons,
    lineage,
    lineage_owner,
    read,
)
from reconciler.table.reach import _unlink
from reconciler.table.replayspecs import ReplayRefused, how_to_parse, rejoin, specs_of, with_types
from reconciler.table.summary import OPERATION
from reconciler.table.writeids import COMPACTED_DIR, new_write_id

log = logging.getLogger(__name__)

REPLAYED = "reconciler.replayed"  # snapshot summary: records replayed
REPLAYED_OFFSETS = "reconciler.replayed-offsets"  # JSON {supervisor: [[partition, start, end], ...]}
COMMIT_ATTEMPTS = 10


@dataclass
class ReplayResult:
    datasource: str
    dry_run: bool
    committed: bool = False
    attempts: int = 0
    replayed: int = 0
    stayed: int = 0
    files_rewritten: int = 0
    replayed_by_supervisor: dict[str, int] = field(default_factory=dict)
    stayed_by_reason: dict[str, int] = field(default_factory=dict)
    cannot_come_back: dict[str, int] = field(default_factory=dict)  # why -> letters left as they are
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {"datasource": d["datasource"], "dryRun": d["dry_run"], "committed": d["committed"],
                "attempts": d["attempts"], "replayed": d["replayed"], "stayed": d["stayed"],
                "filesRewritten": d["files_rewritten"], "replayedBySupervisor": d["replayed_by_supervisor"],
                "stayedByReason": d["stayed_by_reason"], "cannotComeBack": d["cannot_come_back"],
                "message": d["message"]}


@dataclass
class _Parsed:
    """What parsing one file again gave: its new rows, what stays, the offsets that came back."""

    rows: pa.Table | None  # the data rows (time_chunk last), None when none parse
    kept: pa.Table  # the file's dead letters after the replay (DEAD_SCHEMA)
    replayed: list[tuple[str, int]]  # (partition, offset), once per row that came back
    stayed_reasons: list[str]  # reasons of the selected letters that stay (new, or kept when left alone)
    left: list[str]  # why, for each selected letter no spec can bring back (left as it is)
    changed: bool
    found: Any = None  # schemaDiscovery: the new columns' report (``Discovered.report``), to join


def replay(tables: Tables, store: Any, datasource: str, *, reason: str | None = None,
           supervisor: str | None = None, dry_run: bool = False, actor: str = "?",
           attempts: int = COMMIT_ATTEMPTS) -> ReplayResult:
    """Replay the dead letters of ``datasource`` (those read by ``supervisor`` or its
    backfills, and whose reason contains ``reason``, when given). Raises ``ReplayRefused``."""
    actual = store.read_actual().supervisors
    specs = specs_of(actual, datasource, supervisor)
    how = how_to_parse(tables, actual, datasource, specs)
    result = ReplayResult(datasource, dry_run)
    fallback = lineage_owner(actual, datasource)
    cache: dict[str, DeadFile] = {}
    parsed: dict[str, _Parsed] = {}
    written: dict[frozenset, tuple[list[str], list[str], Any, str | None]] = {}
    write_id: str | None = None
    done: set[str] = set()
    try:
        for attempt in range(attempts):
            result.attempts = attempt + 1
            dead_table, files = read(tables, store, datasource, fallback=fallback, cache=cache)
            if dead_table is None or not any(f.rows.num_rows for f in files):
                if attempt == 0:
                    raise ReplayRefused(f"datasource {datasource} has no dead letters")
                result.message = "nothing left to replay: another replay took them"
                return result
            planned = dead_table.metadata_location
            mine = [f for f in files if f.supervisor is not None and lineage(f.supervisor) in specs
                    and (supervisor is None or f.supervisor == supervisor or lineage(f.supervisor) == supervisor)]
            if any(f.path not in parsed for f in mine):
                def parse(f: DeadFile, again: dict | None = None) -> _Parsed:
                    return _parse(f, specs[lineage(f.supervisor)], reason, with_types(how[lineage(f.supervisor)], again))

                parsed.update({f.path: parse(f) for f in mine})
                # A new key's type is joined across every letter, as across a batch's tasks:
                # each file's own decision would leave rows the table cannot take as one.
                parsed.update(rejoin(mine, parsed, parse))
            changed = [f for f in mine if parsed[f.path].changed]
            _count(result, changed, parsed, [f for f in mine if not parsed[f.path].changed], reason)
            if not changed or not result.replayed and dry_run:
                result.message = (f"nothing comes back: {result.stayed} dead letter(s) still fail"
                                  + _left_note(result) if result.stayed else "no dead letter matches")
                return result
            if dry_run:
                result.message = f"would replay {result.replayed}; {result.stayed} would stay" + _left_note(result)
                return result
            if write_id is not None and not _live(store, write_id):
                # A new leader's recovery (or orphan clean-up) fenced it and deleted its
                # files; nothing of it committed, so the letters are still ours to replay.
                log.warning("replay of %s: write %s was fenced by a clean-up; starting over under a new write",
                            datasource, write_id)
                _discard(tables, store, datasource, write_id)
                written.clear()
                write_id = None
            if write_id is None:
                write_id = new_write_id()
                store.begin_write(write_id, "replay", tables=[datasource, deadletter_table(datasource)])
            key = frozenset(f.path for f in changed)
            summary = _summary(datasource, changed, parsed)
            commits = []
            try:
                if key not in written:
                    written[key] = _write(tables, datasource, dead_table, changed, parsed, specs, write_id)
                data_paths, dead_paths, data_schema, granularity = written[key]
                faults.crash_point("replay-written", datasource)
                if data_paths:  # the lineages agree on rollup (crossfile.py): any one's says it
                    ds = specs[lineage(changed[0].supervisor)].data_schema
                    commits.append(tables.stage_append(datasource, data_paths, summary, schema=data_schema,
                                                       granularity=granularity, rollup=ds.rollup,
                                                       write_id=write_id, attempt=attempt))
                commits.append(tables.stage(deadletter_table(datasource), _overwrite(changed, dead_paths, summary),
                                            write_id=write_id, attempt=attempt, expected=planned))
            except (StagedOnOtherVersion, ValidationException) as exc:  # it moved since it was planned
                tables.discard_staged(commits)
                log.info("replay of %s: %s; planning again", datasource, exc)
                continue
            except OSError:  # a file of the write is gone: fenced since the check above, or a real fault
                tables.discard_staged(commits)
                if _live(store, write_id):
                    raise
                log.info("replay of %s: write %s was fenced while it wrote or staged; planning again",
                         datasource, write_id)
                continue
            faults.point("replay-commit", datasource)
            audits = _audits(datasource, changed, parsed, write_id)
            try:
                commit_replay(store, write_id, commits, actor, audits)
            except TableConflict as exc:
                tables.discard_staged(commits)
                log.info("replay of %s: a table moved (%s); planning again", datasource, exc)
                time.sleep(min(0.05 * (attempt + 1), 0.5))
                continue
            except WriteFenced as exc:  # nothing committed: the next attempt starts over (above)
                tables.discard_staged(commits)
                log.info("replay of %s: %s; planning again", datasource, exc)
                continue
            except CommitOutcomeUnknown as exc:
                faults.point("replay-unknown", datasource)
                if store.fence_write(write_id):
                    tables.discard_staged(commits)
                    written.clear()
                    result.message = f"commit outcome unknown ({exc}); not committed: run the replay again"
                    return result
            tables.committed(commits)
            faults.crash_point("replay-committed", datasource)
            done = set(data_paths) | set(dead_paths)
            result.committed = True
            result.files_rewritten = len(changed)
            result.message = f"replayed {result.replayed}; {result.stayed} stayed" + _left_note(result)
            log.info("replay of %s: %s", datasource, result.message)
            return result
        result.message = f"gave up after {attempts} attempts: the tables kept moving; run it again"
        return result
    finally:
        if write_id is not None:
            try:
                _finish(tables, store, datasource, write_id, written, done)
            except OSError as exc:  # tidying only: the outcome stands, orphan clean-up takes what is left
                log.warning("replay of %s: files of write %s left for orphan clean-up (%s)", datasource, write_id, exc)


def _parse(f: DeadFile, spec: Any, reason: str | None, how: dict | None = None) -> _Parsed:
    """Parse the file's selected dead letters again, as a batch's task would (``how``: the
    format's files and the table's types, ``how_to_parse``). Each row is judged on its own (a file
    may hold one offset twice); the rows' order is kept."""
    rows = f.rows
    reasons = rows.column("reason").to_pylist()
    selected = [reason is None or (r is not None and reason in r) for r in reasons]
    why = [cannot_come_back(r, spec.data_schema) if s else None for r, s in zip(reasons, selected, strict=True)]
    left = [w for w in why if w]
    parse = [s and not w for s, w in zip(selected, why, strict=True)]
    if not any(parse):
        return _Parsed(None, rows, [], [r for r, w in zip(reasons, why, strict=True) if w], left, False)
    chosen = rows.filter(pa.array(parse))
    cols = [chosen.column(c).combine_chunks() for c in ("partition", "offset", "key", "value")]
    records = pa.RecordBatch.from_arrays([*cols, pa.nulls(chosen.num_rows, pa.timestamp("us", tz="UTC"))],
                                         names=["partition", "offset", "key", "value", "stream_time"])
    t = Transformer(spec.data_schema, **(how or {}))
    out, last = t(records), t.finish()
    data = pa.concat_tables([out.rows, last.rows])
    # A record's outcome depends on its partition, offset, key and value alone (no stream
    # time here): the rows of ``out.dead`` are the chosen ones with those four equal.
    new_reason = dict(zip(_identities(out.dead), out.dead.column("reason").to_pylist(), strict=True))
    chosen_ids = iter(_identities(chosen))
    replayed: list[tuple[str, int]] = []
    stayed: list[str] = []
    kept_reasons: list[str] = []
    keep: list[bool] = []
    for r, p, w in zip(reasons, parse, why, strict=True):
        now = new_reason.get(ident := next(chosen_ids), _BACK) if p else r
        keep.append(now is not _BACK)
        if now is _BACK:
            replayed.append(ident[:2])
            continue
        kept_reasons.append(now)
        if p or w:
            stayed.append(now)
    changed = bool(replayed) or kept_reasons != [r for r, k in zip(reasons, keep, strict=True) if k]
    kept = rows.filter(pa.array(keep))
    kept = kept.set_column(kept.schema.get_field_index("reason"), "reason", pa.array(kept_reasons, pa.string()))
    found = pa.schema(t.discovery.report()) if t.discovery is not None and t.discovery.types else None
    return _Parsed(data if data.num_rows else None, kept.cast(DEAD_SCHEMA), replayed, stayed, left, changed, found)


_BACK = object()  # no new reason: the record parses now


def _identities(t: pa.Table) -> list[tuple]:
    return list(zip(*(t.column(c).to_pylist() for c in ("partition", "offset", "key", "value")), strict=True))


def _count(result: ReplayResult, changed, parsed, unchanged, reason) -> None:
    result.replayed = sum(len(parsed[f.path].replayed) for f in changed)
    by_sup: dict[str, int] = {}
    for f in changed:
        if parsed[f.path].replayed:
            by_sup[f.supervisor] = by_sup.get(f.supervisor, 0) + len(parsed[f.path].replayed)
    result.replayed_by_supervisor = by_sup
    stayed = [r for f in [*changed, *unchanged] for r in parsed[f.path].stayed_reasons]
    result.stayed = len(stayed)
    result.stayed_by_reason = count_reasons(stayed)
    left: collections.Counter[str] = collections.Counter(w for f in [*changed, *unchanged] for w in parsed[f.path].left)
    result.cannot_come_back = dict(left.most_common())


def _left_note(result: ReplayResult) -> str:
    return "".join(f"; {n} cannot come back whatever the spec: {w}" for w, n in result.cannot_come_back.items())


def _granularity(table: Any) -> str | None:
    """The segment granularity the table is partitioned by now (its ``__time`` transform)."""
    metadata = table.metadata
    time_id = metadata.schema().find_field(TIME).field_id
    for f in metadata.spec().fields:
        if f.source_id == time_id:
            return _BY_TRANSFORM.get(type(f.transform).__name__)
    return None


_BY_TRANSFORM = {"HourTransform": "hour", "DayTransform": "day", "MonthTransform": "month"}


def _write(tables: Tables, datasource: str, dead_table: Any, changed: list[DeadFile], parsed: dict[str, _Parsed],
           specs: dict[str, Any], write_id: str) -> tuple[list[str], list[str], Any, str | None]:
    """Write the new rows, split by the table's time chunks as a batch splits its own, and
    the rewritten dead letters under the write's directories. Returns the files and the
    rows' schema and granularity (None: the table is not partitioned by time)."""
    table = tables.current(datasource)
    granularity = _granularity(table)
    stem = f"part-replay-{uuid.uuid4().hex[:12]}"
    data_root = tables.storage.join(table.location(), "data", COMPACTED_DIR, write_id)
    dead_root = tables.storage.join(dead_table.location(), "data", COMPACTED_DIR, write_id)
    store_json = _store_json(tables)
    rows = [parsed[f.path].rows for f in changed if parsed[f.path].rows is not None]
    data_paths: list[str] = []
    data_schema = None
    if rows:
        unified = pa.unify_schemas([r.schema for r in rows], promote_options="permissive")  # int -> long
        data_schema = pa.schema([f for f in unified if f.name != SEGMENT])
        order = [*data_schema.names, SEGMENT]
        files = sink.Files(data_root, stem, SEGMENT, storage=sink.task_storage(str(data_root), store_json))
        for r in rows:
            for name in order:
                if name not in r.column_names:
                    r = r.append_column(unified.field(name), pa.nulls(r.num_rows, unified.field(name).type))
            r = r.select(order).cast(pa.schema([unified.field(n) for n in order]))
            if granularity is not None:
                r = r.set_column(len(order) - 1, SEGMENT, chunk_strings(r.column(TIME), granularity))
            files.add_table(r)
        data_paths = [tables.storage.join(data_root, w.name) for w in files.close()]
    dead_paths: list[str] = []
    by_sup: dict[str, list[pa.Table]] = {}
    for f in changed:
        if parsed[f.path].kept.num_rows:
            by_sup.setdefault(f.supervisor, []).append(parsed[f.path].kept)
    for sid, tabs in sorted(by_sup.items()):
        root = tables.storage.join(dead_root, f"{SUPERVISOR_DIR}{sid}")
        files = sink.Files(root, stem, None, storage=sink.task_storage(str(root), store_json))
        files.add_table(pa.concat_tables(tabs))
        dead_paths += [tables.storage.join(root, w.name) for w in files.close()]
    if not tables.storage.remote:  # on an object store a PUT that returned is durable
        paths = [local_path(p) for p in [*data_paths, *dead_paths]]
        dirs = set()
        for p in paths:
            d = p.parent
            while d.name != "data" and d != d.parent:
                dirs.add(d)
                d = d.parent
            dirs |= {d, d.parent}
        durable.sync(paths, dirs)
    return data_paths, dead_paths, data_schema, granularity


def _store_json(tables: Tables) -> str | None:
    if not tables.storage.remote:
        return None
    from reconciler.table import storage

    return storage.current().to_json()


def _ranges(offsets: list[tuple[str, int]]) -> list[list]:
    out: list[list] = []
    for p, group in itertools.groupby(sorted(offsets), key=lambda x: x[0]):
        for o in (o for _, o in group):
            if out and out[-1][0] == p and out[-1][1] <= o < out[-1][2]:
                continue  # the same offset twice (a file may hold it twice): one range
            if out and out[-1][0] == p and out[-1][2] == o:
                out[-1][2] = o + 1
            else:
                out.append([p, o, o + 1])
    return out


def _summary(datasource: str, changed: list[DeadFile], parsed: dict[str, _Parsed]) -> dict[str, str]:
    import json

    per: dict[str, list[tuple[str, int]]] = {}
    for f in changed:
        per.setdefault(f.supervisor, []).extend(parsed[f.path].replayed)
    return {OPERATION: "replay", DATASOURCE: datasource,
            REPLAYED: str(sum(len(v) for v in per.values())),
            REPLAYED_OFFSETS: json.dumps({s: _ranges(v) for s, v in sorted(per.items())}, separators=(",", ":"))}


def _overwrite(changed: list[DeadFile], dead_paths: list[str], summary: dict[str, str]):
    def build(tx):
        entries = describe(tx.table_metadata, dead_paths) if dead_paths else []
        with tagged(tx.update_snapshot(snapshot_properties=summary).overwrite(), tx) as ow:
            for f in changed:
                ow.delete_data_file(f.task.file)
            for e in entries:
                ow.append_data_file(e)
    return build


def _audits(datasource: str, changed: list[DeadFile], parsed: dict[str, _Parsed], write_id: str) -> dict:
    """One audit entry per lineage whose spec parsed the letters (who, how many, which reasons)."""
    out: dict[str, dict[str, Any]] = {}
    for f in changed:
        p = parsed[f.path]
        d = out.setdefault(lineage(f.supervisor), {"datasource": datasource, "replayed": 0, "stayed": 0,
                                                   "stayedByReason": {}, "writeId": write_id})
        d["replayed"] += len(p.replayed)
        d["stayed"] += len(p.stayed_reasons)
        for k, n in count_reasons(p.stayed_reasons).items():
            d["stayedByReason"][k] = d["stayedByReason"].get(k, 0) + n
    return out


def _finish(tables: Tables, store: Any, datasource: str, write_id: str, written: dict, done: set[str]) -> None:
    """Files of attempts the commit does not reference go now; a replay that did not commit
    is fenced first, then its files deleted (a fence that cannot be set: recovery's)."""
    if done:
        for data_paths, dead_paths, _, _ in written.values():
            for p in [*data_paths, *dead_paths]:
                if p not in done:
                    _unlink(p)
        return
    _discard(tables, store, datasource, write_id)


def _live(store: Any, write_id: str) -> bool:
    """Whether write ``write_id`` may still commit (no clean-up fenced it)."""
    return store.write_statuses([write_id]).get(write_id) == WRITING


def _discard(tables: Tables, store: Any, datasource: str, write_id: str) -> None:
    """Fence a write that did not commit, then delete its files (a fence that cannot be set
    leaves them to the leader's recovery)."""
    try:
        if not store.fence_write(write_id):
            return
    except ReconcilerError as exc:
        log.warning("replay of %s: write %s left for recovery (%s)", datasource, write_id, exc)
        return
    for name in (datasource, deadletter_table(datasource)):
        table = tables.load(name)
        if table is not None:
            tables.storage.delete_dir(tables.storage.join(table.location(), "data", COMPACTED_DIR, write_id))
            for f in tables.write_metadata_files(name, write_id):
                _unlink(f)

"""The invariants, checked from the outside (the model stream and a scan of the tables),
never from what the product says of itself, and ``verify``'s verdict held against them.

* **now** (right after the schedule, before any recovery: what a reader sees at any
  moment): every file the tables reference exists, those of every snapshot the current
  metadata keeps too (a reader may time-travel to any); no (partition, offset) twice; each
  main checkpoint equals the end of the offsets its lineage's snapshots cover (what a
  running backfill has still to read aside); no range a cancel reported unread is in the
  table; no rolled-up row without its count.
* **final** (after a fresh leader's recovery, catching up and an orphan clean-up): every
  record of the stream is in the table exactly once, except the ones retention deleted
  before they were read and the ones a cancelled backfill left unread; nothing but
  referenced files is left; ``verify --deep`` passes.
* **verify's verdict equals the truth**: after a sabotage (a data file deleted by hand,
  the table's pointer rolled back under the checkpoints, a batch's file appended again)
  ``verify`` must fail exactly when the truth is broken.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field

from reconciler.table.catalog import Tables, deadletter_table
from reconciler.table.locations import local_name
from reconciler.table.verify import SupervisorFacts, lineage_of, verify
from tests.explorer.world import DATASOURCE, MAIN, World, rows_without_count


@dataclass
class Truth:
    duplicates: int = 0
    missing: int = 0
    extra: int = 0
    unreadable: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.duplicates or self.missing or self.extra or self.unreadable)


def facts(store) -> dict[str, SupervisorFacts]:
    actual = store.read_actual()
    return {sid: SupervisorFacts(sid, r.kind, r.state, r.generation, actual.checkpoints.get(sid, {}),
                                 store.first_offsets(sid), r.end_offsets)
            for sid, r in actual.supervisors.items() if lineage_of(sid) == MAIN}


def run_verify(world: World, tables: Tables, store, deep: bool):
    table = tables.load(DATASOURCE)
    if table is None:
        return None
    history = {sid: store.history(sid) for sid in store.read_actual().supervisors if lineage_of(sid) == MAIN}
    return verify(table, DATASOURCE, history, deep=deep, dead_table=tables.load(deadletter_table(DATASOURCE)),
                  facts=facts(store))


def truth(world: World, tables: Tables, store, *, final: bool) -> Truth:
    """What the table holds against what the stream holds, record by record (by key: the
    records of a source a fresh start left behind are other records than the new one's)."""
    t = Truth()
    try:
        held = world.table_keys(tables)
    except (FileNotFoundError, OSError, ValueError) as exc:
        t.unreadable = f"{type(exc).__name__}: {exc}"[:300]
        t.problems.append(f"the table cannot be read: {t.unreadable}")
        return t
    counts = collections.Counter(held)
    t.duplicates = sum(1 for n in counts.values() if n > 1)
    if t.duplicates:
        first = sorted(k for k, n in counts.items() if n > 1)[:5]
        t.problems.append(f"{t.duplicates} record(s) held twice or more, e.g. {first}")
    present = set(counts)
    current = {r.key: r for r in world.stream.records()}
    old = {r.key for s in world.retired for r in s.records()}
    extra = present - set(current) - old
    t.extra = len(extra)
    if extra:
        t.problems.append(f"{t.extra} row(s) of records the stream never had: {sorted(extra)[:5]}")
    cancelled = _cancelled(store)
    unread = {k for k, r in current.items() if (r.partition, r.offset) in cancelled}
    if unread & present:
        t.problems.append(f"a cancel reported as unread records the table holds: {sorted(unread & present)[:5]}")
        t.extra += len(unread & present)
    checkpoints = store.read_actual().checkpoints.get(MAIN, {})
    pending = _pending(store)
    missing = []
    for key, r in current.items():
        at = (r.partition, r.offset)
        if at in world.stream.deleted or at in cancelled or at in pending or key in present:
            continue
        if final or r.offset < checkpoints.get(r.partition, 0):
            missing.append(key)
    t.missing = len(missing)
    if missing:
        t.problems.append(f"{len(missing)} record(s) below the checkpoint are not in the table, e.g. "
                          f"{sorted(missing)[:5]}")
    return t


def ranges_once(world: World, tables: Tables, store, *, final: bool) -> list[str]:
    """External catalogs' own invariant, read from the table alone (its snapshots' summaries
    and the ranges of expired ones folded into its properties): per partition and source
    generation, the ranges the lineage's supervisors committed are disjoint, and their union
    is exactly the produced offsets (``final``; before healing: every offset below the main
    checkpoint), but those retention deleted unread, a cancel left unread or a running
    backfill has still to read."""
    from reconciler.table.summary import (
        expired_ranges,
        parse_range_key,
        summary_key,
        summary_ranges,
    )

    table = tables.load(DATASOURCE)
    if table is None:
        return []
    spans: dict[tuple[str, int], list[tuple[int, int, str]]] = collections.defaultdict(list)
    for key, ranges in expired_ranges(table.metadata.properties).items():
        sid, gen = parse_range_key(key)
        if lineage_of(sid) == MAIN:
            for p, s, e in ranges:
                spans[(p, gen)].append((s, e, f"{key} (expired)"))
    for snap in table.metadata.snapshots:
        props = dict(snap.summary.additional_properties) if snap.summary else {}
        key = summary_key(props)
        if key is None or lineage_of(parse_range_key(key)[0]) != MAIN:
            continue
        for p, s, e in summary_ranges(props):
            spans[(p, parse_range_key(key)[1])].append((s, e, f"{key} snapshot {snap.snapshot_id}"))
    out = []
    covered: dict[str, set[int]] = collections.defaultdict(set)
    for (p, gen), ranges in sorted(spans.items()):
        ranges.sort()
        for (s1, e1, w1), (s2, e2, w2) in zip(ranges, ranges[1:], strict=False):
            if s2 < e1:
                out.append(f"offsets [{s2}, {min(e1, e2)}) of partition {p} are in the table twice: {w1} "
                           f"[{s1}, {e1}) and {w2} [{s2}, {e2})")
        if gen == 0:
            covered[p] |= {o for s, e, _ in ranges for o in range(s, e)}
    latest = world.stream.latest()
    checkpoints = store.read_actual().checkpoints.get(MAIN, {})
    allowed = set(world.stream.deleted) | _cancelled(store) | _pending(store)
    for p, end in sorted(latest.items()):
        beyond = sorted(o for o in covered.get(p, ()) if o >= end)
        if beyond:
            out.append(f"partition {p}: the table's ranges cover offsets {beyond[:5]} the stream never had (end {end})")
        upto = end if final else min(end, checkpoints.get(p, 0))
        skipped = [o for o in range(upto) if o not in covered.get(p, ()) and (p, o) not in allowed]
        if skipped:
            out.append(f"partition {p}: offsets {skipped[:8]}{' ...' if len(skipped) > 8 else ''} are in no range "
                       f"the table holds ({len(skipped)} skipped; checked up to {upto})")
    return out


def _cancelled(store) -> set[tuple[str, int]]:
    """Offsets an operator's cancel left unread, as the cancel recorded them (the records
    not required in the table; none of them may be in it)."""
    out = set()
    for sid in store.read_actual().supervisors:
        for entry in store.history(sid):
            if entry["action"] == "cancel-backfill":
                for p, (s, e) in ((entry["details"] or {}).get("unreadRanges") or {}).items():
                    out |= {(str(p), o) for o in range(int(s), int(e))}
    return out


def _pending(store) -> set[tuple[str, int]]:
    """Offsets a running backfill has still to read."""
    actual = store.read_actual()
    out = set()
    for sid, r in actual.supervisors.items():
        if r.kind == "backfill" and r.state not in ("COMPLETED", "TERMINATED") and r.end_offsets:
            at = actual.checkpoints.get(sid, {})
            for p, end in r.end_offsets.items():
                out |= {(p, o) for o in range(at.get(p, end), end)}
    return out


def kept_snapshots_missing(tables: Tables) -> list[str]:
    """Files of any snapshot the current metadata keeps that are gone: continuous expiry
    and compaction delete what only expired snapshots needed, never what a kept one does.
    Read with pyiceberg's own manifest readers, not the product's ``reach``."""
    out = []
    for name in (DATASOURCE, deadletter_table(DATASOURCE)):
        table = tables.load(name)
        if table is None:
            continue
        for snap in table.metadata.snapshots:
            try:
                paths = {snap.manifest_list}
                for m in snap.manifests(table.io):
                    paths.add(m.manifest_path)
                    paths |= {e.data_file.file_path for e in m.fetch_manifest_entry(table.io, discard_deleted=True)}
            except FileNotFoundError as exc:
                out.append(f"{name}: kept snapshot {snap.snapshot_id}: {exc}"[:300])
                continue
            missing = sorted(x for x in paths if not os.path.exists(local_name(x)))
            if missing:
                out.append(f"{name}: kept snapshot {snap.snapshot_id}: {len(missing)} file(s) missing: {missing[:2]}")
    return out


def refs_kept(world: World, tables: Tables) -> list[str]:
    """Every tag and branch the schedule made still names its snapshot, and that snapshot
    still reads: the same data files, all present."""
    table = tables.load(DATASOURCE)
    if table is None or not world.refs:
        return []
    out = []
    for label, (sid, files) in sorted(world.refs.items()):
        ref = table.metadata.refs.get(label)
        if ref is None or ref.snapshot_id != sid:
            out.append(f"tag/branch {label} of snapshot {sid} is gone or moved: {ref}")
            continue
        if table.metadata.snapshot_by_id(sid) is None:
            out.append(f"snapshot {sid} of tag/branch {label} was expired")
            continue
        try:
            now = frozenset(t.file.file_path for t in table.scan(snapshot_id=sid).plan_files())
        except FileNotFoundError as exc:
            out.append(f"tag/branch {label}: snapshot {sid} cannot be read: {exc}"[:300])
            continue
        gone = sorted(f for f in now if not os.path.exists(local_name(f)))
        if now != files or gone:
            out.append(f"tag/branch {label}: snapshot {sid} reads other files than when tagged, or missing: {gone[:2]}")
    return out


def missing_current_files(tables: Tables) -> list[str]:
    """Data files the tables' current snapshots reference that are not on disk."""
    out = []
    for name in (DATASOURCE, deadletter_table(DATASOURCE)):
        table = tables.load(name)
        if table is None or table.current_snapshot() is None:
            continue
        out += [t.file.file_path for t in table.scan().plan_files() if not os.path.exists(local_name(t.file.file_path))]
    return out


def check_now(world: World, tables: Tables, store) -> list[str]:
    """Safety at the moment the schedule ended, before anything recovers."""
    problems = []
    try:
        report = run_verify(world, tables, store, deep=False)
    except OSError as exc:
        return [f"the table cannot be loaded: {exc}"[:400]]
    try:
        missing = missing_current_files(tables)
    except FileNotFoundError as exc:
        missing = [f"(metadata) {exc}"[:300]]
    if missing:
        problems.append(f"{len(missing)} referenced file(s) missing: {missing[:3]}")
    problems += kept_snapshots_missing(tables)
    problems += refs_kept(world, tables)
    t = truth(world, tables, store, final=False)
    problems += t.problems
    if report is not None and world.catalog is not None and _ahead_only(report) and t.ok and not missing:
        # The table runs ahead of the database between an external catalog's two commits
        # until the next step rolls it forward; ``verify`` calls that a failure. Known
        # (reported with issue 44's explorer: glue-crash-between-commits fails on it); the
        # range invariant below judges the table instead.
        world.reached.add("verify-fails-before-roll-forward")
        report = None
    if report is not None:
        failing = [f for f in report.findings if f.fails and f.kind != "gap"]
        problems += [f"verify now: {f.kind} {f.lineage} p{f.partition} [{f.start}, {f.end})" for f in failing]
        if t.ok and not missing and not report.ok:
            gaps = [f for f in report.findings if f.fails]
            problems.append(f"verify fails while the table is right: {[f.to_dict() for f in gaps][:3]}")
    if world.rollup and rows_without_count(tables):
        problems.append(f"{rows_without_count(tables)} rolled-up row(s) without a count")
    if world.catalog is not None:
        problems += ranges_once(world, tables, store, final=False)
    return problems


def _ahead_only(report) -> bool:
    failing = [f for f in report.findings if f.fails]
    return bool(failing) and all(f.kind == "ahead" for f in failing) and not report.missing_files


def check_final(world: World, tables: Tables, store) -> list[str]:
    problems = []
    t = truth(world, tables, store, final=True)
    problems += [f"final: {p}" for p in t.problems]
    problems += [f"final: {p}" for p in _unfinished(store)]
    garbage = world.unreferenced_files(tables)
    held = _held_by_discarded_staging(garbage, store)
    if held:  # known (reported with issue 41.12's reader's grace): visible in the coverage, not a failure
        world.reached.add("leftover-held-by-discarded-staging")
        garbage = [g for g in garbage if g not in held]
    if garbage and getattr(world, "orphans_refused", False):  # the product refuses the clean-up there
        world.reached.add("leftover-without-orphan-cleanup")
        garbage = []
    if garbage:
        problems.append(f"final: {len(garbage)} unreferenced file(s) left after recovery and clean-up: {garbage[:3]}")
    if world.catalog is not None:
        problems += [f"final: {p}" for p in ranges_once(world, tables, store, final=True)]
    report = run_verify(world, tables, store, deep=True)
    if report is not None and report.ok != t.ok:
        problems.append(f"final: verify says {'ok' if report.ok else 'FAILED'} but the truth is "
                        f"{'ok' if t.ok else 'broken'}: {report.to_dict()['findings'][:3]}")
    return problems


def _unfinished(store) -> list[str]:
    """Progress: after the heal every bounded supervisor ended COMPLETED, or TERMINATED by
    a cancel the audit log holds (the heal itself accepts either), and the main supervisor
    holds no error."""
    out = []
    actual = store.read_actual()
    for sid, r in actual.supervisors.items():
        if r.kind == "backfill" and r.state != "COMPLETED" and not (
                r.state == "TERMINATED" and any(e["action"] == "cancel-backfill" for e in store.history(sid))):
            out.append(f"{sid} ended {r.state} without a cancel: {r.runtime_error or ''}"[:300])
        elif r.kind == "main" and r.runtime_error:
            out.append(f"{sid} still reports an error after catching up: {r.runtime_error}"[:300])
    return out


def _held_by_discarded_staging(garbage: list[str], store) -> set[str]:
    """Leftovers of a batch the fences discarded whose staged metadata file is still on
    disk: orphan clean-up's reader's grace (table/grace.py) holds every version with no
    version two after it on storage, a staging of a discarded write included, until two more
    commits land. Not lost data, and gone after later commits; counted apart."""
    import re

    from reconciler.table.writeids import write_id_of_name

    by_write: dict[str, list[str]] = {}
    for g in garbage:
        m = re.search(r"/data/batch=([^/]+)/", g)
        wid = m.group(1) if m else (write_id_of_name(os.path.basename(g)) if "/metadata/" in g else None)
        if wid:
            by_write.setdefault(wid, []).append(g)
    if not by_write:
        return set()
    statuses = store.write_statuses(by_write)
    out = set()
    for wid, paths in by_write.items():
        staged = any("/metadata/" in p for p in paths) or any(
            write_id_of_name(n) == wid for p in paths for n in _listdir(p.split("/data/batch=")[0] + "/metadata"))
        if statuses.get(wid) == "discarded" and staged:
            out |= set(paths)
    return out


def _listdir(path: str) -> list[str]:
    return os.listdir(path) if os.path.isdir(path) else []


def check_verdict(world: World, tables: Tables, store, sabotage: str) -> list[str]:
    """After a sabotage: verify (deep) must fail exactly when the truth is broken."""
    t = truth(world, tables, store, final=True)
    report = run_verify(world, tables, store, deep=True)
    if report is None:
        return []
    if report.ok != t.ok:
        return [f"sabotage {sabotage}: verify says {'ok' if report.ok else 'FAILED'} but the truth is "
                f"{'ok' if t.ok else 'broken'} ({'; '.join(t.problems)[:300]})"]
    return []

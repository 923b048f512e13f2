"""Exactly once, proven from the table, anchored in the database's checkpoints.

Per supervisor lineage (a main supervisor and its backfills ``<id>-backfill-<n>``
together cover one stream), source generation (a fresh start begins a new source, whose
offsets are not the old one's) and partition, the ranges of the batch snapshots, sorted,
must tile the offsets: an offset in two snapshots is an overlap (records twice), an
offset between ranges a gap (records missing). The ranges of expired snapshots are kept
in a table property and checked the same way.

The tiling is anchored at both ends (``facts``: the database's view of each supervisor):

* it starts where the partition started (``checkpoints.first_offset``: startFrom, or
  earliest for a partition that appeared later);
* it ends at the main supervisor's checkpoint: offsets below the checkpoint that no
  range covers were given up by the checkpoint without reaching the table (a lost
  commit, a restored database), and a range past the checkpoint was committed by no
  checkpoint.

A gap is explained when the audit log says why no batch read it: the broker's
retention deleted it, an operator reset skipped it without a backfill, or a backfill was
cancelled; a gap a running backfill has still to read is pending, not missing. Overlaps
always fail: the table holds those records twice.

Every file the current snapshots reference (metadata, manifest list, manifests, data
files) must exist. ``deep`` also reads ``__partition``/``__offset`` (when the datasource
keeps them and does not roll up) from the data files and the dead-letter table: an offset
held twice fails, and so does one missing where the batches recorded how many records
their readers delivered (an offset without a record, a transaction marker or a RabbitMQ
tracking entry, is told apart by those counts).
"""

from __future__ import annotations

import collections
import errno
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reconciler.model import BACKFILL_ID
from reconciler.table import summary
from reconciler.table.files import EPOCH_START, BatchSnapshot, batch_snapshots
from reconciler.table.locations import local_name

_FINISHED = ("COMPLETED", "TERMINATED")


@dataclass(frozen=True)
class Explanation:
    supervisor_id: str
    partition: str
    start: int
    end: int
    kind: str  # gap | overlap | ahead
    text: str
    generation: int | None = None  # None: any generation (entries from before generations)
    pending: bool = False  # a running backfill will read it: neither missing nor failing


@dataclass(frozen=True)
class SupervisorFacts:
    """What the database says of one supervisor, for the anchors."""

    id: str
    kind: str  # main | backfill
    state: str
    generation: int
    checkpoints: Mapping[str, int]
    first_offsets: Mapping[str, int | None] = field(default_factory=dict)
    end_offsets: Mapping[str, int] | None = None  # a backfill's bound


@dataclass(frozen=True)
class Finding:
    kind: str  # gap | overlap | ahead
    lineage: str
    partition: str
    start: int
    end: int
    explanation: str | None = None
    batches: tuple[str, ...] = ()
    pending: bool = False

    @property
    def fails(self) -> bool:
        return self.kind == "overlap" or self.explanation is None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "supervisor": self.lineage, "partition": self.partition, "start": self.start,
                "end": self.end, "records": self.end - self.start, "explanation": self.explanation,
                "batches": list(self.batches), "fails": self.fails, "pending": self.pending}


@dataclass(frozen=True)
class Coverage:
    lineage: str
    partition: str
    start: int
    end: int
    batches: int


@dataclass
class DeepCheck:
    rows: int = 0
    dead_letters: int = 0
    duplicates: list[tuple[str, int, int]] = field(default_factory=list)  # (partition, offset, count)
    holes: int = 0  # offsets in a range without a record (informational: markers, tracking entries)
    missing: list[tuple[str, int]] = field(default_factory=list)  # (partition, records delivered but not in the table)
    outside: int = 0  # (partition, offset) of a row that no range covers
    skipped: str | None = None  # why the deep check could not run
    replayed: int = 0  # rows dead-letter replays appended (counted once, in their batch's range)

    @property
    def fails(self) -> bool:
        return bool(self.duplicates or self.missing or self.outside)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "deadLetters": self.dead_letters, "holes": self.holes, "skipped": self.skipped,
                "replayed": self.replayed,
                "duplicates": [{"partition": p, "offset": o, "count": n} for p, o, n in self.duplicates[:100]],
                "duplicateOffsets": len(self.duplicates), "outside": self.outside,
                "missing": [{"partition": p, "records": n} for p, n in self.missing]}


@dataclass
class VerifyReport:
    datasource: str
    snapshots: int
    coverage: list[Coverage]
    findings: list[Finding]
    deep: DeepCheck | None = None
    missing_files: list[str] = field(default_factory=list)
    anchored: bool = False  # the database's checkpoints were checked against the ranges

    @property
    def ok(self) -> bool:
        return (not any(f.fails for f in self.findings) and not self.missing_files
                and not (self.deep and self.deep.fails))

    def to_dict(self) -> dict[str, Any]:
        return {
            "datasource": self.datasource, "ok": self.ok, "batchSnapshots": self.snapshots,
            "anchored": self.anchored,
            "coverage": [{"supervisor": c.lineage, "partition": c.partition, "start": c.start, "end": c.end,
                          "batches": c.batches} for c in self.coverage],
            "findings": [f.to_dict() for f in self.findings],
            "missingFiles": self.missing_files[:100], "missingFileCount": len(self.missing_files),
            "deep": self.deep.to_dict() if self.deep else None,
        }


def lineage_of(supervisor_id: str) -> str:
    m = BACKFILL_ID.match(supervisor_id)
    return m.group("parent") if m else supervisor_id


def _label(lineage: str, generation: int) -> str:
    return summary.range_key(lineage, generation)


def explanations(history: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Explanation]:
    """Why ranges were skipped or read twice, from audit entries (``Store.history``) by supervisor."""
    out: list[Explanation] = []
    for sid, entries in history.items():
        for e in entries:
            details = e.get("details") or {}
            at = str(e.get("at", ""))[:19]
            action = e.get("action", "")
            for p, (s, end) in (details.get("lostRanges") or {}).items():
                out.append(Explanation(sid, str(p), int(s), int(end), "gap",
                                       f"deleted by the broker's retention before it was ingested ({action} at {at})"))
            for p, (s, end) in (details.get("unreadRanges") or {}).items():
                out.append(Explanation(sid, str(p), int(s), int(end), "gap", f"backfill {sid} cancelled at {at}"))
            for part in details.get("partitions") or ():
                c, new = part.get("checkpoint"), part.get("new")
                if c is None or new is None:
                    continue
                if new > c and not part.get("backfill"):
                    out.append(Explanation(sid, str(part["partition"]), int(c), int(new), "gap",
                                           f"operator {action} at {at} skipped it without a backfill"))
                elif new < c:
                    text = f"operator rewind ({action} at {at}) re-read it"
                    out.append(Explanation(sid, str(part["partition"]), int(new), int(c), "overlap", text))
                    out.append(Explanation(sid, str(part["partition"]), int(new), int(c), "ahead", text))
    return out


def pending(facts: Mapping[str, SupervisorFacts]) -> list[Explanation]:
    """What running backfills have still to read: pending, neither missing nor explained."""
    out = []
    for f in facts.values():
        if f.kind != "backfill" or f.state in _FINISHED or not f.end_offsets:
            continue
        for p, end in f.end_offsets.items():
            at = f.checkpoints.get(p, end)
            if at < end:
                out.append(Explanation(f.id, str(p), int(at), int(end), "gap",
                                       f"backfill {f.id} has not read it yet ({f.state})", f.generation, True))
    return out


def _explain(kind: str, lineage: str, generation: int, partition: str, start: int, end: int,
             known: Iterable[Explanation]) -> tuple[str | None, bool]:
    """The explanations that together cover ``[start, end)`` (and whether all of them are
    pending), or (None, False) if any offset is not covered."""
    pieces = sorted((x for x in known if x.kind == kind and x.partition == partition
                     and lineage_of(x.supervisor_id) == lineage
                     and (x.generation is None or x.generation == generation)
                     and x.start < end and x.end > start),
                    key=lambda x: x.start)
    at, texts, all_pending = start, [], True
    for x in pieces:
        if x.start > at:
            return None, False
        if x.end > at:
            texts.append(x.text)
            all_pending = all_pending and x.pending
            at = x.end
        if at >= end:
            break
    if at < end:
        return None, False
    return "; ".join(dict.fromkeys(texts)), all_pending


def check_ranges(datasource: str, snaps: Sequence[BatchSnapshot], known: Sequence[Explanation],
                 facts: Mapping[str, SupervisorFacts] | None = None) -> VerifyReport:
    """Tile each (lineage, generation, partition) with its snapshots' ranges; with ``facts``,
    anchor the tiling at each partition's first offset and the main checkpoint."""
    spans: dict[tuple[str, int, str], list[tuple[int, int, str]]] = collections.defaultdict(list)
    for snap in snaps:
        for p, s, e in snap.ranges:
            if e > s:
                spans[(lineage_of(snap.supervisor_id), snap.generation, p)].append((s, e, snap.batch_id))
    known = list(known) + (pending(facts) if facts else [])
    coverage, findings = [], []

    def gap(lineage, gen, p, s, e, batches=()):
        text, is_pending = _explain("gap", lineage, gen, p, s, e, known)
        findings.append(Finding("gap", _label(lineage, gen), p, s, e, text, tuple(batches), is_pending))

    ends: dict[tuple[str, int, str], tuple[int, int]] = {}
    for (lineage, gen, p), items in sorted(spans.items()):
        items.sort()
        cursor, last_batch = items[0][0], None
        for s, e, batch in items:
            if s > cursor:
                gap(lineage, gen, p, cursor, s, [b for b in (last_batch, batch) if b])
            elif s < cursor:
                hi = min(cursor, e)
                text, _ = _explain("overlap", lineage, gen, p, s, hi, known)
                findings.append(Finding("overlap", _label(lineage, gen), p, s, hi, text,
                                        tuple(b for b in (last_batch, batch) if b)))
            if e >= cursor:
                cursor, last_batch = e, batch
        coverage.append(Coverage(_label(lineage, gen), p, items[0][0], cursor, len(items)))
        ends[(lineage, gen, p)] = (items[0][0], cursor)
    for main in (facts or {}).values():
        if main.kind != "main":
            continue
        for p, checkpoint in sorted(main.checkpoints.items()):
            first = main.first_offsets.get(p)
            start, end = ends.get((main.id, main.generation, p), (None, None))
            if start is None:
                if first is not None and checkpoint > first:
                    gap(main.id, main.generation, p, first, checkpoint)
                continue
            if first is not None and start > first:
                gap(main.id, main.generation, p, first, start)
            if end < checkpoint:
                gap(main.id, main.generation, p, end, checkpoint)
            elif end > checkpoint:
                text, is_pending = _explain("ahead", main.id, main.generation, p, checkpoint, end, known)
                findings.append(Finding("ahead", _label(main.id, main.generation), p, checkpoint, end, text,
                                        pending=is_pending))
    findings.sort(key=lambda f: (f.lineage, f.partition, f.start, f.kind))
    return VerifyReport(datasource, len(snaps), coverage, findings, anchored=bool(facts))


def verify(table, datasource: str, history: Mapping[str, Sequence[Mapping[str, Any]]], *,
           deep: bool = False, dead_table=None, facts: Mapping[str, SupervisorFacts] | None = None) -> VerifyReport:
    """Check a table's batch snapshots; ``history``: audit entries of the supervisors concerned;
    ``facts``: their checkpoints and states (the anchors), when the database is at hand."""
    snaps = _snapshots(table)
    known = explanations(history) + (_unrecorded(table, snaps, facts) if facts else [])
    report = check_ranges(datasource, snaps, known, facts)
    report.missing_files = missing_files(table) + (missing_files(dead_table) if dead_table is not None else [])
    if deep:
        if report.missing_files:
            report.deep = DeepCheck(skipped=f"{len(report.missing_files)} referenced file(s) are missing")
        else:
            report.deep = deep_check(table, dead_table, snaps, _expired_read(table))
    return report


def _unrecorded(table, snaps: list[BatchSnapshot], facts: Mapping[str, SupervisorFacts]) -> list[Explanation]:
    """An external catalog's batches in the table that the database records next: pending."""
    from reconciler.table.unrecorded import head_ranges

    out = []
    for f in facts.values():
        if f.kind == "main":
            for p, (s, e, ids) in head_ranges(table.metadata, f.id, f.generation, f.checkpoints, snaps).items():
                text = f"committed in the table, recorded by the next step (batch {', '.join(b[:12] for b in ids)})"
                out.append(Explanation(f.id, p, s, e, "ahead", text, f.generation, True))
    return out


def _snapshots(table) -> list[BatchSnapshot]:
    """The batch snapshots, with the ranges of expired ones folded in front."""
    folded = []
    for key, ranges in summary.expired_ranges(table.properties).items():
        sid, gen = summary.parse_range_key(key)
        folded.append(BatchSnapshot(0, EPOCH_START, sid, "(expired snapshots)", 0, tuple(ranges), gen))
    return folded + batch_snapshots(table)


def _expired_read(table) -> dict[str, dict[str, int]]:
    return summary.expired_read(table.properties)


def missing_files(table) -> list[str]:
    """Files the current metadata references that do not exist: the metadata file, the
    current snapshot's manifest list and manifests, and the data files they list."""
    from reconciler.table.reach import _ManifestReader

    paths = [table.metadata_location]
    snap = table.current_snapshot()
    if snap is not None:
        paths.append(snap.manifest_list)
        reader = _ManifestReader(table.io)
        try:
            manifests = reader.manifests(snap)
        except FileNotFoundError:
            return _absent(paths, table.location())
        for m in manifests:
            paths.append(m.manifest_path)
            try:
                paths += reader.data_files(m, live_only=True)
            except FileNotFoundError:
                continue
    return _absent(paths, table.location())


def _absent(paths: list[str], root: str) -> list[str]:
    """``paths`` that do not exist: on an object store one listing of the table's prefix
    instead of a HEAD per object."""
    from reconciler.table import storage

    if storage.is_object_store(root):
        listed = storage.at(root).list(root)
        inside = root.rstrip("/") + "/"
        return sorted(p for p in paths
                      if (p not in listed if p.startswith(inside) else not _exists(p)))
    return sorted(p for p in paths if not _exists(p))


def _exists(location: str) -> bool:
    try:
        name = local_name(location)
    except ValueError:  # an object store: one HEAD per object (storage.py)
        from reconciler.table import storage

        return bool(storage.at(location).exists([location]))
    try:
        os.stat(name)  # a string, not a Path: at 100,000 live files the Path cost more than the stat
    except OSError as exc:
        # as Path.exists: absent, or a symlink loop; any other error (EACCES, EIO, a stale
        # mount) is raised, since a file verify cannot look at is not a missing one
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EBADF):
            return False
        raise
    return True


def deep_check(table, dead_table, snaps: Sequence[BatchSnapshot],
               expired_read: Mapping[str, Mapping[str, int]] | None = None) -> DeepCheck:
    import pyarrow as pa
    import pyarrow.compute as pc

    names = {f.name for f in table.schema().fields}
    if not {"__partition", "__offset"} <= names:
        return DeepCheck(skipped="the datasource does not keep __partition and __offset as dimensions")
    rows = table.scan(selected_fields=("__partition", "__offset")).to_arrow()
    if rows.num_rows and rows.column("__offset").null_count == rows.num_rows:
        return DeepCheck(skipped="__offset is empty (rolled-up rows carry no offsets)")
    parts = [rows.rename_columns(["partition", "offset"])]
    dead_rows = 0
    if dead_table is not None:
        dead = dead_table.scan(selected_fields=("partition", "offset")).to_arrow()
        dead_rows = dead.num_rows
        parts.append(dead.select(["partition", "offset"]))
    both = pa.concat_tables([t.cast(pa.schema([("partition", pa.string()), ("offset", pa.int64())]))
                             for t in parts])
    counts = both.group_by(["partition", "offset"]).aggregate([([], "count_all")])
    # A (partition, offset) names one record per source whose ranges cover it (two
    # supervisors into one datasource, one supervisor across a fresh start): the rows carry
    # no source, so each is allowed as many rows as sources cover it, and no more.
    sources = _sources(counts, snaps)
    found_rows = pc.min_element_wise(counts.column("count_all"), pa.array(sources, pa.int64()))
    over = pc.greater(counts.column("count_all"), pa.array([max(n, 1) for n in sources], pa.int64()))
    dupes = counts.filter(over)
    duplicates = sorted(zip(dupes.column("partition").to_pylist(), dupes.column("offset").to_pylist(),
                            dupes.column("count_all").to_pylist(), strict=True))
    expected = sum(e - s for snap in snaps for _, s, e in snap.ranges)
    held = collections.Counter()
    for p, n in zip(counts.column("partition").to_pylist(), found_rows.to_pylist(), strict=True):
        held[p] += n
    holes = max(0, expected - sum(held.values()))
    outside = sum(1 for n in sources if n == 0)
    return DeepCheck(rows=rows.num_rows, dead_letters=dead_rows, duplicates=duplicates, holes=holes,
                     missing=_missing(snaps, expired_read or {}, held), outside=outside, replayed=_replayed(table))


def _replayed(table) -> int:
    """Records replayed from the dead letters (``table.replay``) in the current lineage. A
    replay's snapshot carries no ranges: its rows sit in the range of the batch that
    dead-lettered them, and the same commit took them out of the dead-letter table, so the
    count per (partition, offset) above sees each once: never a duplicate, never missing."""
    from pyiceberg.table.snapshots import ancestors_of

    current = table.current_snapshot()
    if current is None:
        return 0
    total = 0
    for snap in ancestors_of(current, table.metadata):
        props = dict(snap.summary.additional_properties) if snap.summary else {}
        if props.get(summary.OPERATION) == "replay":
            total += int(props.get("reconciler.replayed", "0") or 0)
    return total


def _sources(counts, snaps: Sequence[BatchSnapshot]) -> list[int]:
    """For each (partition, offset) of ``counts``: how many sources (lineage and
    generation) have a range that covers it (0: a row no range covers)."""
    import numpy as np

    by_part: dict[str, dict[tuple[str, int], list[tuple[int, int]]]] = collections.defaultdict(
        lambda: collections.defaultdict(list))
    for snap in snaps:
        for p, s, e in snap.ranges:
            by_part[p][(lineage_of(snap.supervisor_id), snap.generation)].append((s, e))
    partitions = counts.column("partition").to_numpy(zero_copy_only=False)
    offsets = counts.column("offset").to_numpy(zero_copy_only=False)
    out = np.zeros(len(offsets), dtype=np.int64)
    for p in set(partitions.tolist()):
        at = partitions == p
        mine = offsets[at]
        n = np.zeros(len(mine), dtype=np.int64)
        for ranges in by_part.get(p, {}).values():
            covered = np.zeros(len(mine), dtype=bool)
            for s, e in ranges:
                covered |= (mine >= s) & (mine < e)
            n += covered
        out[at] = n
    return out.tolist()


def _missing(snaps: Sequence[BatchSnapshot], expired_read: Mapping[str, Mapping[str, int]],
             found: Mapping[str, int]) -> list[tuple[str, int]]:
    """Per partition, records the readers delivered that the table does not hold; only
    where every range of the partition comes with its delivered count."""
    delivered: dict[str, int] = collections.Counter()
    unknown: set[str] = set()
    for snap in snaps:
        if snap.batch_id == "(expired snapshots)":
            counts = expired_read.get(snap.key)
        else:
            counts = snap.read
        for p, s, e in snap.ranges:
            if e <= s:
                continue
            if counts is None or p not in counts:
                unknown.add(p)
        if counts is not None:
            for p, n in counts.items():
                delivered[p] += int(n)
    return sorted((p, n - found.get(p, 0)) for p, n in delivered.items()
                  if p not in unknown and n > found.get(p, 0))

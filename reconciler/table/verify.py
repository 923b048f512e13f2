"""Exactly once, proven from the table: the offset ranges of its batch snapshots.

Per supervisor lineage (a main supervisor and its backfills ``<id>-backfill-<n>``
together cover one stream) and partition, the ranges of the current lineage's batch
snapshots, sorted, must tile the offsets: an offset in two snapshots is an overlap
(records twice), an offset between ranges a gap (records missing). A gap is explained
when the audit log says why no batch read it: the broker's retention deleted it, an
operator reset skipped it without a backfill, or a backfill was cancelled. Overlaps
are reported with the rewind that caused them, if any, and always fail: the table
holds those records twice.

``deep`` also reads ``__partition``/``__offset`` (when the datasource keeps them as
dimensions and does not roll up) from the data files and the dead-letter table and
counts each (partition, offset): more than one is a duplicate; none inside a range is
a hole (informational: a transaction marker or a compacted record has an offset and
no record).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reconciler.model import BACKFILL_ID
from reconciler.table.files import EPOCH_START, BatchSnapshot, batch_snapshots


@dataclass(frozen=True)
class Explanation:
    supervisor_id: str
    partition: str
    start: int
    end: int
    kind: str  # gap | overlap
    text: str


@dataclass(frozen=True)
class Finding:
    kind: str  # gap | overlap
    lineage: str
    partition: str
    start: int
    end: int
    explanation: str | None = None
    batches: tuple[str, ...] = ()

    @property
    def fails(self) -> bool:
        return self.kind == "overlap" or self.explanation is None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "supervisor": self.lineage, "partition": self.partition, "start": self.start,
                "end": self.end, "records": self.end - self.start, "explanation": self.explanation,
                "batches": list(self.batches), "fails": self.fails}


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
    holes: int = 0
    skipped: str | None = None  # why the deep check could not run

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "deadLetters": self.dead_letters, "holes": self.holes, "skipped": self.skipped,
                "duplicates": [{"partition": p, "offset": o, "count": n} for p, o, n in self.duplicates[:100]],
                "duplicateOffsets": len(self.duplicates)}


@dataclass
class VerifyReport:
    datasource: str
    snapshots: int
    coverage: list[Coverage]
    findings: list[Finding]
    deep: DeepCheck | None = None

    @property
    def ok(self) -> bool:
        return not any(f.fails for f in self.findings) and not (self.deep and self.deep.duplicates)

    def to_dict(self) -> dict[str, Any]:
        return {
            "datasource": self.datasource, "ok": self.ok, "batchSnapshots": self.snapshots,
            "coverage": [{"supervisor": c.lineage, "partition": c.partition, "start": c.start, "end": c.end,
                          "batches": c.batches} for c in self.coverage],
            "findings": [f.to_dict() for f in self.findings],
            "deep": self.deep.to_dict() if self.deep else None,
        }


def lineage_of(supervisor_id: str) -> str:
    m = BACKFILL_ID.match(supervisor_id)
    return m.group("parent") if m else supervisor_id


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
                    out.append(Explanation(sid, str(part["partition"]), int(new), int(c), "overlap",
                                           f"operator rewind ({action} at {at}) re-read it"))
    return out


def _explain(kind: str, lineage: str, partition: str, start: int, end: int,
             known: Iterable[Explanation]) -> str | None:
    """The explanations that together cover ``[start, end)``, or None if any offset is not covered."""
    pieces = sorted((x for x in known if x.kind == kind and x.partition == partition
                     and lineage_of(x.supervisor_id) == lineage and x.start < end and x.end > start),
                    key=lambda x: x.start)
    at, texts = start, []
    for x in pieces:
        if x.start > at:
            return None
        if x.end > at:
            texts.append(x.text)
            at = x.end
        if at >= end:
            break
    return "; ".join(dict.fromkeys(texts)) if at >= end else None


def check_ranges(datasource: str, snaps: Sequence[BatchSnapshot], known: Sequence[Explanation]) -> VerifyReport:
    spans: dict[tuple[str, str], list[tuple[int, int, str]]] = collections.defaultdict(list)
    for snap in snaps:
        for p, s, e in snap.ranges:
            if e > s:
                spans[(lineage_of(snap.supervisor_id), p)].append((s, e, snap.batch_id))
    coverage, findings = [], []
    for (lineage, p), items in sorted(spans.items()):
        items.sort()
        cursor, last_batch = items[0][0], None
        for s, e, batch in items:
            if s > cursor:
                findings.append(Finding("gap", lineage, p, cursor, s, _explain("gap", lineage, p, cursor, s, known),
                                        tuple(b for b in (last_batch, batch) if b)))
            elif s < cursor:
                hi = min(cursor, e)
                findings.append(Finding("overlap", lineage, p, s, hi, _explain("overlap", lineage, p, s, hi, known),
                                        tuple(b for b in (last_batch, batch) if b)))
            if e >= cursor:
                cursor, last_batch = e, batch
        coverage.append(Coverage(lineage, p, items[0][0], cursor, len(items)))
    return VerifyReport(datasource, len(snaps), coverage, findings)


def verify(table, datasource: str, history: Mapping[str, Sequence[Mapping[str, Any]]], *,
           deep: bool = False, dead_table=None) -> VerifyReport:
    """Check a table's batch snapshots; ``history``: audit entries of the supervisors concerned."""
    from reconciler.table.expire import expired_ranges

    # Ranges of snapshots ``maintain`` expired were folded into a table property: still checked.
    folded = [BatchSnapshot(0, EPOCH_START, sid, "(expired snapshots)", 0, tuple(ranges))
              for sid, ranges in expired_ranges(table).items()]
    snaps = folded + batch_snapshots(table)
    report = check_ranges(datasource, snaps, explanations(history))
    if deep:
        report.deep = deep_check(table, dead_table, snaps)
    return report


def deep_check(table, dead_table, snaps: Sequence[BatchSnapshot]) -> DeepCheck:
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
    dupes = counts.filter(pc.greater(counts.column("count_all"), 1))
    duplicates = sorted(zip(dupes.column("partition").to_pylist(), dupes.column("offset").to_pylist(),
                            dupes.column("count_all").to_pylist(), strict=True))
    expected = sum(e - s for snap in snaps for _, s, e in snap.ranges)
    holes = max(0, expected - counts.num_rows)
    return DeepCheck(rows=rows.num_rows, dead_letters=dead_rows, duplicates=duplicates, holes=holes)

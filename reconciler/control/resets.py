"""Reset arithmetic: where each partition's checkpoint goes and what a backfill covers.

Pure functions. The same ``compute_reset`` runs three times for one request: in
``plan``/``--dry-run`` to preview, and inside the reset transaction on the checkpoint
read under lock (the only one that counts). Rules:

* ``latest`` never moves a checkpoint backwards: new = max(C, L). A broker that
  under-reports its end (Tansu) therefore cannot cause a re-read.
* any other position that would move a partition backwards is a rewind: refused
  unless the request says ``allowRewind``, and then reported as records read again.
* a forward jump with backfill yields the range ``[C, new)`` for the backfill
  supervisor; without backfill the same range is reported as skipped.
* explicit offsets outside ``[earliest, latest]`` are refused with the valid range.
* retention: what the broker deleted cannot be ingested. A backfill starts at
  max(C, earliest); ``[C, earliest)`` is reported as lost (never a backfill that
  retries a deleted range, never a silent skip).
* a partition without a checkpoint is filled by ``fill_missing``: from ``startFrom``
  for a supervisor that never had a checkpoint, from earliest for a partition that
  appeared after it started (its records belong to the backfill, none skipped).
* a checkpointed partition the source no longer has is an error, not a silent drop.
* a source that started over below the checkpoint (a topic deleted and created again, a
  partition truncated): the records below the checkpoint are new ones. ``renew`` turns a
  rewind there from "read again" into "new records, read once in a new source generation",
  which the reset transaction begins (``Store.apply_reset``); ``reset --dry-run`` says the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from reconciler.model import Position


@dataclass(frozen=True)
class PartitionReset:
    partition: str
    checkpoint: int
    earliest: int
    latest: int
    new: int
    backfill: int = 0  # records the backfill supervisor will ingest: [checkpoint, new)
    skipped: int = 0  # records a no-backfill forward jump skips
    reread: int = 0  # records an allowed rewind reads again
    lost: int = 0  # records [checkpoint, earliest) the broker deleted before they were ingested
    renewed: int = 0  # records below the checkpoint of a source that started over: new ones, read once

    @property
    def backfill_start(self) -> int:
        """Where the backfill of this partition starts: past what retention deleted."""
        return self.checkpoint + self.lost

    def to_dict(self) -> dict:
        return {
            "partition": self.partition,
            "checkpoint": self.checkpoint,
            "earliest": self.earliest,
            "latest": self.latest,
            "new": self.new,
            "backfill": self.backfill,
            "skipped": self.skipped,
            "reread": self.reread,
            "lost": self.lost,
            "renewed": self.renewed,
        }


@dataclass(frozen=True)
class ResetOutcome:
    partitions: tuple[PartitionReset, ...]
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def new_offsets(self) -> dict[str, int]:
        return {p.partition: p.new for p in self.partitions}

    @property
    def backfill_ranges(self) -> dict[str, tuple[int, int]]:
        """Non-empty ``[start, end)`` per partition for the backfill supervisor."""
        return {p.partition: (p.backfill_start, p.new) for p in self.partitions if p.backfill > 0}

    @property
    def backfill_records(self) -> int:
        return sum(p.backfill for p in self.partitions)

    @property
    def lost_records(self) -> int:
        return sum(p.lost for p in self.partitions)

    @property
    def lost_ranges(self) -> dict[str, tuple[int, int]]:
        """``[checkpoint, earliest)`` per partition that retention deleted before it was ingested."""
        return {p.partition: (p.checkpoint, p.backfill_start) for p in self.partitions if p.lost > 0}

    @property
    def changed(self) -> bool:
        return any(p.new != p.checkpoint for p in self.partitions)


@dataclass(frozen=True)
class Positions:
    """What the stream said, captured before the reset transaction."""

    earliest: Mapping[str, int]
    latest: Mapping[str, int]
    for_time: Mapping[str, int] | None = None  # offsets_for_time of a timestamp position
    start_from: Mapping[str, int] | None = None  # what the spec's startFrom gives (never-started supervisor)
    # why the source started over below the checkpoint (``runtime.startedover``), or None: the
    # plan's preview then says what the reset will do there (``renew``), as ``reset --dry-run`` does
    started_over: str | None = None


def fill_missing(checkpoint: Mapping[str, int], earliest: Mapping[str, int],
                 start_from: Mapping[str, int] | None = None) -> dict[str, int]:
    """The checkpoint completed for every partition the source has: the one rule, shared by
    the plan preview, ``reset --dry-run`` and the reset transaction.

    A supervisor that never had a checkpoint starts where ``startFrom`` says. Once it has
    one, a partition without one appeared after it started (partitions added to a topic,
    a stream added to the list): it is read from its earliest offset, because taking
    ``latest`` there would skip records nobody asked to skip.
    """
    out = {p: int(o) for p, o in checkpoint.items()}
    started = bool(out)
    start_from = start_from or {}
    for p in sorted(set(earliest) | set(start_from), key=_partition_order):
        if p in out:
            continue
        if (not started and p in start_from) or p not in earliest:
            out[p] = int(start_from[p])
        else:
            out[p] = int(earliest[p])
    return out


def start_offsets(start_from: Position, positions: Positions) -> Mapping[str, int] | None:
    """Where ``startFrom`` puts a partition without a checkpoint, from what a capture found.

    The captured ``positions.start_from`` when there is one (``positions.capture`` always
    fills it); else ``earliest`` or ``latest`` of the capture. A ``timestamp`` needs the
    broker's offsets at that time, which only a capture can ask for: None without them.
    """
    if positions.start_from is not None:
        return positions.start_from
    if start_from.kind == "latest":
        return positions.latest
    if start_from.kind == "timestamp":
        return None
    return positions.earliest


def fill_from(checkpoint: Mapping[str, int], positions: Positions, start_from: Position) -> dict[str, int]:
    """``fill_missing`` with what a capture found and the spec's ``startFrom``: the plan
    preview, ``reset --dry-run`` and (through ``positions.capture``) the reset transaction
    fill alike. ``ValueError`` for a supervisor that never had a checkpoint whose
    ``startFrom: timestamp`` offsets were not captured (no guess from earliest)."""
    initial = start_offsets(start_from, positions)
    if initial is None and not checkpoint:
        raise ValueError(f"startFrom {start_from}: the offsets at that time were not captured")
    return fill_missing(checkpoint, positions.earliest, initial)


def _target(position: Position, partition: str, c: int, pos: Positions) -> int:
    if position.kind == "latest":
        return pos.latest[partition]
    if position.kind == "earliest":
        return pos.earliest[partition]
    if position.kind == "timestamp":
        assert pos.for_time is not None, "timestamp position needs offsets_for_time"
        return pos.for_time[partition]
    if position.kind == "shiftBy":
        return c + int(position.shift or 0)
    offsets = position.offsets or {}
    return int(offsets[partition]) if partition in offsets else c


def compute_reset(
    position: Position,
    checkpoint: Mapping[str, int],
    positions: Positions,
    *,
    backfill: bool,
    allow_rewind: bool = False,
) -> ResetOutcome:
    """Where every partition's checkpoint goes, and why. ``checkpoint`` must be complete."""
    errors: list[str] = []
    warnings: list[str] = []
    if position.kind == "offsets":
        unknown = sorted(set(position.offsets or {}) - set(positions.latest))
        if unknown:
            errors.append(
                f"unknown partition(s) {', '.join(unknown)}; the source has {', '.join(sorted(positions.latest))}"
            )
    gone = sorted(set(checkpoint) - set(positions.latest), key=_partition_order)
    if gone:
        errors.append(
            f"partition(s) {', '.join(gone)} have a checkpoint but the source no longer has them "
            "(a stream removed from the list or deleted on the broker, or a topic re-created); "
            "restore them, or declare the new source with freshStart: true"
        )
    out: list[PartitionReset] = []
    for p in sorted(positions.latest, key=_partition_order):
        c = checkpoint[p]
        lo, hi = positions.earliest[p], positions.latest[p]
        target = _target(position, p, c, positions)
        if position.kind == "offsets" and p in (position.offsets or {}) and not lo <= target <= hi:
            errors.append(f"partition {p}: offset {target} is outside the valid range [{lo}, {hi}]")
            target = c
        if position.kind == "shiftBy" and not lo <= target <= hi:
            clamped = min(max(target, lo), hi)
            warnings.append(f"partition {p}: shift to {target} clamped to {clamped} (valid range [{lo}, {hi}])")
            target = clamped
        if target >= c:
            start = min(max(c, lo), target)  # retention deleted [c, lo): it is lost, not backfilled
            gap = target - start
            out.append(PartitionReset(p, c, lo, hi, target, backfill=gap if backfill else 0,
                                      skipped=0 if backfill else gap, lost=start - c))
        elif position.kind == "latest":
            out.append(PartitionReset(p, c, lo, hi, c))  # the broker under-reported its end
        elif allow_rewind:
            out.append(PartitionReset(p, c, lo, hi, target, reread=c - target))
        else:
            errors.append(
                f"partition {p}: moving the checkpoint back from {c} to {target} {READ_AGAIN.format(n=c - target)}; "
                "ask for it explicitly (allowRewind: true / --allow-rewind)"
            )
            out.append(PartitionReset(p, c, lo, hi, c))
    result = ResetOutcome(tuple(out), tuple(errors), tuple(warnings))
    skipped = sum(p.skipped for p in out)
    reread = sum(p.reread for p in out)
    lost = [p for p in out if p.lost]
    if lost:
        ranges = ", ".join(f"{p.partition}: [{p.checkpoint}, {p.backfill_start})" for p in lost)
        warnings.append(f"retention: {sum(p.lost for p in lost)} records were deleted by the broker before "
                        f"they were ingested and are lost ({ranges})")
    if skipped:
        warnings.append(f"no backfill: {skipped} records will be skipped")
    if reread:
        warnings.append(f"{REWIND} {reread} records will be read again (duplicates by request)")
    return ResetOutcome(result.partitions, result.errors, tuple(warnings))


REWIND = "rewind:"
RENEWED = "the source started over"  # how ``renew``'s warning begins: said again by the applier's message
READ_AGAIN = "would read {n} records again"


def renew(outcome: ResetOutcome, why: str, generation: str) -> ResetOutcome:
    """``outcome`` for a source that started over below the checkpoint (``why``): what a rewind
    reads there are the new source's records, read once, in source generation ``generation``
    (e.g. ``clicks@1``), not records read again. Used by ``reset --dry-run`` and by the reset
    transaction alike, so the preview says what the reset does."""
    parts = tuple(replace(p, reread=0, renewed=p.reread) for p in outcome.partitions)
    renewed = sum(p.renewed for p in parts)
    warnings = [w for w in outcome.warnings if not w.startswith(REWIND)]
    if renewed:
        warnings.append(f"{RENEWED} ({why}): the {renewed} records below the checkpoints are new "
                        f"ones, read once in a new source generation ({generation}); nothing is read twice")
    errors = tuple(e.replace("records again", "records there (new ones of the new source, none read twice)")
                   if "would read" in e else e for e in outcome.errors)
    return ResetOutcome(parts, errors, tuple(warnings))


def _partition_order(p: str) -> tuple[int, int | str]:
    return (0, int(p)) if p.isdigit() else (1, p)

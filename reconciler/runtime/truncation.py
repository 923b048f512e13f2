"""A source that started over below the checkpoint: never read as caught up, never skipped.

A topic deleted and created again, a partition truncated by an unclean leader election, a
RabbitMQ stream deleted and declared again: the offsets start again, and the records below
the old checkpoint are new ones. Read naively, the step cuts ``[checkpoint, latest)`` (or
nothing, with a checkpoint at or above the new end, which reads as IDLE) and the new
records below the checkpoint are skipped without a word.

Asked at every step of a main supervisor, before anything is cut or called caught up
(``runtime.sourceguard``, which also asks the fingerprint, checks backfills and checks the
identity again between a batch's read and its publish):

* the source's identity (Kafka's topic id), compared with the one recorded for this source
  generation: a different one is proof, whatever the offsets say; none, once one was
  recorded, is a lookup that failed (``RetryableError``), never "a broker without ids";
* else, for each partition whose checkpoint is above the end the broker reports, whether
  the partition still holds the record below the checkpoint (the last one ingested). A
  reported end below the checkpoint alone proves nothing: Tansu under-reports its end.

A Kafka topic is re-created as a whole: one partition proven re-created (by any of these
signs, or the fingerprint's) moves every partition of the topic, unless the id, unchanged,
proves the topic is the same one (``decide``). What follows is the retention-loss rule (``SupervisorRuntime._past_retention``): with
``onRetentionLoss: continue`` the truncated partitions go back to the new earliest offset
in a new source generation, recorded in the audit log (``Store.restart_source``); by
default the supervisor turns UNHEALTHY with what happened and the way out. ``decide`` is
pure; ``detect`` asks the adapter.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from reconciler.errors import RetryableError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Restart:
    """The source started over: each partition of ``moves`` goes from its checkpoint back to
    the new earliest offset. No moves: a new identity whose offsets need no rewind (the
    operator rewound already, or nothing had been ingested)."""

    moves: Mapping[str, tuple[int, int]]
    identity: str | None
    previous: str | None
    why: str
    dropped: tuple[str, ...] = ()  # partitions the new source does not have: their checkpoints go

    @property
    def ranges(self) -> str:
        return ", ".join(f"{p}: {c} -> {n}" for p, (c, n) in sorted(self.moves.items(), key=_order))

    @property
    def reason(self) -> str:
        """One line for the audit log and the logs."""
        gone = (f"; partition(s) {', '.join(self.dropped)} are not in the new source: their checkpoints are "
                "dropped, and if they come back they are read from their earliest offset") if self.dropped else ""
        if not self.moves:
            return (f"{self.why}; no checkpoint is above the new earliest offsets, a new source generation "
                    f"begins{gone}")
        return (f"{self.why}; checkpoints moved back to the new earliest offsets ({self.ranges}): the new "
                f"records are read from there, and what the old source held beyond the checkpoints is lost{gone}")

    def unhealthy_message(self, supervisor_id: str) -> str:
        to = json.dumps({p: n for p, (_, n) in sorted(self.moves.items(), key=_order)})
        return (f"{self.why}: the offsets started again below the checkpoints, and the records there are new "
                f"ones, not read yet (checkpoint -> new earliest: {self.ranges}). Nothing is read until you "
                f"choose: `reconciler reset {supervisor_id} --to '{to}' --allow-rewind` reads the new records "
                "from the start, or set `onRetentionLoss: continue` in the spec to do so by itself "
                "(either way recorded in `reconciler history`)")


def suspects(checkpoint: Mapping[str, int], latest: Mapping[str, int]) -> dict[str, int]:
    """Per partition whose checkpoint is above the reported end: the offset to probe (the last
    record ingested)."""
    return {p: c - 1 for p, c in checkpoint.items() if p in latest and c > latest[p] and c > 0}


def decide(checkpoint: Mapping[str, int], earliest: Mapping[str, int], identity: str | None,
           previous: str | None, held: Mapping[str, bool], why: str | None = None, *,
           whole: bool = True) -> Restart | None:
    """Pure: whether the source started over, and where each partition goes. ``held``: per
    partition, whether it still holds the records ingested there (the probe, the fingerprint);
    ``why`` says how a False was found.

    ``whole``: the partitions are one source (a Kafka topic), deleted and created again
    together. One partition proven re-created then moves every partition: a partition with
    nothing to prove it by (a checkpoint set by ``startFrom: latest``, or no fingerprint yet)
    would otherwise keep its old checkpoint over the new topic's records below it, skipped.
    An unchanged id proves the topic was not re-created (a partition truncated alone, by an
    unclean leader election): only the partitions found move then. A RabbitMQ stream is its
    own source (``independent_partitions``): each is decided alone.

    A truncated partition whose checkpoint is at or below the new earliest offset moves
    nowhere here: the retention rule then reports what was deleted."""
    dropped = tuple(sorted((p for p in checkpoint if p not in earliest), key=_order))
    if identity is not None and previous is not None and identity != previous:
        moves = {p: (c, earliest[p]) for p, c in checkpoint.items() if p in earliest and c > earliest[p]}
        return Restart(moves, identity, previous, f"the source was deleted and created again (its id was "
                                                  f"{previous}, it is now {identity})", dropped)
    gone = sorted((p for p, ok in held.items() if not ok), key=_order)
    moves = {p: (checkpoint[p], earliest[p]) for p in gone if p in earliest and checkpoint[p] > earliest[p]}
    if not moves:
        return None
    why = why or (f"partition(s) {', '.join(moves)} no longer hold the last record ingested (the offset below the "
                  "checkpoint), and end below the checkpoint: truncated, or deleted and created again")
    if whole and not (identity is not None and identity == previous):
        others = {p: (c, earliest[p]) for p, c in checkpoint.items()
                  if p not in moves and p in earliest and c > earliest[p]}
        if others:
            moves |= others
            why += (f"; a topic is deleted and created again as a whole, so partition(s) "
                    f"{', '.join(sorted(others, key=_order))} go back to their new earliest offsets too (their "
                    "records below the checkpoint may be new ones too, with nothing to tell them apart)")
    return Restart(moves, identity, previous, why, dropped)


def detect(adapter, checkpoint: Mapping[str, int], latest: Mapping[str, int],
           previous: str | None) -> tuple[str | None, Restart | None]:
    """(the identity the source has now, and the restart found, if any). A source whose
    generation has an identity recorded and that answers none now failed to answer:
    ``RetryableError``, nothing is read (a broker does not stop giving ids)."""
    identity = _identity(adapter)
    if identity is None and previous is not None:
        raise RetryableError(f"the source gave no id, though this source generation's is {previous}: the lookup "
                             "failed, and nothing is read until it answers (a topic deleted and created again "
                             "would otherwise be read as the old one)")
    changed = identity is not None and previous is not None and identity != previous
    held: dict[str, bool] = {}
    if not changed:
        held = {p: _holds(adapter, p, o) for p, o in suspects(checkpoint, latest).items()}
        if all(held.values()):
            return identity, None
    return identity, decide(checkpoint, adapter.earliest(), identity, previous, held, whole=one_source(adapter))


def one_source(adapter) -> bool:
    """Whether the adapter's partitions are one source, re-created together (``decide``)."""
    return not getattr(adapter, "independent_partitions", False)


class SourceChanged(Exception):
    """The source's identity changed between the step's check and the end of its read: what
    was read belongs to another source, so the batch is discarded, never published."""


def _identity(adapter) -> str | None:
    ask = getattr(adapter, "identity", None)  # an adapter without the capability (a test's own)
    return ask() if ask is not None else None


def _holds(adapter, partition: str, offset: int) -> bool:
    ask = getattr(adapter, "holds", None)
    return ask(partition, offset) if ask is not None else True


def _order(item) -> tuple[int, int | str]:
    p = item[0] if isinstance(item, tuple) else item
    return (0, int(p)) if str(p).isdigit() else (1, str(p))

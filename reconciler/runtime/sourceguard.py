"""Is this still the source the checkpoints were taken on? Asked by every step, main or backfill.

``SupervisorRuntime`` keeps one ``SourceGuard``; it decides nothing about policy (the runtime
applies ``onRetentionLoss``), it finds:

* ``check`` (a main supervisor, before anything is cut or called caught up): the identity
  (``runtime.truncation``), and on the first step of the runtime and every
  ``RETENTION_CHECK_EVERY`` seconds the fingerprint (``runtime.fingerprint``);
* ``backfill_gone`` (a backfill, before it reads): whether its source started over since
  it was created: its main supervisor began a newer source generation, or the identity
  differs from the one recorded for the generation the backfill belongs to. Its range then
  names records of another source and can never be read;
* ``confirm`` (after a batch's read, before its publish): the identity again. A topic id
  never comes back, so the same id after the read proves the read was of the source
  checked; another one discards the batch (``truncation.SourceChanged``). One DescribeTopics
  per batch that read something, and only on sources that have ids.

A fingerprint answered "no record" or "another record" is checked against the earliest
offsets read again after the fetch: retention deleting the fingerprinted record during the
check (every mark meets retention once) is not a source that started over.

The window left: on a source without ids, a re-creation between two fingerprint checks
(at most ``RETENTION_CHECK_EVERY`` seconds) lets the step read records of the new source in
the old generation; once found, the new generation reads them again from the earliest
offset. Those are duplicates, not losses, and ``verify --deep`` cannot see them (it checks
each generation's offsets apart).
"""

from __future__ import annotations

import logging
import time

from reconciler.errors import RetryableError
from reconciler.runtime import fingerprint, truncation

log = logging.getLogger(__name__)


class SourceGuard:
    def __init__(self, store, check_every: float):
        self.store = store
        self.check_every = check_every
        self._identity: tuple[str, int, str | None] | None = None  # (lineage, generation, identity recorded)
        self._checked: float | None = None  # when the fingerprint was last asked (None: not in this runtime)
        self._marked: set[str] = set()  # partitions with a fingerprint for the generation
        self._tried: set[str] = set()  # partitions without one, tried since the last check

    def known(self, rec) -> str | None:
        """The identity recorded for the source generation the supervisor reads (a backfill's
        is its main supervisor's, for the generation the backfill was created in)."""
        owner = rec.parent_id if rec.bounded and rec.parent_id else rec.id
        if self._identity is None or self._identity[:2] != (owner, rec.generation):
            self._identity = (owner, rec.generation, self.store.source_identity(owner, rec.generation))
        return self._identity[2]

    def restarted(self, rec, generation: int, identity: str | None) -> None:
        """A new source generation began: its identity is the one answered, or unknown (recorded
        at the first answer), never the old one's."""
        self._identity = (rec.id, generation, identity)
        self._checked, self._marked, self._tried = None, set(), set()

    def check(self, rec, adapter, checkpoint, target) -> truncation.Restart | None:
        known = self.known(rec)
        identity, found = truncation.detect(adapter, checkpoint, target, known)
        if found is not None:
            return found
        # An id first seen for this source generation is recorded only once the fingerprint
        # found no other source: recorded before, the id of a topic re-created meanwhile would
        # read as this generation's, and an unchanged id proves the topic was not re-created.
        first_seen = identity is not None and known is None
        # A partition with records ingested and no fingerprint yet gets one at once (after the
        # generation's first publish), not a minute later; each is tried once between checks.
        unmarked = {p for p, c in checkpoint.items() if c > 0 and p not in self._marked and p not in self._tried}
        if (not unmarked and not first_seen and self._checked is not None
                and time.monotonic() - self._checked < self.check_every):
            return None
        self._tried |= unmarked
        found = self._fingerprint(rec, adapter, checkpoint, identity, known)
        if found is None and first_seen:
            self.store.note_identity(rec.id, identity, rec.generation, actor="reconciler")
            self._identity = (rec.id, rec.generation, identity)
        if found is None and not unmarked:
            self._checked, self._tried = time.monotonic(), set()
        return found

    def _fingerprint(self, rec, adapter, checkpoint, identity, known) -> truncation.Restart | None:
        earliest = adapter.earliest()
        stored = self.store.source_fingerprint(rec.id, rec.generation)
        live = {p: m for p, m in stored.items() if p in earliest and m[0] >= earliest[p]}  # retention took the others
        answers = fingerprint.ask(adapter, {p: m[0] for p, m in live.items()})
        whole = truncation.one_source(adapter)
        gone = fingerprint.replaced(live, answers)
        if gone:
            earliest, gone = _not_retention(adapter, gone, {p: live[p][0] for p in gone})
            if gone:
                return truncation.decide(checkpoint, earliest, identity, known, dict.fromkeys(gone, False),
                                         f"partition(s) {', '.join(gone)} no longer hold the records ingested "
                                         "there (another timestamp at an offset already read, or no record): "
                                         "deleted and created again, or truncated", whole=whole)
        kept = {p: m for p, m in live.items() if answers.get(p, m) == m}  # a compacted record: taken again
        want = {p: o for p, o in fingerprint.offsets_to_mark(checkpoint, earliest).items() if p not in kept}
        taken = {p: m for p, m in fingerprint.ask(adapter, want).items() if m is not None}
        if not stored and taken:  # nothing to compare with: was the record there when it was ingested?
            late = fingerprint.written_after(want, taken, self.store.ingested_at(rec.id, checkpoint))
            if late:
                earliest, late = _not_retention(adapter, late, want)
                if late:
                    return truncation.decide(checkpoint, earliest, identity, known, dict.fromkeys(late, False),
                                             f"partition(s) {', '.join(late)} hold, at the offset below the "
                                             "checkpoint, a record written after the batch that ingested that "
                                             f"offset committed (by more than {fingerprint.CLOCK_SKEW:g}s): "
                                             "deleted and created again since", whole=whole)
                # an answer about a record retention deleted meanwhile is no fingerprint
                taken = {p: m for p, m in taken.items() if m[0] >= earliest.get(p, 0)}
        marks = kept | taken
        if marks and marks != stored:
            self.store.note_fingerprint(rec.id, rec.generation, marks, actor="reconciler")
        self._marked = set(marks)
        return None

    def backfill_gone(self, rec, adapter) -> str | None:
        """Why the backfill's range belongs to a source that is gone, or None."""
        parent = self.store.get(rec.parent_id) if rec.parent_id else None
        if parent is not None and parent.generation > rec.generation:
            return (f"the source started over after this backfill was created (its main supervisor {parent.id} "
                    f"reads source generation {parent.generation}, the backfill's range is of generation "
                    f"{rec.generation})")
        known = self.known(rec)
        if known is None:
            return None
        identity = _identity(adapter, known)
        if identity != known:
            return f"the source was deleted and created again (its id was {known}, it is now {identity})"
        return None

    def confirm(self, rec, adapter) -> None:
        """After the read, before the publish: raise ``SourceChanged`` if the identity moved."""
        known = self.known(rec)
        if known is None:
            return
        identity = _identity(adapter, known)
        if identity != known:
            raise truncation.SourceChanged(f"the source was deleted and created again during the batch's read (its "
                                           f"id was {known}, it is now {identity}): the batch is discarded")


def _not_retention(adapter, found: list[str], asked) -> tuple[dict[str, int], list[str]]:
    """(the earliest offsets read again, the partitions of ``found`` still proven).

    The earliest offsets were read before the records were fetched: retention may have
    deleted a fingerprinted record in between (Kafka answers no record, RabbitMQ the first
    chunk it still keeps). A partition whose earliest offset has passed the offset asked
    proves nothing: its fingerprint is taken again, never a restart of a healthy source."""
    earliest = adapter.earliest()
    passed = [p for p in found if p in earliest and earliest[p] > asked[p]]
    if passed:
        log.info("retention deleted the fingerprinted record of partition(s) %s during the check: the "
                 "fingerprint is taken again", ", ".join(passed))
    return earliest, [p for p in found if p not in passed]


def _identity(adapter, known: str) -> str:
    ask = getattr(adapter, "identity", None)
    identity = ask() if ask is not None else None
    if identity is None:
        raise RetryableError(f"the source gave no id, though this source generation's is {known}: the lookup "
                             "failed, and nothing is published until it answers")
    return identity

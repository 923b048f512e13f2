"""Whether a reset's rewind lands on a source that started over below the checkpoint.

A topic deleted and created again, a partition truncated: the records below the old
checkpoint are new ones. A rewind there reads them once, in a new source generation
(``resets.renew``, begun by the reset transaction, ``Store.apply_reset``), never "again".
Every trigger of a reset asks the same question here, so they say and do the same: the CLI's
``reset`` (and its ``--dry-run``), a marker file and a ``backfill:`` stanza applied by the
daemon or ``reconciler apply`` (the ``Applier`` is handed ``asker``: it may not import the
runtime), and ``plan``'s preview of those.

Asked read-only, as the runtime's step asks it (``truncation.detect``: the source's id against
this generation's, the record below a checkpoint above the end), else taken from the runtime's
own finding (its UNHEALTHY error: the fingerprint of a source without ids, which only the
runtime keeps). ``latest`` never moves a checkpoint back: not asked.
"""

from __future__ import annotations

from collections.abc import Callable

from reconciler import streams
from reconciler.control.actual import State, SupervisorRecord
from reconciler.errors import ReconcilerError
from reconciler.model import Position
from reconciler.runtime import truncation

# What ``truncation.Restart.unhealthy_message`` says of a source that started over;
# tests/observe/test_status.py builds that message, so the two cannot drift apart unseen.
STARTED_OVER = "the offsets started again below the checkpoints"


def started_over(store, rec: SupervisorRecord, position: Position) -> str | None:
    """Why ``rec``'s source started over below its checkpoint, or None (then a rewind reads
    records again, as asked). A broker that cannot be asked is not an answer: the runtime's
    finding still counts, and the capture that follows says why the broker is away, once."""
    if position.kind == "latest":
        return None
    checkpoint = store.checkpoints(rec.id)
    if not checkpoint:
        return None
    found = None
    try:
        adapter = streams.adapter_for(rec.spec.source)
        try:
            _, found = truncation.detect(adapter, checkpoint, adapter.latest(),
                                         store.source_identity(rec.id, rec.generation))
        finally:
            adapter.close()
    except ReconcilerError:
        pass
    if found is not None:
        return found.why
    error = rec.runtime_error or ""
    if rec.state == State.UNHEALTHY_SUPERVISOR and STARTED_OVER in error:
        return error.split(f": {STARTED_OVER}")[0]
    return None


def asker(store) -> Callable[[SupervisorRecord, Position], str | None]:
    """``started_over`` bound to ``store``: what an ``Applier`` is handed."""
    return lambda rec, position: started_over(store, rec, position)

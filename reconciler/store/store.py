"""The metadata store: one ``Store``, the facade the rest of the code uses.

Every SQL statement of the product lives in this package, one module per aggregate, each
a mixin of ``Store``: ``supervisors`` (lifecycle and checkpoints), ``batches`` (the
publish and what committed), ``requests`` (the reset transaction and request tokens),
``audit`` (the audit log), ``sources`` (the source identity seen, a source that started
over), ``leases`` (the leader lease and heartbeats), ``writes`` (the fences that keep a
clean-up from deleting the files of a write that may still commit),
``freshness`` (lag observations, backfill milestones, health transitions, webhook cursors),
``samples`` (the lag observer's samples for the charts).
Each public method is one transaction (``base``).
"""

from __future__ import annotations

from reconciler.store.audit import AuditMixin
from reconciler.store.base import MIGRATIONS, StoreBase, utcnow
from reconciler.store.batches import BatchesMixin, SegmentFile, TableConflict
from reconciler.store.freshness import FreshnessStore
from reconciler.store.leases import LeasesMixin
from reconciler.store.requests import RequestsMixin, ResetResult
from reconciler.store.samples import SamplesMixin
from reconciler.store.sources import SourcesMixin
from reconciler.store.supervisors import SupervisorsMixin
from reconciler.store.writes import WriteFenced, WriteIntent, WritesMixin

__all__ = ["MIGRATIONS", "ResetResult", "SegmentFile", "Store", "TableConflict", "WriteFenced", "WriteIntent",
           "utcnow"]


class Store(SupervisorsMixin, BatchesMixin, WritesMixin, RequestsMixin, AuditMixin, SourcesMixin, LeasesMixin,
            FreshnessStore, SamplesMixin, StoreBase):
    """Actual state: supervisors, checkpoints, batches, segments, audit log, tokens, leases
    (and, from ``FreshnessStore``, lag observations and webhook cursors)."""

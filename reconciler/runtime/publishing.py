"""What the two commit protocols tell the runtime: ``publish_sql`` (one transaction) and
``publish_external`` (the table first, then the database). Both offer ``prepare(rec,
datasource)`` before a step reads its checkpoints and ``publish(...)`` after its batch was
written; ``RuntimeContext.publisher`` picks one, once, from the catalog adapter's ``PROTOCOL``."""

from __future__ import annotations

from reconciler.errors import RetryableError


class BatchInTable(RetryableError):
    """The batch may be committed in the table already (an external catalog committed it, or
    did not answer while committing), and the database could not record it yet: its files must
    stay. The next step (or the next leader) rolls the database forward from the table."""


class ResetUnderway(Exception):
    """A reset fenced the table and has not bumped the supervisor's epoch yet: no batch now.
    ``stalled``: for longer than a step (the reset failed or crashed after its fence): the
    supervisor's status says so."""

    def __init__(self, message: str, *, stalled: bool = False):
        super().__init__(message)
        self.stalled = stalled

"""The product's leadership loop in an explorer process (``World.take_over``)."""

from __future__ import annotations

from types import SimpleNamespace

from reconciler.daemon.leadership import Leadership
from reconciler.observe.metrics import Metrics
from reconciler.runtime.recovery import recover


class ExplorerLeadership(Leadership):
    """The product's leadership loop, its term's runtimes the explorer process's own (stepped
    by the actor, not by a manager's threads the scheduler could not order)."""

    def __init__(self, world, proc):
        settings = SimpleNamespace(lease_ttl=3600.0, warehouse=world.warehouse)
        super().__init__(proc.store, lambda: settings, proc.name, Metrics(), ping=lambda: None)
        self.world, self.proc = world, proc

    def _become_leader(self, token: int) -> None:
        recover(self.store, self.world.warehouse, self.world.catalog)
        self.proc.lease_token = token

    def stop_runtimes(self, *, wait: bool) -> None:
        for rt in self.proc.runtimes.values():
            rt.close()
        self.proc.runtimes.clear()
        self.proc.lease_token = None

"""Leadership's progress callback settles the heap and rings the bell only when there is one."""

from __future__ import annotations

import gc

import pytest

from reconciler.daemon.leadership import Leadership
from reconciler.observe.metrics import Metrics
from reconciler.pipeline import heap


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(heap, "_enabled", False)
    monkeypatch.setattr(heap, "_settled", False)
    yield
    gc.unfreeze()


def test_a_leadership_without_a_wake_bell_survives_a_published_batch(fresh):
    """``wake`` is optional (``wake: ... | None = None``) and the manager skips a None
    ``on_progress``; now the manager always gets ``_progressed``, which calls ``self._wake()``:
    every progressed step of a term whose Leadership has no bell raises on the runtime thread
    (``RuntimeManager._done`` -> ``on_progress``), after the step's bookkeeping."""
    leadership = Leadership(None, lambda: None, "me", Metrics(), ping=lambda: None)
    leadership._progressed()  # what RuntimeManager._done calls after a batch published

"""Fixtures shared by the observing surface's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reconciler.store.store import Store


@pytest.fixture
def store(tmp_path) -> Iterator[Store]:
    """A migrated SQLite store of the test's own (test_status.py has one of its own)."""
    s = Store(f"sqlite:///{tmp_path / 'r.db'}")
    s.migrate()
    try:
        yield s
    finally:
        s.close()

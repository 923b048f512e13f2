"""Fixtures of the table tests."""

from __future__ import annotations

import pytest

from reconciler.table import compact as compact_module


@pytest.fixture
def rewrites(monkeypatch):
    """The input files of each partition a compaction rewrites, in order (``_rewrite`` counted)."""
    calls = []
    real = compact_module._rewrite

    def counting(table, group, *args, **kwargs):
        calls.append(sorted(f.file_path for f in group.files))
        return real(table, group, *args, **kwargs)

    monkeypatch.setattr(compact_module, "_rewrite", counting)
    return calls

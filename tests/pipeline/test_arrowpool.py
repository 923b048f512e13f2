"""A process that runs batches allocates Arrow memory from jemalloc, unless the operator names a pool."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHOOSE = ("from reconciler.pipeline import arrowpool; import pyarrow as pa; "
          "print(arrowpool.use_preferred(), pa.default_memory_pool().backend_name, arrowpool.use_preferred())")


def _in_a_new_process(**env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", CHOOSE], env={**clean, **env}, capture_output=True,
                         text=True, timeout=60, check=True)
    return out.stdout.split()


def test_jemalloc_by_default():
    assert _in_a_new_process() == ["jemalloc", "jemalloc", "jemalloc"]


@pytest.mark.parametrize("pool", ["system", "mimalloc"])
def test_the_operators_pool_wins(pool):
    assert _in_a_new_process(ARROW_DEFAULT_MEMORY_POOL=pool) == [pool, pool, pool]

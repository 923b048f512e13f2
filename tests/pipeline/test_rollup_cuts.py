"""A rolled-up ``doubleSum`` and the cuts (review of issue 41.5/41.9/41.10). Records of one
group cut into batches (one task's, or tasks', then compaction) are summed in another
order: float addition is not associative, so ``1e308, 1e308, -1e308, -1e308`` sums to inf,
0.0 or NaN by the cut, and ``0.1 + 0.2 + 0.3`` to 0.6000000000000001 or 0.6. Exact sums
across parts would need state the table does not keep; the README's JSON rules say so
instead: a double sum's last bits, and its overflow, can depend on how the records were
grouped into batches, while counts, long sums (wrapping), mins and maxes are exact. These
cases check that contract; tests/pipeline/test_batch_cuts.py checks it on random records."""

from __future__ import annotations

import math
import sys
from fractions import Fraction

import pyarrow as pa
import pytest

from reconciler.model import Metric
from reconciler.pipeline.transform import Transformer
from reconciler.table.compact import Rollup, rollup_rows
from tests.pipeline.test_transform import T0_MS, records, schema

DS = schema(dimensions=("d",), rollup=True, query_granularity="hour",
            metrics=(Metric("c", "count"), Metric("xs", "doubleSum", "x"), Metric("ns", "longSum", "n"),
                     Metric("xlo", "doubleMin", "x"), Metric("xhi", "doubleMax", "x"),
                     Metric("nlo", "longMin", "n"), Metric("nhi", "longMax", "n")))
_NS = [2**63 - 1, 1, -5, 7]  # the long sum wraps past 64 bits, the same way whatever the cut


def rolled_up(batch: pa.RecordBatch, cuts: list[int], *, shared: bool) -> list[dict]:
    """The table's rows after compaction: the batch cut at ``cuts``, one Transformer over
    the pieces (``shared``: one task's batches) or one per piece (tasks), then
    ``rollup_rows`` as compaction does."""
    bounds = [0, *cuts, batch.num_rows]
    t, out = Transformer(DS), []
    for start, end in zip(bounds, bounds[1:], strict=False):
        if not shared and start:
            out.append(t.finish().rows)
            t = Transformer(DS)
        out.append(t(batch.slice(start, end - start)).rows)
    out.append(t.finish().rows)
    return rollup_rows(pa.concat_tables(out), Rollup.of(DS)).to_pylist()


@pytest.mark.parametrize("xs", [["1e308", "1e308", "-1e308", "-1e308"], ["0.1", "0.2", "0.3"]])
@pytest.mark.parametrize("shared", [True, False])
def test_a_double_sum_depends_on_the_cut_only_in_its_rounding(xs, shared):
    values = [float(x) for x in xs]
    batch = records([{"ts": T0_MS, "d": "a", "x": x, "n": n} for x, n in zip(values, _NS, strict=False)])
    exact, scale = sum(map(Fraction, values)), sum(abs(Fraction(v)) for v in values)  # no overflow, no rounding
    tolerance = Fraction(1, 10**12) * scale
    [whole] = rolled_up(batch, [], shared=True)
    for cut in range(1, len(xs)):
        [got] = rolled_up(batch, [cut], shared=shared)
        assert {k: v for k, v in got.items() if k != "xs"} == {k: v for k, v in whole.items() if k != "xs"}, cut
        assert got["ns"] == (sum(_NS[:len(xs)]) + 2**63) % 2**64 - 2**63
        assert (got["xlo"], got["xhi"], got["c"]) == (min(values), max(values), len(xs))
        if scale <= sys.float_info.max:  # no partial sum can overflow: the exact sum up to rounding
            assert math.isclose(got["xs"], whole["xs"], rel_tol=1e-12), cut
            assert abs(Fraction(got["xs"]) - exact) <= tolerance, cut
        else:  # a partial sum may overflow: inf, -inf or NaN, or a finite sum, by the cut
            assert not math.isfinite(got["xs"]) or abs(Fraction(got["xs"]) - exact) <= tolerance, cut

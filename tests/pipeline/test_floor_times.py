"""``transform.floor_times`` floors UTC timestamps without Arrow's zone rules (issue 45's
cheaper record): the same instants as ``floor_temporal`` on the zoned type, for every
granularity, across years 1 to 9999, before and after the epoch, with nulls; and the
time chunks it gives are ``chunk_of``'s."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from reconciler.pipeline.times import TIME_FROM_MICROS, TIME_UNTIL_MICROS
from reconciler.pipeline.transform import (
    ARROW_FLOOR,
    SEGMENT_GRANULARITIES,
    chunk_of,
    chunk_strings,
    floor_times,
)


def _times(unit: str = "us", tz: str | None = "UTC") -> pa.Array:
    rng = np.random.default_rng(45)
    per = {"s": 1_000_000, "ms": 1_000, "us": 1}[unit]
    micros = np.concatenate([
        rng.integers(TIME_FROM_MICROS, TIME_UNTIL_MICROS, 20_000),
        np.arange(-3 * 86_400_000_000, 3 * 86_400_000_000, 7_777_777_777),  # about the epoch
        np.array([TIME_FROM_MICROS, TIME_UNTIL_MICROS - 1, -1, 0, 1]),
    ])
    values = pa.array(micros // per, mask=np.arange(len(micros)) % 17 == 0)  # nulls too
    return values.cast(pa.timestamp(unit, tz=tz))


@pytest.mark.parametrize("granularity", list(ARROW_FLOOR))
@pytest.mark.parametrize("unit", ["s", "ms", "us"])
def test_floor_of_utc_times_is_the_zoned_floor(granularity, unit):
    times = _times(unit)
    got = floor_times(times, granularity)
    want_unit, multiple = ARROW_FLOOR[granularity]
    want = pc.floor_temporal(times, multiple=multiple, unit=want_unit)
    assert got.type == times.type
    assert got.equals(want)


@pytest.mark.parametrize("tz", [None, "Europe/Paris"])
def test_other_times_floor_as_before(tz):
    times = _times("us", tz).slice(0, 2000)
    assert floor_times(times, "day").equals(pc.floor_temporal(times, unit="day"))


@pytest.mark.parametrize("granularity", SEGMENT_GRANULARITIES)
def test_chunk_strings_are_chunk_of(granularity):
    times = _times().slice(0, 3000).drop_null()
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    want = [chunk_of(epoch + timedelta(microseconds=m), granularity) for m in times.cast(pa.int64()).to_pylist()]
    assert chunk_strings(times, granularity).to_pylist() == want

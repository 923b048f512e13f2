"""Partitioning and schemas of the output tables."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.transforms import DayTransform, HourTransform, MonthTransform, Transform

# Iceberg's finest time transform is the hour: a minute or fifteen-minute chunk lies
# within one hour, so its files still belong to exactly one partition.
_TRANSFORMS = {
    "minute": HourTransform,
    "fifteen_minute": HourTransform,
    "hour": HourTransform,
    "day": DayTransform,
    "month": MonthTransform,
}

def partition_transform(granularity: str) -> Transform:
    try:
        return _TRANSFORMS[granularity]()
    except KeyError:
        raise ValueError(f"unknown segment granularity: {granularity!r}") from None


def arrow_schema_of(spark_schema) -> pa.Schema:
    """The Arrow schema of a Spark frame's schema (timestamps as UTC microseconds)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema, timezone="UTC")

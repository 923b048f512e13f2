"""A record's row or dead letter depends on the record alone (issue 41.5, 41.9): the same
records cut into batches at random points (one Transformer over the pieces, as one task
reads them, or a fresh one per piece, as a replay, a backfill or another ``taskCount``
reads them) give exactly the rows and dead letters of one whole batch, and of the
per-record Python parser (the JSON rules' reference, ``bulk=False``).

The values are of every kind, valid and not, under each read field: numbers as JSON and as
text (hex, a leading "+", whitespace, underscores, exponents, Unicode digits, overflow of a
long and of a double, NaN/Inf text), timestamps in each format, nested values, records
that are no JSON object. ``--soak`` runs the differential over 100,000 random records
(``RECONCILER_FUZZ_SEED`` fixes the seed; CI runs a few thousand)."""

# ruff: noqa: UP031 - %-formatting keeps the JSON's braces readable (f-strings double them)
from __future__ import annotations

import math
import os
import random

import pyarrow as pa
import pytest

from reconciler.model import DataSchema, Metric
from reconciler.pipeline.transform import Transformer
from tests.pipeline.test_transform import T0_MS, records, schema

SOAK_RECORDS = 100_000
CI_RECORDS = 3_000

_BIG = "1" + "0" * 400  # an integer beyond a double
_NUMBERS = ["0", "-0", "7", "-12", "9223372036854775807", "9223372036854775808", "-9223372036854775809",
            "18446744073709551616", _BIG, "-" + "9" * 350, "1.5", "-0.0", "1e2", "1E400", "-1e400", "2.5e-3",
            "5e-324", "1.7976931348623157e308", "9007199254740993", "9007199254740993.0", "1e-400"]
_TEXTS = ["a", "", "7", " 7 ", "+7", "007", "-0", "0x10", "0X1f", "-0x10", "1_000", "1e3", "1.5", ".5", "5.",
          "\u0661\u0662", "\uff11\uff12", "nan", "NaN", "-nan", "nan(1)", "Inf", "-inf", "Infinity", "infinit",
          _BIG, "1e400", "true", "null", "x\"y", "\u00e9", "\\ud800"]
_OTHER = ["true", "false", "null", '{"a":1}', "[1,2.0]", "{}", "[]", '{"a":1.0e1,"a":2}', "[NaN]",
          "NaN", "Infinity", "-Infinity"]
_INVALID_TOKENS = ["-NaN", "Inf", "01", "+1", "'a'", "0x10", "1_0"]
_TIMES = [str(T0_MS), str(T0_MS // 1000), "%d.25" % (T0_MS // 1000), "%d.5" % T0_MS, '"%d"' % T0_MS,
          '"%d"' % (T0_MS // 1000), '"2025-11-20T12:34:56.789Z"', '"2025-11-20 12:34:56+01:00"',
          '"2025-11-20T12:34"', '"2025-11-20"', '" 2025-11-20T12:34:56Z "', '"0x6925D740"', '"0X6925D740"',
          '"+%d"' % T0_MS, '" %d "' % T0_MS, '"%d_0"' % T0_MS, '"1.7641e12"', "1.7641e12", "1e12", '"1e12"',
          '"2025-02-30"', '"0001-01-01T00:00:00Z"', '"9999-12-31T23:59:59Z"', "253402300800", "-62135596801",
          '"NaN"', '"Infinity"', "-0", '"\u0661\u0662"', _BIG, '"%s"' % _BIG, "1e400", "null", '"x"', "true"]
_BROKEN = [None, "", "[]", "null", "7", "{", '{"ts": %d} x' % T0_MS, b'{"ts": 1, "d": "\xff"}',
           '\ufeff{"ts": %d}' % T0_MS, '{"ts": %d, "d": 1}{"d": 2}' % T0_MS, "  {\"ts\": %d}  " % T0_MS,
           '{"ts":\n%d}' % T0_MS]
_KINDS = {
    "number": _NUMBERS,
    "text": ['"%s"' % t for t in _TEXTS],
    "other": _OTHER,
    "int": ["0", "1", "-5", "123456789012"],
    "float": ["0.5", "-2.25", "1e-3", "3.0"],
}


def make_records(rng: random.Random, n: int) -> list:
    """``n`` records: runs of one type profile per field (so the bulk parser reads most of
    them), with odd values, odd timestamps and broken records sprinkled in."""
    out: list = []
    while len(out) < n:
        profile = {k: rng.choice(sorted(_KINDS)) for k in ("d", "n", "x", "o")}
        good_ts = rng.choice(_TIMES[:8])
        for _ in range(min(n - len(out), rng.randint(1, 40))):
            if rng.random() < 0.04:
                out.append(rng.choice(_BROKEN))
                continue
            items = ['"ts":' + (good_ts if rng.random() < 0.8 else rng.choice(_TIMES))] if rng.random() < 0.97 else []
            for k, kind in profile.items():
                if rng.random() < 0.85:
                    pool = _KINDS[kind] if rng.random() < 0.9 else _KINDS[rng.choice(sorted(_KINDS))]
                    value = rng.choice(pool) if rng.random() < 0.99 else rng.choice(_INVALID_TOKENS)
                    items.append('"%s":%s' % (k, value))
            rng.shuffle(items)
            out.append("{%s}" % ",".join(items))
    return out


def cut_points(rng: random.Random, n: int) -> list[int]:
    """Random piece boundaries ``0 < c < n`` (sorted), sometimes none."""
    return sorted(rng.sample(range(1, n), rng.randint(0, min(n - 1, 12)))) if n > 1 else []


SCHEMAS = {
    "auto": schema(dimensions=("d", "__offset"),
                   metrics=(Metric("n", "longSum", "n"), Metric("x", "doubleSum", "x"))),
    "millis-rollup": schema(
        timestamp_format="millis", dimensions=("d", "__offset"), rollup=True,
        metrics=(Metric("c", "count"), Metric("n", "longSum", "n"), Metric("nd", "doubleMin", "n"),
                 Metric("xs", "doubleSum", "x"), Metric("xl", "longMax", "x"), Metric("dd", "doubleMax", "d"),
                 Metric("tl", "longMin", "ts"))),
    "seconds": schema(timestamp_format="seconds", dimensions=("__offset", "ts"),
                      metrics=(Metric("x", "doubleMax", "x"), Metric("d", "longMin", "d"))),
    "iso": schema(timestamp_format="iso", dimensions=("d", "__offset"), metrics=(Metric("x", "doubleMin", "x"),)),
}


def _exact(v):
    if isinstance(v, float):
        return ("nan",) if v != v else (v, math.copysign(1.0, v))
    return v


def outcome(table_rows: list[pa.Table], table_dead: list[pa.Table]) -> tuple[list, list]:
    """Rows by offset and dead letters by offset, floats compared bit for bit."""
    good = pa.concat_tables(table_rows).sort_by("__offset").to_pylist()
    dead = pa.concat_tables(table_dead).sort_by("offset").to_pylist()
    return [{k: _exact(v) for k, v in r.items()} for r in good], dead


def run(batch: pa.RecordBatch, ds: DataSchema, cuts: list[int], *, shared: bool, bulk: bool = True):
    """The batch's outcome cut at ``cuts``: one Transformer over the pieces (``shared``, a
    task's batches) or a fresh one per piece (each its own task)."""
    bounds = [0, *cuts, batch.num_rows]
    t = Transformer(ds, bulk=bulk)
    good, dead = [], []
    for start, end in zip(bounds, bounds[1:], strict=False):
        if not shared and start:
            good.append(t.finish().rows)
            t = Transformer(ds, bulk=bulk)
        out = t(batch.slice(start, end - start))
        good.append(out.rows)
        dead.append(out.dead)
    good.append(t.finish().rows)
    return outcome(good, dead)


def check(values: list, rng: random.Random, names=tuple(SCHEMAS)) -> None:
    batch = records(values)
    for name in names:
        ds = SCHEMAS[name]
        reference = run(batch, ds, [], shared=True, bulk=False)
        assert run(batch, ds, [], shared=True) == reference, (name, "whole batch")
        for shared in (True, False):
            cuts = cut_points(rng, len(values))
            assert run(batch, ds, cuts, shared=shared) == reference, (name, shared, cuts)


def test_the_same_records_cut_anywhere_give_the_same_rows_and_dead_letters(request):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    examples = 60 if request.config.getoption("--soak") else 20  # the unit run's share: a few seconds

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.randoms(use_true_random=False), st.integers(1, 80))
    def prop(rng, n):
        check(make_records(rng, n), rng)

    prop()


@pytest.mark.parametrize("neighbours", [["%d" % T0_MS], ['"2025-11-20T12:34:56Z"'], ['"x"']])
def test_a_hex_timestamp_is_a_dead_letter_beside_anything(neighbours):
    values = ['{"ts": "0x6925D740", "n": "0x10", "x": "0x10"}'] + ['{"ts": %s, "n": 1}' % v for v in neighbours]
    for ds in (SCHEMAS["auto"], schema(timestamp_format="seconds", dimensions=("__offset",))):
        for bulk in (True, False):
            out = Transformer(ds, bulk=bulk)(records(values))
            assert out.dead.column("offset").to_pylist()[:1] == [100], (ds.timestamp_format, bulk, neighbours)
            assert out.dead.column("reason")[0].as_py().startswith(f"unparseable timestamp ({ds.timestamp_format})")


def test_hex_metrics_are_null_beside_anything():
    ds = SCHEMAS["auto"]
    for other in ('"7"', '" 7"', "7", '"Inf"'):
        values = ['{"ts": %d, "n": "0x10", "x": "0x10"}' % T0_MS, '{"ts": %d, "n": %s, "x": %s}' % (T0_MS, other, other)]
        got = Transformer(ds)(records(values)).rows.sort_by("__offset").to_pylist()
        assert (got[0]["n"], got[0]["x"]) == (None, None), other


def test_an_integer_beyond_a_double_is_null_under_a_double_metric_whatever_reads_it():
    # The bulk reader reads a clean record (a float column: null); a broken neighbour
    # sends the batch to the per-record parser (the digits, then the text rule).
    ds = SCHEMAS["auto"]
    big = '{"ts": %d, "x": %s}' % (T0_MS, _BIG)
    for values in ([big], [big, '{"ts": %d, "x": 1.5}' % T0_MS], [big, "{"], [big, '{"ts": %d, "x": "a"}' % T0_MS]):
        for bulk in (True, False):
            rows = Transformer(ds, bulk=bulk)(records(values)).rows.sort_by("__offset").to_pylist()
            assert rows[0]["x"] is None, (values, bulk)


def test_differential_over_many_random_records(request):
    """The random records (``CI_RECORDS``, or ``SOAK_RECORDS`` with ``--soak``) in pieces
    of up to 2,000, each checked whole and cut, against the per-record parser."""
    total = SOAK_RECORDS if request.config.getoption("--soak") else CI_RECORDS
    seed = int(os.environ.get("RECONCILER_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
    print(f"RECONCILER_FUZZ_SEED={seed}: {total} records")
    rng = random.Random(seed)
    done = 0
    while done < total:
        n = min(total - done, rng.randint(1, 2000))
        check(make_records(rng, n), rng)
        done += n


ROLLED = schema(dimensions=("d",), rollup=True, query_granularity="hour",
                metrics=(Metric("c", "count"), Metric("ns", "longSum", "n"), Metric("lo", "longMin", "n"),
                         Metric("hi", "longMax", "n"), Metric("xs", "doubleSum", "x"), Metric("xlo", "doubleMin", "x"),
                         Metric("xhi", "doubleMax", "x")))
_LONGS = [0, 1, -5, 123456789012, 2**63 - 1, -(2**63), 2**62]  # sums wrap past 64 bits
_DOUBLES = [0.1, 0.2, 0.3, -1.5, 1e16, -1e16, 2.5e-3, 3.0]  # no overflow: see test_rollup_cuts.py


def test_rolled_up_records_that_share_a_group_give_the_same_rows_cut_anywhere():
    """Records of a few groups (``d``), cut at random points into the batches of one task or
    into tasks, then rolled up again as compaction does: counts, long sums (wrapping), mins
    and maxes are exactly those of the records; a double sum is the exact sum up to
    rounding (README, JSON rules: its last bits depend on the cuts)."""
    from reconciler.table.compact import Rollup, rollup_rows

    rng = random.Random(41_10)
    for _ in range(40):
        n = rng.randint(1, 60)
        docs = [{"ts": T0_MS + rng.randrange(3_600_000), "d": rng.choice(["a", "b", None]),
                 "n": rng.choice([*_LONGS, None]), "x": rng.choice([*_DOUBLES, None])} for _ in range(n)]
        expected = {}
        for key in {_group(doc) for doc in docs}:
            group = [doc for doc in docs if _group(doc) == key]
            ns = [doc["n"] for doc in group if doc["n"] is not None]
            xs = [doc["x"] for doc in group if doc["x"] is not None]
            expected[key] = {"c": len(group),
                           "ns": (sum(ns) + 2**63) % 2**64 - 2**63 if ns else None,
                           "lo": min(ns, default=None), "hi": max(ns, default=None),
                           "xlo": min(xs, default=None), "xhi": max(xs, default=None),
                           "xs": (math.fsum(xs), math.fsum(map(abs, xs))) if xs else None}
        batch = records([{k: v for k, v in doc.items() if v is not None} for doc in docs])
        for shared in (True, False):
            cuts = cut_points(rng, n)
            bounds = [0, *cuts, n]
            t, parts = Transformer(ROLLED), []
            for start, end in zip(bounds, bounds[1:], strict=False):
                if not shared and start:
                    parts.append(t.finish().rows)
                    t = Transformer(ROLLED)
                parts.append(t(batch.slice(start, end - start)).rows)
            parts.append(t.finish().rows)
            rows = rollup_rows(pa.concat_tables(parts), Rollup.of(ROLLED)).to_pylist()
            keys = [(int(r["__time"].timestamp() * 1000), r["d"]) for r in rows]
            assert len(keys) == len(set(keys)) and set(keys) == set(expected), (shared, cuts)
            for key, r in zip(keys, rows, strict=True):
                want = dict(expected[key])
                exact, scale = want.pop("xs") or (None, 0.0)
                assert {k: r[k] for k in want} == want, (shared, cuts, r)
                if exact is None:
                    assert r["xs"] is None
                else:  # a float sum's rounding: under n * 2**-53 of the sum of magnitudes
                    assert abs(r["xs"] - exact) <= 1e-12 * scale, (shared, cuts, r["xs"], exact)


def _group(doc: dict) -> tuple[int, str | None]:
    """A record's rollup group under ``ROLLED``: (its hour in epoch ms, ``d``)."""
    return doc["ts"] - doc["ts"] % 3_600_000, doc["d"]

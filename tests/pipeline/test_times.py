"""Text -> numbers and times (reconciler.pipeline.times): one rule per value, whatever its
neighbours in the array (issue 41.9), and a decimal beyond a double is null (41.5)."""

from __future__ import annotations

import functools
import itertools
import math
import re

import pyarrow as pa
import pytest

from reconciler.pipeline.times import _DOUBLE, _INTEGER, parse_times, to_double, to_long

# Texts of every kind: plain, and what Arrow's casts or the rules read in their own way.
ODD = [
    "7", "-7", "0", "-0", "007", " 7", "7 ", "\t7\n", "+7", "0x10", "0X10", "-0x10", "0x",
    "1_000", "1e3", "1E3", "1.5", ".5", "5.", "+.5", "-.5e-3", "1e", "e5", ".", "-", "+", "",
    "\u0661\u0662", "\uff11\uff12", "9223372036854775807", "9223372036854775808",
    "-9223372036854775808", "-9223372036854775809", "0xFFFFFFFFFFFFFFFF", "1" + "0" * 400,
    "-" + "9" * 400, "1e400", "-1e400", "1e-400", "1.7976931348623157e308", "5e-324",
    "NaN", "nan", "-nan", "+NaN", "nan(1)", "Inf", "-inf", "+INF", "Infinity", "-Infinity",
    "infinit", "inf ", "1d", "1f", "0x1p3", "true", "null", "1764087616", "1764087616000",
    "1764087616.5", "0x6925D740", "2025-11-25T16:20:16Z", "2025-11-25 16:20:16+01:00",
    "2025-02-30", "2025-11-25T24:00", "100000000000", "100000000001", "-100000000001",
]
# One of each way an array can leave a cast's fast path (or stay on it).
NEIGHBOURS = ["7", "1.5", " 7", "+7", "0x10", "1" + "0" * 400, "NaN", "-", "2025-11-25T16:20:16Z"]


def _values(a: pa.Array) -> list:
    """Values that == compares exactly (NaN as a tag, a float's sign kept)."""
    return [("nan",) if isinstance(v, float) and v != v else
            (v, math.copysign(1.0, v)) if isinstance(v, float) else v for v in a.to_pylist()]


CONVERSIONS = {
    "long": to_long,
    "double": to_double,
    **{f"times-{fmt}": functools.partial(parse_times, fmt=fmt) for fmt in ("auto", "iso", "millis", "seconds")},
}


@pytest.mark.parametrize("kind", sorted(CONVERSIONS))
def test_a_value_reads_the_same_alone_and_beside_any_other(kind):
    convert = CONVERSIONS[kind]
    alone = {v: _values(convert(pa.array([v], pa.string())))[0] for v in ODD}
    for a, b in itertools.product(ODD, NEIGHBOURS):
        got = _values(convert(pa.array([a, b, None], pa.string())))
        assert got == [alone[a], alone[b], None], (kind, a, b)
    # and a slice of a larger array, and the whole corpus at once
    whole = pa.array(["0x10", *ODD], pa.string())
    assert _values(convert(whole.slice(1))) == [alone[v] for v in ODD]


@pytest.mark.parametrize("values, expected", [
    (["0x10"], [None]),
    (["0x10", " 7"], [None, 7]),
    (["0X7fffffffffffffff", "1"], [None, 1]),
    (["+7", "007", "-0"], [7, 7, 0]),
    (["9223372036854775808", "-9223372036854775808"], [None, -(2**63)]),
])
def test_long_rule(values, expected):
    assert to_long(pa.array(values, pa.string())).to_pylist() == expected


@pytest.mark.parametrize("values, expected", [
    (["1" + "0" * 400], [None]),  # an integer beyond a double: null, as the JSON rules have it
    (["1e400", "-1e400", "1e-400"], [None, None, 0.0]),
    (["Inf", "-Infinity", " inf "], [math.inf, -math.inf, math.inf]),  # named: kept
    (["nan(1)", "1.5"], [None, 1.5]),
    (["1e308", "1.5"], [1e308, 1.5]),
])
def test_double_rule(values, expected):
    assert to_double(pa.array(values, pa.string())).to_pylist() == expected


def test_the_hex_timestamp_is_unparseable_whatever_its_neighbours():
    for neighbours in ([], ["1764087616"], ["2025-11-25T16:20:16Z"]):
        got = parse_times(pa.array(["0x6925D740", *neighbours], pa.string()), "auto").to_pylist()
        assert got[0] is None, neighbours


def _cast(text: str, to: pa.DataType) -> bool:
    try:
        pa.array([text], pa.string()).cast(to)
        return True
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return False


@pytest.mark.parametrize("alphabet, to, rule, longest", [
    ("-09", pa.int64(), _INTEGER, 7),
    ("+-.09eE", pa.float64(), _DOUBLE, 5),
])
def test_arrows_casts_read_the_rules_exactly_on_the_plain_alphabets(alphabet, to, rule, longest):
    """The premise of the fast paths: on texts of these bytes only (``0`` and ``9`` stand
    for every digit), Arrow's cast accepts exactly what the rule's regex matches. An Arrow
    upgrade that reads more (a leading "+" as a long) fails here."""
    pattern = re.compile(rule)
    for n in range(1, longest + 1):
        for chars in itertools.product(alphabet, repeat=n):
            text = "".join(chars)
            assert _cast(text, to) == bool(pattern.match(text)), text

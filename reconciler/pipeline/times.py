"""Text -> numbers and times, vectorized (pyarrow.compute): a field's text
(``jsonparse.render``) read as a long or double metric, or as the record's timestamp.

* Surrounding ASCII whitespace is ignored.
* A long is ``[+-]?[0-9]+`` within 64 bits; anything else (a fraction, an exponent,
  ``true``, ``0x10``) is null.
* A double is a decimal number within a double's range (``1``, ``-1.5``, ``.5``, ``5.``,
  ``1e3``; beyond it, ``1e400``, null as the JSON rules have a number beyond a double) or,
  in any case, ``NaN``, ``Inf``, ``Infinity`` with an optional sign; else null.
* Each value is read by these rules alone, whatever its neighbours: Arrow's casts read
  more than the rules (``0x10`` as a long, ``nan(1)`` as a double), so they run on an
  array only when its bytes are all of the rules' plain alphabet, where they read exactly
  the rules (``tests/pipeline/test_times.py`` checks this exhaustively on short texts).
* Timestamps (``parse_times``): ``millis`` and ``seconds`` read a number, an integer
  exactly (through int64) and a fraction through the double, rounded half away from zero
  to the microsecond; ``auto`` reads an integer or number as millis when its magnitude is
  above 1e11, else seconds, and anything else as ISO; ``iso`` reads
  ``YYYY-MM-DD[(T| )hh[:mm[:ss[.fraction]]][ ][Z|UTC|GMT|+hh:mm|+hhmm|+hh]]``, no offset
  meaning UTC (Spark also took zone names such as ``Europe/Paris``: no more).
  A time outside a 64-bit count of microseconds, or that does not parse, is null.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

TIME_FROM_MICROS = -62_135_596_800_000_000  # 0001-01-01T00:00Z
TIME_UNTIL_MICROS = 253_402_300_800_000_000  # 10000-01-01T00:00Z
AUTO_MILLIS_ABOVE = 100_000_000_000  # "auto": a magnitude above this is millis, else seconds
_LONG_MAX = 2**63 - 1
_INTEGER = r"^[+-]?[0-9]+$"
_DOUBLE = r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"
_SPECIAL = r"^[+-]?(?i:nan|inf|infinity)$"
_ISO = (
    r"^(?P<y>[0-9]{4})-(?P<mo>[0-9]{1,2})-(?P<d>[0-9]{1,2})"
    r"(?:[T ](?P<h>[0-9]{1,2})(?::(?P<mi>[0-9]{2})(?::(?P<s>[0-9]{2})(?:\.(?P<f>[0-9]{1,9}))?)?)?"
    r" ?(?P<z>Z|UTC|GMT|[+-][0-9]{2}(?::?[0-9]{2})?)?)?$"
)
_NULL_LONG = pa.scalar(None, pa.int64())
_NULL_DOUBLE = pa.scalar(None, pa.float64())
# The bytes of texts that Arrow's casts read exactly as the rules do (see to_long, to_double).
_LONG_ALPHABET = b"-0123456789"
_DOUBLE_ALPHABET = b"+-.0123456789eE"


def _trim(text: pa.Array) -> pa.Array:
    return pc.ascii_trim_whitespace(text)


def _plain(text: pa.Array, alphabet: bytes) -> bool:
    """Whether every byte of ``text``'s values is in ``alphabet`` (one pass of
    ``bytes.translate``, a few ms per million values; a slice is judged by its whole
    buffer, which can only send it to the rule). Another kind of array: no."""
    if not isinstance(text, pa.Array) or text.type != pa.string():
        return False
    data = text.buffers()[2]
    return data is None or not data.to_pybytes().translate(None, alphabet)


def to_long(text: pa.Array) -> pa.Array:
    """Text -> int64 (null where it is not an integer within 64 bits)."""
    if _plain(text, _LONG_ALPHABET):
        # The usual case. On these bytes Arrow's cast reads
        # exactly "-?[0-9]+" (elsewhere it also reads "0x10"); it fails on an overflow.
        try:
            return text.cast(pa.int64())
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass
    t = _trim(text)
    ok = pc.match_substring_regex(t, _INTEGER)
    if not pc.any(ok).as_py():
        return pa.nulls(len(text), pa.int64())
    # Arrow's cast takes no "+" and fails the whole array on an overflow: strip the sign
    # and the leading zeros, and cast only what fits (up to 18 digits always does).
    negative = pc.starts_with(t, "-")
    digits = pc.replace_substring_regex(t, r"^[+-]?0*", "")
    digits = pc.if_else(pc.equal(digits, ""), "0", digits)
    length = pc.utf8_length(digits)
    fits = pc.or_(
        pc.less(length, 19),
        pc.and_(
            pc.equal(length, 19),
            pc.less_equal(digits, pc.if_else(negative, "9223372036854775808", "9223372036854775807")),
        ),
    )
    ok = pc.and_(ok, fits).fill_null(False)
    # A negative number is cast as its digits with the "-" (so -2^63 fits too).
    signed = pc.if_else(negative, pc.binary_join_element_wise("-", digits, ""), digits)
    return pc.if_else(ok, pc.if_else(ok, signed, "0").cast(pa.int64()), _NULL_LONG)


def to_double(text: pa.Array) -> pa.Array:
    """Text -> float64 (null where it is not a number, or a decimal beyond a double)."""
    if _plain(text, _DOUBLE_ALPHABET):
        # The usual case. On these bytes Arrow's cast reads exactly the decimals of the
        # rule (elsewhere it also reads "nan(1)"), and an infinity can only be a decimal
        # beyond a double.
        try:
            return _finite(text.cast(pa.float64()))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass
    t = _trim(text)
    decimal = pc.match_substring_regex(t, _DOUBLE).fill_null(False)
    ok = pc.or_(decimal, pc.match_substring_regex(t, _SPECIAL).fill_null(False))
    x = pc.if_else(ok, pc.if_else(ok, pc.utf8_lower(t), "0").cast(pa.float64()), _NULL_DOUBLE)
    return pc.if_else(pc.and_(decimal, pc.is_inf(x)), _NULL_DOUBLE, x)


def _finite(x: pa.Array) -> pa.Array:
    """``x`` with its infinities null (read from decimals: beyond a double)."""
    inf = pc.is_inf(x)
    return pc.if_else(inf, _NULL_DOUBLE, x) if pc.any(inf).as_py() else x


def _scaled_long(whole: pa.Array, factor: int) -> pa.Array:
    """``whole * factor``, null where it would overflow a long."""
    bound = _LONG_MAX // factor
    fits = pc.and_(pc.less_equal(whole, bound), pc.greater_equal(whole, -bound))
    return pc.if_else(fits, pc.multiply(pc.if_else(fits, whole, 0), factor), _NULL_LONG)


def _scaled_double(num: pa.Array, factor: float) -> pa.Array:
    """``round(num * factor)`` as a long (half away from zero), null when outside a long."""
    x = pc.round(pc.multiply(num, factor), round_mode="half_towards_infinity")
    fits = pc.and_(pc.greater_equal(x, -(2.0**63)), pc.less(x, 2.0**63)).fill_null(False)
    return pc.if_else(fits, pc.if_else(fits, x, 0.0).cast(pa.int64()), _NULL_LONG)


def parse_times(text: pa.Array, fmt: str) -> pa.Array:
    """A timestamp field's text -> int64 microseconds since the epoch (UTC), null when it
    does not parse in ``fmt`` (``millis``, ``seconds``, ``iso`` or ``auto``)."""
    if fmt == "iso":
        return parse_iso(text)
    if fmt not in ("millis", "seconds", "auto"):
        raise ValueError(f"unknown timestamp format: {fmt!r}")
    whole = to_long(text)
    rest = pc.and_(whole.is_null(), text.is_valid())
    num = to_double(text) if pc.any(rest).as_py() else pa.nulls(len(text), pa.float64())
    millis_whole, seconds_whole = _scaled_long(whole, 1000), _scaled_long(whole, 1_000_000)
    millis_num, seconds_num = _scaled_double(num, 1000.0), _scaled_double(num, 1_000_000.0)
    if fmt == "millis":
        return pc.coalesce(millis_whole, millis_num)
    if fmt == "seconds":
        return pc.coalesce(seconds_whole, seconds_num)
    big_whole = pc.or_(pc.greater(whole, AUTO_MILLIS_ABOVE), pc.less(whole, -AUTO_MILLIS_ABOVE))
    by_whole = pc.if_else(big_whole, millis_whole, seconds_whole)
    big_num = pc.greater(pc.abs(num), 1e11)
    by_num = pc.if_else(big_num, millis_num, seconds_num)
    out = pc.if_else(whole.is_valid(), by_whole, by_num)
    rest = pc.and_(whole.is_null(), num.is_null())
    if pc.any(pc.and_(rest, text.is_valid())).as_py():
        out = pc.if_else(rest, parse_iso(text), out)
    return out


def parse_iso(text: pa.Array) -> pa.Array:
    """ISO-8601 text -> int64 microseconds (UTC; null where it does not parse)."""
    t = _trim(text)
    parts = pc.extract_regex(t, _ISO)  # null where it does not match
    if parts.null_count == len(parts):
        return pa.nulls(len(text), pa.int64())

    def part(name: str, default: str = "0") -> pa.Array:
        p = pc.struct_field(parts, name)
        return pc.if_else(pc.equal(p, ""), default, p)

    y, mo, d = part("y"), part("mo"), part("d")
    date = pc.binary_join_element_wise(y, pc.utf8_lpad(mo, 2, "0"), pc.utf8_lpad(d, 2, "0"), "-")
    day = pc.strptime(date, "%Y-%m-%d", unit="s", error_is_null=True)
    # strptime rolls 2025-02-30 over into March: the fields must come back as given.
    same = pc.and_(pc.equal(pc.day(day), d.cast(pa.int64())), pc.equal(pc.month(day), mo.cast(pa.int64())))
    h, mi, s = (part(n).cast(pa.int64()) for n in ("h", "mi", "s"))
    valid = pc.and_(same, pc.and_(pc.less(h, 24), pc.and_(pc.less(mi, 60), pc.less(s, 60))))
    frac = pc.utf8_slice_codeunits(pc.utf8_rpad(part("f", ""), 6, "0"), 0, 6).cast(pa.int64())
    seconds = pc.add(pc.add(day.cast(pa.int64()), pc.multiply(h, 3600)), pc.add(pc.multiply(mi, 60), s))
    seconds = pc.subtract(seconds, _offset_seconds(part("z", "Z")))
    micros = pc.add(pc.multiply(seconds, 1_000_000), frac)
    return pc.if_else(valid.fill_null(False), micros, _NULL_LONG)


def _offset_seconds(zone: pa.Array) -> pa.Array:
    """``Z``, ``UTC``, ``GMT``, ``+hh``, ``+hhmm``, ``+hh:mm`` -> seconds east of UTC
    (hours up to 18)."""
    named = pc.or_(pc.equal(zone, "UTC"), pc.equal(zone, "GMT"))
    digits = pc.if_else(named, "Z", pc.replace_substring(zone, ":", ""))
    sign = pc.if_else(pc.starts_with(digits, "-"), -1, 1)
    hh = pc.utf8_slice_codeunits(digits, 1, 3)
    mm = pc.utf8_slice_codeunits(digits, 3, 5)
    hh = pc.if_else(pc.equal(hh, ""), "0", hh).cast(pa.int64())
    mm = pc.if_else(pc.equal(mm, ""), "0", mm).cast(pa.int64())
    bad = pc.or_(pc.greater(hh, 18), pc.greater_equal(mm, 60))
    secs = pc.multiply(sign, pc.add(pc.multiply(hh, 3600), pc.multiply(mm, 60)))
    return pc.if_else(bad, _NULL_LONG, secs)

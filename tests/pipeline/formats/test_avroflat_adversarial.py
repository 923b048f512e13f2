"""Adversarial review of the bulk Avro decoder (issue 42 speed, ``formats/avroflat.py``).

Each test gives concrete bodies on which a group decoded in bulk (>= BULK_MIN records)
gave other values or dead letters than the reference (fastavro record by record), or
crashed the process, before the review's fixes.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from reconciler.pipeline.formats.avro import BULK_MIN, AvroDecoder

ROOT = Path(__file__).resolve().parents[3]


def _varint(v: int) -> bytes:
    z = ((v << 1) ^ (v >> 63)) & (2**64 - 1)
    out = bytearray()
    while True:
        b, z = z & 0x7F, z >> 7
        if not z:
            return bytes(out + bytes([b]))
        out.append(b | 0x80)


def test_a_union_of_one_type_read_with_branch_index_1_is_a_dead_letter_in_bulk_too():
    # ["string"] is a valid Avro union of one branch. Index 1 names no branch: fastavro
    # raises IndexError (a dead letter). steps_of takes it as flat with branch 0, and the
    # bulk reader accepts any index 0 or 1 (1 read as "null"): the corrupt record becomes
    # a row with a null field, and only when its group has >= BULK_MIN records.
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "id", "type": "long"}, {"name": "s", "type": ["string"]}]}
    decoder = AvroDecoder(3, json.dumps(schema))
    good = [_varint(i) + b"\x00" + _varint(2) + b"ok" for i in range(BULK_MIN - 1)]
    bad = _varint(99) + b"\x02"  # union index 1
    bodies = pa.array([*good, bad], pa.binary())

    reference, why = decoder.per_record(bodies.to_pylist())
    assert why[-1] is not None  # the reference: a dead letter
    small_values, small_why = decoder.decode(bodies.slice(1))  # 63 records: record by record
    assert small_why[-1] == why[-1]

    values, reasons = decoder.decode(bodies)  # 64 records: in bulk
    assert reasons == why, f"bulk kept {values[-1].as_py()} where the reference says {why[-1]!r}"


@pytest.mark.parametrize("union", [["long"], ["null", "long"], ["long", "null"]])
@pytest.mark.parametrize("index", [-1, 1, 2, 2**62, -(2**63)])
def test_a_union_index_the_union_has_not_is_judged_as_the_reference_judges_it(union, index):
    # Only 0..len(union)-1 name a branch; for the others fastavro raises (a dead letter),
    # where 1 is a branch it reads it (null, or the long that follows).
    schema = {"type": "record", "name": "R", "fields": [{"name": "u", "type": union}]}
    decoder = AvroDecoder(5, json.dumps(schema))
    good = (b"\x02" if union[0] == "null" else b"\x00") + _varint(7)
    # nothing after an index that names no branch: a reader taking it for null reads the
    # body to its end and would keep it
    bad = _varint(index) + (_varint(7) if 0 <= index < len(union) and union[index] != "null" else b"")
    bodies = [good] * (BULK_MIN - 1) + [bad]
    reference, why = decoder.per_record(bodies)
    values, reasons = decoder.decode(pa.array(bodies, pa.binary()))
    assert reasons == why
    assert values.to_pylist() == reference.to_pylist()


_CRASH = textwrap.dedent("""
    import json, struct, sys
    import pyarrow as pa
    from types import SimpleNamespace
    from reconciler.pipeline.formats import Field
    from reconciler.pipeline.formats.avro import AvroFormat
    from reconciler.pipeline.formats.registry import WriterSchema

    SCHEMA = {"type": "record", "name": "R", "fields": [{"name": "s", "type": "string"}]}

    class Source:
        wire = True
        def get(self, i):
            return WriterSchema(i, "AVRO", json.dumps(SCHEMA))

    def varint(v):
        z = ((v << 1) ^ (v >> 63)) & (2**64 - 1)
        out = bytearray()
        while True:
            b, z = z & 0x7F, z >> 7
            if not z:
                return bytes(out + bytes([b]))
            out.append(b | 0x80)

    # Bodies of one group, back to back in one buffer: a string length L is checked as
    # pos + L <= end in int64; L = 2**63 - pos wraps to -2**63 and passes. Two such
    # lengths make the column's total (cumsum) wrap back to a small positive number:
    # np.repeat then writes 2**63 items into a buffer of that size.
    bodies = [varint(3) + b"abc"]
    pos = len(bodies[0])
    for _ in range(2):
        start = pos + 10  # after the 10-byte length varint
        bodies.append(varint(2**63 - start))
        pos += len(bodies[-1])
    while len(bodies) < 64:
        bodies.append(varint(200) + b"x" * 200)
        pos += len(bodies[-1])
    values = pa.array([b"\\x00" + struct.pack(">I", 5) + b for b in bodies], pa.binary())
    fmt = AvroFormat(SimpleNamespace(format_options={}, schema_discovery=False), source=Source())
    fields = [Field("s", ("s",), "string")]
    fmt.bulk = False
    ref = fmt.decode(values, fields)
    fmt.bulk = True
    out = fmt.decode(values, fields)
    assert out.dead.to_pylist() == ref.dead.to_pylist(), (out.dead, ref.dead)
    assert out.columns["s"].to_pylist() == ref.columns["s"].to_pylist()
    print("same", ref.dead.to_pylist()[1:3])
""")


def test_string_lengths_that_wrap_int64_are_dead_letters_not_a_crashed_worker():
    # Two records of 10 bytes each (a string length near 2**63) among 62 good ones: the
    # reference makes them dead letters ("truncated body"); the bulk path kills the
    # process (SIGSEGV in np.repeat): the task's Python worker dies on every retry.
    run = subprocess.run([sys.executable, "-c", _CRASH], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"the decoding process died (rc {run.returncode}): {run.stderr[-500:]}"
    assert "truncated body" in run.stdout


def test_float_signalling_nan_bits_are_the_reference_ones():
    # Minor: fastavro reads a float into a Python float (the C float -> double conversion
    # quiets a signalling NaN: 0x7f800001 -> 0x7fc00001); the bulk path keeps the bits.
    # Both are NaN; only the bit pattern in the Parquet file differs with the group size.
    schema = {"type": "record", "name": "R", "fields": [{"name": "f", "type": "float"}]}
    decoder = AvroDecoder(4, json.dumps(schema))
    bodies = [struct.pack("<f", 1.0)] * (BULK_MIN - 1) + [struct.pack("<I", 0x7F800001)]
    values, _ = decoder.decode(pa.array(bodies, pa.binary()))
    reference, _ = decoder.per_record(bodies)
    bulk_bits = values.field("f").to_numpy(zero_copy_only=False)[-1:].view("<u4")[0]
    ref_bits = reference.field("f").to_numpy(zero_copy_only=False)[-1:].view("<u4")[0]
    assert hex(bulk_bits) == hex(ref_bits)

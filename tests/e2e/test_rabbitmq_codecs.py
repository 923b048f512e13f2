"""Sub-entry batches of every codec, end to end (issue 41.4): a real RabbitMQ node fed by
rstream's Producer with each codec (the Java client's formats, ``tests/streams/subentries``),
real Spark, the daemon in this process. Undecodable entries become dead letters at their
offsets and the records after them land, exactly once.
"""

from __future__ import annotations

import pytest
from rstream import CompressionType

import devservices
from reconciler.streams.rabbitmq.codecs import MAX_SUB_ENTRY_BYTES
from tests.e2e import helpers as h
from tests.streams import subentries as se

pytestmark = [pytest.mark.integration, pytest.mark.rabbitmq, pytest.mark.spark]

KINDS = [CompressionType.No, CompressionType.Gzip, CompressionType.Snappy,
         CompressionType.Lz4, CompressionType.Zstd]


def test_every_codec_once_and_undecodable_entries_as_dead_letters(spark, rabbit_node, stream, tmp_path):
    name = stream()
    records = devservices.make_records(5 * 3 * 40 + 2)
    good = iter(records)
    entries: list = [next(good)]
    for kind in KINDS:
        entries += [(kind, [next(good) for _ in range(40)]) for _ in range(3)]
    bomb = se.gzip_of_zeros(512 << 20)
    entries += [
        se.Forged(code=4, payload=b"\x28\xb5\x2f\xfd corrupt", declared=100, count=3),
        se.Forged(code=1, payload=bomb, declared=512 << 20, count=2),
        se.Forged(code=1, payload=bomb, declared=4096, count=1),
        next(good),
    ]
    se.produce(rabbit_node.stream_port, name, entries)
    n_good = len(records)
    dead_at = n_good - 1  # the undecodable entries sit before the last record

    s = h.make_settings(tmp_path)
    h.write_spec(s.specs, h.spec_doc("codecs", h.rabbit_source(rabbit_node.stream_uri, [name]),
                                     task_count=2, max_batch_records=250))
    code, _ = h.run_daemon(s, timeout=240)
    assert code == 0

    h.assert_exactly_once(h.key_counts(spark, s, "codecs"), h.keys(records))
    df = h.read_segments(spark, s, "codecs")
    offsets = {r.id: r["__offset"] for r in df.select("id", "__offset").collect()}
    assert offsets == {k: (i if i < dead_at else i + 6) for i, (k, _) in enumerate(records)}

    dead = h.deadletters(spark, s, "codecs")
    assert [(p, o) for p, o, _ in dead] == [(name, dead_at + i) for i in range(6)]
    reasons = [why for _, _, why in dead]
    assert reasons[0].startswith(f"undecodable sub-entry (zstd) at offsets [{dead_at}, {dead_at + 3}): zstd: ")
    assert reasons[3] == (f"undecodable sub-entry (gzip) at offsets [{dead_at + 3}, {dead_at + 5}): its header "
                          f"declares {512 << 20} bytes uncompressed, more than the {MAX_SUB_ENTRY_BYTES} "
                          "one sub-entry may hold")
    assert reasons[5] == (f"undecodable sub-entry (gzip) at offsets [{dead_at + 5}, {dead_at + 6}): gzip data "
                          "decompresses to more than the 4096 bytes its header declares")
    [st] = h.cli_json(s, "status", "codecs")["supervisors"]
    assert st["lag"] == 0 and st["records"] == n_good + 6 and st["unparseable"] == 6

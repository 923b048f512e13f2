"""The rstream internals the RabbitMQ adapter relies on, checked against the installed rstream.

``reconciler/streams/rabbitmq/_rstream.py`` is the only module that touches rstream's
private attributes, and lists each in ``PRIVATE_ATTRIBUTES``. An rstream upgrade that
removes or changes one fails here, naming the attribute and what it is used for, instead
of failing (or silently slowing down) a range read.
"""

from __future__ import annotations

import asyncio
import inspect
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from rstream import schema
from rstream.client import Client
from rstream.connection import Connection

from reconciler.streams.rabbitmq import _rstream


def _instances() -> dict[str, object]:
    return {
        "Connection": Connection("127.0.0.1", 1),
        "Client": Client(host="127.0.0.1", port=1, frame_max=1024, heartbeat=0),
    }


def test_installed_rstream_is_in_the_pinned_range():
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    pins = [Requirement(d) for d in project["project"]["dependencies"]]
    (pin,) = [r for r in pins if r.name == "rstream"]
    assert pin.specifier, "rstream must be pinned to a version range in pyproject.toml"
    assert "<" in str(pin.specifier), f"rstream has no upper bound: {pin}"
    assert pin.specifier.contains(version("rstream")), (
        f"rstream {version('rstream')} is installed, outside the pinned range {pin.specifier}: "
        "run this file against it, then move the pin"
    )


@pytest.mark.parametrize(
    ("owner", "attribute", "why"),
    _rstream.PRIVATE_ATTRIBUTES,
    ids=[f"{o}.{a}" for o, a, _ in _rstream.PRIVATE_ATTRIBUTES],
)
def test_private_attribute_is_still_there(owner, attribute, why):
    obj = _instances()[owner]
    assert hasattr(obj, attribute), (
        f"rstream {version('rstream')}: {owner}.{attribute} is gone; the RabbitMQ adapter "
        f"uses it ({why}). Adapt reconciler/streams/rabbitmq/_rstream.py"
    )


def test_private_attribute_shapes():
    conn, client = _instances()["Connection"], _instances()["Client"]
    problems = []
    if not isinstance(conn._buffer, bytearray):
        problems.append("Connection._buffer is no longer a bytearray")
    if not inspect.iscoroutinefunction(Connection._read_frame_raw):
        problems.append("Connection._read_frame_raw is no longer a coroutine function")
    if "_read_frame_raw" not in inspect.getsource(Connection.read_frame):
        problems.append(
            "Connection.read_frame no longer reads through _read_frame_raw, so "
            "WholeFrameConnection's override would go unused"
        )
    if not callable(getattr(client._corr_id_seq, "next", None)):
        problems.append("Client._corr_id_seq has no next()")
    if not isinstance(client._tasks, dict):
        problems.append("Client._tasks is no longer a dict of tasks by name")
    if not isinstance(client._is_not_closed, bool):
        problems.append("Client._is_not_closed is no longer a bool")
    if client._conn is not None:
        problems.append("Client._conn is set before start()")
    if not isinstance(client._frames.get(0, asyncio.Queue()), asyncio.Queue) or not hasattr(
        client._frames, "get"
    ):
        problems.append("Client._frames is no longer a mapping of asyncio.Queue by subscription")
    if not hasattr(client, "is_started") or not callable(getattr(client, "stop_task", None)):
        problems.append("Client.is_started / Client.stop_task changed")
    assert not problems, f"rstream {version('rstream')}: " + "; ".join(problems)


def test_the_public_surface_used():
    missing = [
        name
        for name in (
            "add_handler",
            "remove_handler",
            "run_queue_listener_task",
            "stop_queue_listener_task",
            "subscribe",
            "unsubscribe",
            "credit",
            "stream_exists",
            "query_leader_and_replicas",
            "sync_request",
            "authenticate",
            "start",
            "is_connection_alive",
        )
        if not callable(getattr(Client, name, None))
    ]
    assert not missing, f"rstream {version('rstream')}: Client lost {missing}"
    deliver = set(schema.Deliver.__dataclass_fields__)
    wanted = {
        "subscription_id",
        "num_entries",
        "num_records",
        "timestamp",
        "chunk_first_offset",
        "data",
    }
    assert wanted <= deliver, f"schema.Deliver lost {sorted(wanted - deliver)}"
    assert callable(getattr(schema.Deliver, "get_messages", None))
    assert callable(getattr(schema.Frame, "prepare", None)), "schema.Frame.prepare is gone"


def test_whole_frame_connection_drains_the_buffer_first():
    async def main() -> list[bytes]:
        conn = _rstream.WholeFrameConnection("127.0.0.1", 1)
        reader = asyncio.StreamReader()
        conn._reader = reader
        frame1, frame2 = b"\x00\x01abc", b"xyz"
        wire = len(frame1).to_bytes(4, "big") + frame1 + len(frame2).to_bytes(4, "big") + frame2
        conn._buffer.extend(wire[:6])  # what rstream's own reader had buffered
        reader.feed_data(wire[6:])
        reader.feed_eof()
        return [await conn._read_frame_raw(), await conn._read_frame_raw()]

    assert asyncio.run(main()) == [b"\x00\x01abc", b"xyz"]


def test_read_whole_frames_swaps_only_a_plain_connection():
    client = _instances()["Client"]
    client._conn = Connection("127.0.0.1", 1)
    _rstream.read_whole_frames(client)
    assert type(client._conn) is _rstream.WholeFrameConnection
    assert _rstream.frames_waiting(client, 7) is False

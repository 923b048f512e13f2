"""The one seam onto rstream's private attributes; nothing else in the package touches them.

Each use is here because rstream has no public way to do it:

* ``WholeFrameConnection`` / ``read_whole_frames``: rstream's ``Connection`` reads a frame
  256 bytes at a time (``_read``); a range read of megabyte chunks spends its time there.
  The subclass overrides ``_read_frame_raw`` with ``readexactly`` on ``_reader``, after
  draining ``_buffer``, and is installed on a started client (``client._conn.__class__``).
* ``close_quickly``: ``Client.close`` always sleeps 0.2 s; every adapter call closes its
  connections, so this closes them the same way without the pause (``_corr_id_seq``,
  ``_is_not_closed``, ``_tasks``, ``_conn``, ``Connection._writer``).
* ``frames_waiting``: a Deliver rstream has read but not yet handed to the handler sits in
  ``client._frames[subscription id]``; ``Subscription.next_known`` must count it.
* ``read_raw_frame``: the StreamStats exchange reads a frame rstream cannot decode.

``PRIVATE_ATTRIBUTES`` lists them; ``tests/streams/test_rstream_contract.py`` checks each one
against the installed rstream, so an upgrade that moves one fails by name. pyproject.toml
pins rstream to the range that test passed on.
"""

from __future__ import annotations

import asyncio

from rstream import schema
from rstream.client import Client
from rstream.connection import Connection, ConnectionClosed

# (class, attribute, why): checked by tests/streams/test_rstream_contract.py
PRIVATE_ATTRIBUTES: tuple[tuple[str, str, str], ...] = (
    ("Connection", "_reader", "WholeFrameConnection reads frames whole from the StreamReader"),
    ("Connection", "_buffer", "WholeFrameConnection drains what the 256-byte reader buffered"),
    ("Connection", "_writer", "close_quickly closes the socket"),
    (
        "Connection",
        "_read_frame_raw",
        "WholeFrameConnection overrides it; StreamStats reads raw frames",
    ),
    ("Client", "_conn", "read_whole_frames swaps its class; close_quickly drops it"),
    ("Client", "_corr_id_seq", "close_quickly numbers its Close request"),
    ("Client", "_is_not_closed", "close_quickly marks the client closed"),
    ("Client", "_tasks", "close_quickly stops the client's tasks"),
    ("Client", "_frames", "frames_waiting counts Delivers not yet handed over"),
)


class WholeFrameConnection(Connection):
    """rstream's connection, reading each frame whole instead of 256 bytes at a time.

    Installed on a started client (``__class__`` swap), so it first drains what the
    original reader had already buffered.
    """

    async def _exactly(self, n: int) -> bytes:
        assert self._reader is not None
        buf = self._buffer
        try:
            if buf:
                if len(buf) >= n:
                    data = bytes(buf[:n])
                    del buf[:n]
                    return data
                head = bytes(buf)
                buf.clear()
                return head + await self._reader.readexactly(n - len(head))
            return await self._reader.readexactly(n)
        except asyncio.IncompleteReadError:
            raise ConnectionClosed() from None

    async def _read_frame_raw(self) -> bytes:  # type: ignore[override]
        return await self._exactly(int.from_bytes(await self._exactly(4), "big"))


def read_whole_frames(client: Client) -> None:
    """Make a started client read frames whole (see ``WholeFrameConnection``)."""
    if type(client._conn) is Connection:
        client._conn.__class__ = WholeFrameConnection


async def read_raw_frame(conn: Connection) -> bytes:
    """The next frame's body (after the 4-byte length), undecoded."""
    return bytes(await conn._read_frame_raw())


def frames_waiting(client: Client, sub_id: int) -> bool:
    """Whether rstream holds Delivers for ``sub_id`` not yet handed to its handler."""
    waiting = getattr(client, "_frames", {}).get(sub_id)
    return waiting is not None and not waiting.empty()


async def close_quickly(client: Client) -> None:
    """Close a connection without rstream's fixed 0.2 s pause."""
    try:
        if client.is_connection_alive() and client.is_started:
            await asyncio.wait_for(
                client.sync_request(
                    schema.Close(client._corr_id_seq.next(), code=1, reason="OK"),
                    resp_schema=schema.CloseResponse,
                ),
                1.0,
            )
    except BaseException:  # noqa: BLE001 - the connection may already be gone
        pass
    try:
        client._is_not_closed = False
        for name in list(client._tasks):
            await client.stop_task(name)
        conn = client._conn
        client._conn = None
        if conn is not None and conn._writer is not None:
            conn._writer.close()
            try:
                await asyncio.wait_for(conn._writer.wait_closed(), 1.0)
            except BaseException:  # noqa: BLE001
                pass
    except AttributeError:  # a future rstream: fall back to its own close
        await client.close()

"""The StreamStats exchange (RabbitMQ >= 3.11), which rstream has no call for.

rstream's command enum lacks StreamStats (key 28), so it cannot decode the response:
this one request/response exchange runs on a separate plain ``Connection``. The handshake
frames are rstream's; the StreamStats request is declared here as an rstream frame and
its response is decoded by hand (``decode_stream_stats_response``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from rstream import exceptions as rexc
from rstream import schema
from rstream.connection import Connection
from rstream.encoding import decode_frame

from reconciler.streams.rabbitmq._rstream import read_raw_frame
from reconciler.streams.rabbitmq.client import Connections

STREAM_STATS = 28


class _StatsKey:
    """Stands for command key 28 (StreamStats), which rstream's ``Key`` enum lacks."""

    value = STREAM_STATS


@dataclass
class _StreamStatsRequest(schema.Frame):
    key = _StatsKey  # type: ignore[assignment]
    correlation_id: int = field(metadata={"type": schema.T.uint32})
    stream: str = field(metadata={"type": schema.T.string})


_StreamStatsRequest.prepare()


def decode_stream_stats_response(payload: bytes) -> tuple[int, int, dict[str, int]]:
    """``(correlation id, response code, stats)`` from a StreamStats response frame body
    (the bytes after the 4-byte frame length)."""
    pos = 4  # key (0x801c) + version
    corr = int.from_bytes(payload[pos : pos + 4], "big")
    code = int.from_bytes(payload[pos + 4 : pos + 6], "big")
    pos += 6
    stats: dict[str, int] = {}
    if len(payload) >= pos + 4:
        count = int.from_bytes(payload[pos : pos + 4], "big", signed=True)
        pos += 4
        for _ in range(max(0, count)):
            n = int.from_bytes(payload[pos : pos + 2], "big")
            name = payload[pos + 2 : pos + 2 + n].decode("utf-8")
            pos += 2 + n
            stats[name] = int.from_bytes(payload[pos : pos + 8], "big", signed=True)
            pos += 8
    return corr, code, stats


async def stream_stats(conns: Connections, stream: str) -> dict[str, int] | None:
    """StreamStats on a connection of its own; None where the server is older than 3.11
    or answers with an error code other than "stream does not exist" (which raises)."""
    await conns.locator()
    if conns.server_version() < (3, 11):
        return None

    ep = conns.endpoint
    conn = Connection(ep.host, ep.port, ssl.create_default_context() if ep.tls else None)
    await conn.open()
    try:
        corr = 0

        async def request(frame: schema.Frame) -> schema.Frame:
            await conn.write_frame(frame)
            while True:
                got = decode_frame(await read_raw_frame(conn))
                if isinstance(got, schema.Tune):
                    await conn.write_frame(schema.Tune(frame_max=got.frame_max, heartbeat=0))
                    continue
                if getattr(got, "correlation_id", None) == frame.correlation_id:  # type: ignore[attr-defined]
                    got.check_response_code()
                    return got

        def cid() -> int:
            nonlocal corr
            corr += 1
            return corr

        await request(schema.PeerProperties(cid(), properties=[]))
        await request(schema.SaslHandshake(cid()))
        auth = b"\0" + ep.username.encode() + b"\0" + ep.password.encode()
        await request(schema.SaslAuthenticate(cid(), mechanism="PLAIN", data=auth))
        # the server sends Tune next; answer it, then open the vhost
        tune = decode_frame(await read_raw_frame(conn))
        if isinstance(tune, schema.Tune):
            await conn.write_frame(schema.Tune(frame_max=tune.frame_max, heartbeat=0))
        await request(schema.Open(cid(), virtual_host=ep.vhost))
        req = _StreamStatsRequest(cid(), stream)
        await conn.write_frame(req)
        while True:
            raw = await read_raw_frame(conn)
            key = int.from_bytes(raw[:2], "big")
            if key == 0x8000 | STREAM_STATS:
                got_corr, code, stats = decode_stream_stats_response(raw)
                if got_corr != req.correlation_id:
                    continue
                if code == rexc.StreamDoesNotExist.code:
                    raise rexc.StreamDoesNotExist()
                if code > 1:
                    return None
                return stats
    finally:
        await conn.close()

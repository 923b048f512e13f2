"""Spark master URLs and Spark settings, checked once when the settings load (not by every batch)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from reconciler.errors import SparkMisconfigured

CONNECT_PORT = 15002  # Spark Connect's default port

_LOCAL = re.compile(r"local(\[(\*|\d+)(,\d+)?\])?")


def check_master(master: str) -> None:
    """Refuse a master URL Spark would only reject later, deep in a JVM log."""
    m = str(master or "").strip()
    if _LOCAL.fullmatch(m) or m == "yarn" or m.startswith("k8s://https://") or m.startswith("k8s://http://"):
        return
    if m.startswith(("spark://", "sc://")):
        for host, port in endpoints(m):
            if not host or (port is not None and not 0 < port < 65536):
                break
        else:
            if m.startswith("sc://") or all(port is not None for _, port in endpoints(m)):
                return
    raise SparkMisconfigured(
        f"Spark master {m!r} is not a valid URL: use local[*] (or local[N]), spark://HOST:PORT "
        f"(standalone, several masters as spark://h1:7077,h2:7077), sc://HOST:PORT (Spark Connect), "
        f"yarn or k8s://https://HOST:PORT (set --spark-master / RECONCILER_SPARK_MASTER / sparkMaster)")


# Spellings of UTC that Spark accepts for the session time zone.
_UTC_ZONES = {"UTC", "ETC/UTC", "GMT", "ETC/GMT", "Z", "+00:00", "UTC+00:00", "GMT+00:00"}


def check_conf(conf: Mapping[str, Any]) -> None:
    for key in conf:
        if not str(key).startswith("spark."):
            raise SparkMisconfigured(f"Spark setting {key!r} does not start with 'spark.': a typo? "
                                     "(Spark ignores such keys)")
    zone = conf.get("spark.sql.session.timeZone")
    if zone is not None and str(zone).strip().upper() not in _UTC_ZONES:
        # Spark floors and formats times in the session's zone: under another zone the time
        # chunks and the query granularity's floors would be local days and hours labelled UTC.
        raise SparkMisconfigured(
            f"Spark setting spark.sql.session.timeZone={zone!r} is not supported: __time, the "
            "time chunks and the granularities are UTC; remove the setting (the session uses UTC)")


def endpoints(master: str) -> list[tuple[str, int | None]]:
    """(host, port) of each master in spark://h1:p1,h2:p2, or the server of sc://host:port/;params."""
    if master.startswith("sc://"):
        try:
            parts = urlsplit(master.split(";", 1)[0])
            return [(parts.hostname or "", parts.port or CONNECT_PORT)]
        except ValueError:
            return [("", None)]
    out = []
    for hp in master[len("spark://"):].split(","):
        host, _, port = hp.rpartition(":")
        out.append((host.strip("[]"), int(port) if port.isdigit() else None))
    return out

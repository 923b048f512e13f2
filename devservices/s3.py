"""An S3-protocol server for tests: moto's server mode (``moto[server]``, the test extra) on
a free loopback port.

It runs in this process (``ThreadedMotoServer``): its buckets live in moto's in-memory
backend, so ``go_away()`` (the port closes: connections are refused) and ``come_back()``
(a new server on the same port) keep every object, which is what a test of a store that
disappears mid-batch needs. Clients reach it as any S3-compatible store: ``env()`` gives
the standard AWS environment (``AWS_ENDPOINT_URL``, keys, region).

The same server answers AWS Glue; ``devservices/glue.py`` patches its ``UpdateTable`` to refuse
a stale ``VersionId`` as AWS does (moto alone ignores it).
"""

from __future__ import annotations

import logging
import time
import uuid

from devservices.service import ServiceBinaryMissing, ServiceStartError, free_port, tcp_open

ACCESS_KEY = "testing-access-key"
SECRET_KEY = "testing-secret-key-not-real"
REGION = "us-east-1"


class S3Server:
    """``with S3Server() as s3: s3.create_bucket()`` (or ``start()``/``stop()``)."""

    name = "s3"

    def __init__(self, host: str = "127.0.0.1", port: int | None = None):
        self.host = host
        self.port = port or free_port(host)
        self._server = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        """The standard AWS environment of a client of this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION}

    def start(self) -> S3Server:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError as exc:
            raise ServiceBinaryMissing(f"moto[server] is not installed ({exc}): run scripts/setup.sh") from None
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=False)
        self._server.start()
        deadline = time.monotonic() + 20
        while not tcp_open(self.host, self.port):
            if time.monotonic() > deadline:
                raise ServiceStartError(f"moto's S3 server did not answer on {self.endpoint}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def go_away(self) -> None:
        """Close the port (connections refused); the objects stay in moto's backend."""
        self.stop()

    def come_back(self) -> None:
        self.start()

    def client(self):
        import boto3  # comes with moto; tests only: the product reads through pyarrow

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION)

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"rct-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        out: list[str] = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", [])]
        return out

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

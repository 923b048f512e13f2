"""Fixtures of the external-catalog tests: moto's Glue (with ``UpdateTable`` refusing a stale
``VersionId``, devservices/glue.py) on the session's S3 server, and a fresh Glue database
and bucket per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def glue(s3_server, s3_bucket) -> Iterator[dict]:
    """``{"server", "bucket", "database", "properties", "setting"}``: a Glue database and a
    bucket on moto, and the ``catalog`` setting that reaches them."""
    from devservices import glue as glue_mod

    glue_mod.patch_update_table()
    server = glue_mod.GlueServer(port=s3_server.port)  # the same moto process: no second start
    database = server.create_database()
    props = server.catalog_properties()
    yield {"server": server, "bucket": s3_bucket, "database": database, "properties": props,
           "setting": {"type": "glue", "namespace": database, "properties": props}}

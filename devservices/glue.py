"""AWS Glue for tests: the same moto server as ``devservices/s3.py`` (S3 and Glue answer on
one port, in this process), with one difference from moto made to match AWS.

**moto 5.2.5's Glue ignores ``VersionId``.** ``UpdateTable`` never reads it, so a stale
commit (a writer that loaded version 3 and updates after another writer made version 4)
silently overwrites the newer table, where AWS refuses it with
``ConcurrentModificationException``. pyiceberg's ``GlueCatalog`` passes the version it read
as its optimistic lock, and our exactly-once argument for external catalogs rests on that
refusal (RELIABILITY.md, "External catalogs"). ``patch_update_table`` makes moto's
``UpdateTable`` compare the given ``VersionId`` with the table's current one, under a lock
(moto serves requests on threads), and refuse a stale one as AWS does. Without the patch
the tests could not see a lost update. Everything else is moto's own.
"""

from __future__ import annotations

import threading
import uuid

from devservices.s3 import ACCESS_KEY, REGION, SECRET_KEY, S3Server

_lock = threading.Lock()
_patched = False


def patch_update_table() -> None:
    """Make moto's Glue ``UpdateTable`` refuse a stale ``VersionId`` (idempotent, process-wide)."""
    global _patched
    with _lock:
        if _patched:
            return
        from moto.glue.exceptions import GlueClientError
        from moto.glue.responses import GlueResponse

        original = GlueResponse.update_table

        def update_table(self):
            version = self.parameters.get("VersionId")
            with _lock:  # the compare and the update are one step, as Glue's are
                if version is not None:
                    name = (self.parameters.get("TableInput") or {}).get("Name")
                    table = self.glue_backend.get_table(self.parameters.get("DatabaseName"), name)
                    current = str(table._current_version)
                    if str(version) != current:
                        raise GlueClientError("ConcurrentModificationException",
                                              f"Update table failed due to concurrent modifications "
                                              f"(VersionId {version}, current {current})")
                return original(self)

        GlueResponse.update_table = update_table
        _patched = True


class GlueServer(S3Server):
    """moto's server with Glue's ``UpdateTable`` patched (above); S3 on the same port."""

    name = "glue"

    def start(self) -> GlueServer:
        patch_update_table()
        super().start()
        return self

    def glue(self):
        import boto3

        return boto3.client("glue", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION)

    def catalog_properties(self) -> dict[str, str]:
        """pyiceberg ``GlueCatalog`` properties reaching this server (Glue and the S3 file IO)."""
        return {"glue.endpoint": self.endpoint, "glue.region": REGION, "glue.access-key-id": ACCESS_KEY,
                "glue.secret-access-key": SECRET_KEY, "s3.endpoint": self.endpoint, "s3.region": REGION,
                "s3.access-key-id": ACCESS_KEY, "s3.secret-access-key": SECRET_KEY}

    def create_database(self, name: str | None = None) -> str:
        name = name or f"rct_{uuid.uuid4().hex[:12]}"
        self.glue().create_database(DatabaseInput={"Name": name})
        return name

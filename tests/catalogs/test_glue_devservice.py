"""moto's Glue, as devservices/glue.py starts it, refuses a stale ``VersionId`` as AWS does
(moto 5.2.5 alone ignores it: the second commit below would silently win)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from botocore.exceptions import ClientError
from pyiceberg.catalog.glue import GlueCatalog
from pyiceberg.exceptions import CommitFailedException


def test_update_table_refuses_a_stale_version_id(glue):
    client = glue["server"].glue()
    db = glue["database"]
    client.create_table(DatabaseName=db, TableInput={"Name": "t", "Parameters": {"n": "0"}})
    version = client.get_table(DatabaseName=db, Name="t")["Table"]["VersionId"]
    client.update_table(DatabaseName=db, TableInput={"Name": "t", "Parameters": {"n": "1"}}, VersionId=version)
    with pytest.raises(ClientError) as err:
        client.update_table(DatabaseName=db, TableInput={"Name": "t", "Parameters": {"n": "2"}}, VersionId=version)
    assert err.value.response["Error"]["Code"] == "ConcurrentModificationException"
    assert client.get_table(DatabaseName=db, Name="t")["Table"]["Parameters"] == {"n": "1"}


def test_pyiceberg_glue_commit_on_a_stale_table_fails(glue):
    catalog = GlueCatalog("lake", **glue["properties"], warehouse=f"s3://{glue['bucket']}/wh")
    schema = pa.schema([pa.field("id", pa.int64())])
    catalog.create_table((glue["database"], "t"), schema=schema,
                         location=f"s3://{glue['bucket']}/wh/t",
                         properties={"commit.retry.num-retries": "0"})
    first, second = catalog.load_table((glue["database"], "t")), catalog.load_table((glue["database"], "t"))
    # pyiceberg checks its requirements against the table Glue hands it, then updates with the
    # VersionId it read: a writer that committed in between is caught by Glue's refusal only.
    stale = catalog._get_glue_table(database_name=glue["database"], table_name="t")
    first.append(pa.table({"id": [1]}, schema=schema))
    catalog._get_glue_table = lambda **_: stale  # `second` read the table before `first` committed
    try:
        with pytest.raises(CommitFailedException):
            second.append(pa.table({"id": [2]}, schema=schema))
    finally:
        del catalog._get_glue_table
    rows = catalog.load_table((glue["database"], "t")).scan().to_arrow()["id"].to_pylist()
    assert rows == [1]

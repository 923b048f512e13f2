"""The shared-warehouse proof on an object store (``sparkshared.check_shared_dir`` with an
``s3://`` warehouse): real Spark (local), real S3-protocol servers (moto)."""

from __future__ import annotations

import pytest

import devservices
from reconciler.errors import SparkMisconfigured
from reconciler.pipeline.sparkshared import check_shared_dir
from reconciler.table import storage

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_executors_that_reach_the_bucket_pass_and_leave_nothing(spark, s3_server, s3_bucket):
    check_shared_dir(spark, f"s3://{s3_bucket}/wh", tasks=2)
    # (pyarrow keeps an emptied prefix as a zero-byte "wh/_staging/" marker: not a file)
    assert [k for k in s3_server.keys(s3_bucket) if not k.endswith("/")] == []


def test_executors_on_a_wrong_endpoint_are_named_once_clearly(spark, s3_server, s3_bucket):
    """This process reaches the store; the endpoint the executors are given
    (``objectStore.executorEndpoint``) answers nothing."""
    env = s3_server.env()
    dead = f"http://127.0.0.1:{devservices.free_port()}"
    storage.configure(storage.ObjectStore.from_environment({"executorEndpoint": dead}))
    try:
        with pytest.raises(SparkMisconfigured) as err:
            check_shared_dir(spark, f"s3://{s3_bucket}/wh", tasks=2)
    finally:
        storage.configure(None)
    message = str(err.value)
    assert f"s3://{s3_bucket}/wh is not reachable from the Spark executors" in message
    assert "NETWORK_CONNECTION" in message and "AWS_ENDPOINT_URL" in message and "\n" not in message
    assert env["AWS_SECRET_ACCESS_KEY"] not in message
    assert [k for k in s3_server.keys(s3_bucket) if "shared-probe" in k and not k.endswith("/")] == []

"""An error raised in a Spark Python worker is shown as the product's own message (issue 14),
taken from a real PythonException of the tests' SparkSession, not a hand-written string."""

from __future__ import annotations

import pytest

from reconciler.pipeline.worker_errors import product_message

pytestmark = [pytest.mark.integration, pytest.mark.spark]

MESSAGE = "offsets [500, 8500) of stream 'x' are no longer available (deleted by retention)"


def _fail(_):
    from reconciler.errors import PermanentError

    raise PermanentError(MESSAGE)


def test_a_workers_permanent_error_comes_back_as_its_own_message(spark):
    with pytest.raises(Exception) as info:  # noqa: B017 (PySpark's own exception type varies by mode)
        spark.sparkContext.parallelize([1], 1).map(_fail).collect()
    assert "Traceback" in str(info.value)  # Spark's wrapper, as the driver receives it
    found = product_message(info.value)
    assert found is not None and found.kind == "permanent"
    assert found.message == MESSAGE


def test_other_errors_are_left_alone():
    assert product_message(ValueError("plain")) is None

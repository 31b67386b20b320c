"""Offset filters and Spark's filter pushdown for Python data sources.

The commitlog source does not implement ``DataSourceReader.pushFilters``: with the pyspark
this project runs (4.3), a reader's pushed filters outlive the query they were pushed for
(docs/pipeline.md, "Options"). The probe test pins that behaviour, so that a pyspark which
fixes it fails here and pushdown can be reconsidered.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.pipeline.conftest import Log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


@pytest.fixture
def pushdown(spark: SparkSession) -> Iterator[SparkSession]:
    """The session with Python data source filter pushdown turned on for one test."""
    spark.conf.set(PUSHDOWN, "true")
    try:
        yield spark
    finally:
        spark.conf.unset(PUSHDOWN)


def test_offset_filters_with_pushdown_on_lose_no_rows(
    pushdown: SparkSession, varied_log: Log
) -> None:
    from pyspark.sql import functions as F

    df = pushdown.read.format("commitlog").load(str(varied_log.root))
    cut = varied_log.messages[len(varied_log.messages) // 3].physical_offset
    offset = F.col("physical_offset")
    assert df.where(offset < cut).count() == len(varied_log.messages) // 3
    assert df.count() == len(varied_log.messages)
    assert (
        df.where(offset >= cut).count() == len(varied_log.messages) - len(varied_log.messages) // 3
    )
    assert df.count() == len(varied_log.messages)


def test_pyspark_keeps_pushed_filters_for_later_queries(pushdown: SparkSession) -> None:
    """Why pushdown is not implemented: after a filtered query, an unfiltered one over the
    same DataFrame reuses the filtered plan (neither ``pushFilters`` nor ``partitions`` is
    called again) and silently returns the filtered rows."""
    from pyspark.sql import functions as F

    from tests.pipeline._pushdown_probe import ROWS, ProbeSource

    pushdown.dataSource.register(ProbeSource)
    df = pushdown.read.format("pushdown_probe").load()
    assert df.count() == ROWS
    assert df.where(F.col("x") < 10).count() == 10
    unfiltered = df.count()
    assert unfiltered == 10, (
        f"pyspark {__import__('pyspark').__version__} no longer reuses pushed filters "
        f"({unfiltered} rows): offset pushdown can be implemented; update docs/pipeline.md"
    )
    # A DataFrame loaded afresh is planned afresh.
    assert pushdown.read.format("pushdown_probe").load().count() == ROWS


def test_a_reader_with_pushfilters_fails_while_pushdown_is_off(spark: SparkSession) -> None:
    """The other reason: implementing pushFilters makes every read fail unless the session
    turned pushdown on, so a source with it would not work in a default session."""
    from tests.pipeline._pushdown_probe import ProbeSource

    spark.dataSource.register(ProbeSource)
    with pytest.raises(Exception, match="DATA_SOURCE_PUSHDOWN_DISABLED"):
        spark.read.format("pushdown_probe").load().count()

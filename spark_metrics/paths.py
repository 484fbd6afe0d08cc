"""Where the job's input and output live: a local path, or a Hadoop file system (s3a://, hdfs://, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pyspark.sql import SparkSession


def local_path(path: str) -> Path | None:
    """``path`` on the local file system (no scheme, or ``file:``), else None (s3a://, hdfs://, ...).

    ``file:/p``, ``file:///p`` and ``file://localhost/p`` are all ``/p`` (a ``file:`` URI's host is ignored).
    """
    parsed = urlparse(path)
    if parsed.scheme == "file":
        return Path(parsed.path)
    return Path(path) if not parsed.scheme else None


def join(base: str, name: str) -> str:
    """``name`` inside ``base``, for a local path and a URI alike."""
    return base.rstrip("/") + "/" + name


def hadoop_fs(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """The Hadoop ``FileSystem`` that holds ``path``, and ``path`` as a Hadoop ``Path`` (JVM objects)."""
    jvm: Any = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    return hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), hadoop_path

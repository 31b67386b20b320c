"""Starting Spark so that it behaves on a laptop, in CI and on a cluster.

For a ``local[...]`` master everything stays on the loopback interface (``SPARK_LOCAL_IP``,
``spark.driver.host``/``bindAddress``), the Python workers run this very interpreter
(``PYSPARK_PYTHON``, ``spark.pyspark.python``) and can import trioha even from a checkout
(``PYTHONPATH``), shuffles use one partition per core, and the JVM logs only errors. For any
other master those choices belong to the cluster and are left alone.

The two failures people meet first, no Java and no pyspark, become one-line
:class:`PipelineError` messages before any JVM is started.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trioha._errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOCAL = re.compile(r"^local(\[(\*|\d+)(,\d+)?\])?$")

_LOG4J2 = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = {level}
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = {level}
"""


def find_java() -> str:
    """The ``java`` Spark will run: ``$JAVA_HOME/bin/java`` if JAVA_HOME is set, else PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / ("java.exe" if os.name == "nt" else "java")
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
        raise PipelineError(
            f"JAVA_HOME is {home!r} but {candidate} is not an executable; Spark needs "
            "Java 17 or newer: fix JAVA_HOME or unset it to use java from PATH"
        )
    found = shutil.which("java")
    if found is None:
        raise PipelineError(
            "no Java runtime: Spark needs Java 17 or newer; install one "
            "(e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    return found


def require_pyspark() -> None:
    """Fail with a one-line hint when the ``spark`` extra is not (fully) installed.

    The modules are imported, not just looked up, so that a broken install (a pyarrow
    built for another Python, a half-removed package) gets the same clear message.
    """
    missing: list[str] = []
    for name in ("pyspark", "pyarrow", "numpy"):
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
                continue
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise PipelineError(
            f"{', '.join(missing)} not installed: the pipeline needs the spark extra "
            "(pyspark, pyarrow, numpy): pip install 'trioha[spark]'"
        )


def is_local(master: str) -> bool:
    return bool(_LOCAL.match(master))


def local_cores(master: str) -> int:
    """How many cores a ``local[...]`` master uses (``local`` is 1, ``local[*]`` all)."""
    m = _LOCAL.match(master)
    if m is None or m.group(2) is None:
        return 1
    if m.group(2) == "*":
        return os.cpu_count() or 1
    return max(1, int(m.group(2)))


def spark_session(
    master: str | None = None,
    *,
    app_name: str = "trioha-pipeline",
    ui: bool = False,
    progress: bool = False,
    log_level: str = "ERROR",
    conf: Mapping[str, str] | None = None,
    python: str | None = None,
    py_files: Sequence[str] = (),
    jvm_engine: bool = True,
) -> SparkSession:
    """Start (or join) a SparkSession set up as the module docstring says.

    *master* defaults to ``local[*]``, or under ``spark-submit`` to the master it was given.
    *progress* shows Spark's console progress bar (the CLI wants it, tests do not).
    *python* is the interpreter the executors' Python workers run (default: this one for a
    local master, the cluster's choice otherwise). pyspark takes it from the environment
    variable ``PYSPARK_PYTHON`` when the JVM starts, not from ``spark.pyspark.python``
    alone, so it is set there too, before the JVM is launched. *py_files* are shipped to
    every executor and put on its workers' import path (``SparkContext.addPyFile``): the
    zip ``python -m trioha pipeline-dist`` writes, for executors without trioha.
    *jvm_engine* puts the JVM engine's jar on ``spark.jars`` (built on first use, see
    :mod:`trioha.pipeline._jvm`); without a JDK the session starts without it and reads
    take the Python engine. Call ``.stop()`` on the result when done. The commitlog data
    sources are registered.
    """
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started our JVM
    if master is None and not submitted:
        master = "local[*]"
    if not submitted:
        find_java()
    require_pyspark()
    local = master is not None and is_local(master)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        if python is None:
            python = sys.executable
            _export_import_path()
    if python is not None:
        os.environ["PYSPARK_PYTHON"] = python
    for path in py_files:
        if not os.path.isfile(path):
            raise PipelineError(f"py_files: no such file {path}")

    from pyspark.sql import SparkSession

    from trioha.pipeline._source import register

    settings: dict[str, str] = {
        "spark.ui.enabled": str(ui).lower(),
        "spark.ui.showConsoleProgress": str(progress).lower(),
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={_log_config(log_level)}",
    }
    if master is not None and local:
        cores = local_cores(master)
        settings.update(
            {
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.sql.shuffle.partitions": str(max(2, cores)),
                "spark.default.parallelism": str(max(2, cores)),
            }
        )
    if python is not None:
        settings["spark.pyspark.python"] = python
        settings["spark.executorEnv.PYSPARK_PYTHON"] = python
    settings.update(conf or {})
    if jvm_engine and not submitted:
        _add_engine_jar(settings)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    for path in py_files:
        spark.sparkContext.addPyFile(str(Path(path).resolve()))
    register(spark)
    return spark


def _add_engine_jar(settings: dict[str, str]) -> None:
    """Add the JVM engine's jar to ``spark.jars`` (kept with any jars already asked for)."""
    from trioha.pipeline._jvm import ensure_jar, log

    built = ensure_jar()
    if built.path is None:
        log.info("no JVM engine in this session, reads use the Python engine: %s", built.reason)
        return
    jars = [j for j in settings.get("spark.jars", "").split(",") if j]
    settings["spark.jars"] = ",".join([*jars, str(built.path)])


def _export_import_path() -> None:
    """Let local Python workers import trioha the way this process did (e.g. a checkout)."""
    root = str(Path(__file__).resolve().parents[2])
    current = os.environ.get("PYTHONPATH", "")
    parts = [p for p in current.split(os.pathsep) if p]
    if root not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *parts])


def _log_config(level: str) -> str:
    """A log4j2 file that sends only *level* and above to stderr (the JVM reads it once)."""
    path = Path(tempfile.gettempdir()) / f"trioha-spark-log4j2-{level.lower()}.properties"
    text = _LOG4J2.format(level=level.upper())
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path.as_uri()

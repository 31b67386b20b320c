"""The JVM engine: the commit log reader of ``trioha/pipeline/jvm/*.java``, built on demand.

Theory of operation. A Spark data source written in Python hands every row from a Python
worker to the JVM; that hand-off alone costs Spark more than decoding the records does. The
JVM engine decodes in the executors' JVMs instead (a DataSource V2 reader with columnar
batches): the same walk over the record chain, the same validity checks, the same columns
and values as the Python engine (:mod:`trioha.pipeline._decode` and its steps). Partitions are
still planned on the driver by :func:`trioha.pipeline._plan.plan_partitions` and handed over as
a JSON option, so where a partition begins is decided in one place.

The Java sources ship in the package. :func:`ensure_jar` compiles them with ``javac``
against the jars of the installed pyspark into a jar in a cache directory (``$TRIOHA_CACHE_DIR``,
else ``$XDG_CACHE_HOME/trioha``, else ``~/.cache/trioha``), named by a hash of the sources and
the pyspark version, so a rebuilt or upgraded install compiles once and then reuses it (if
that directory cannot be written, ``$TMPDIR/trioha-cache-<uid>``).
:func:`trioha.pipeline.spark_session` puts the jar on ``spark.jars`` before the JVM starts
(Spark then ships it to every executor). Without a JDK, or in a session started elsewhere,
there is no jar and reads take the Python engine (:func:`choose_engine`); nothing fails.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from trioha._errors import PipelineError
from trioha.pipeline._options import Engine, Output, ReadOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from trioha.pipeline._plan import ScanPartition

log = logging.getLogger("trioha.pipeline")

#: The Java class Spark loads (``format`` takes it, or its short name ``commitlog_jvm``).
SOURCE_CLASS = "trioha.pipeline.jvm.CommitLogSource"
SHORT_NAME = "commitlog_jvm"
SOURCES = Path(__file__).with_name("jvm")
_SERVICE = "META-INF/services/org.apache.spark.sql.sources.DataSourceRegister"


@attrs.frozen
class JarResult:
    """The engine's jar, or why there is none (*reason*, one line)."""

    path: Path | None
    reason: str = ""


def cache_dir() -> Path:
    """Where built jars are kept (see the module docstring); created on demand."""
    explicit = os.environ.get("TRIOHA_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trioha"


def spark_jars_dir() -> Path | None:
    """The jars Spark runs with: ``$SPARK_HOME/jars``, else the pip pyspark's."""
    home = os.environ.get("SPARK_HOME")
    candidates = [Path(home) / "jars"] if home else []
    try:
        import pyspark

        candidates.append(Path(pyspark.__file__).parent / "jars")
    except ImportError:
        pass
    return next((c for c in candidates if c.is_dir() and any(c.glob("spark-sql_*.jar"))), None)


def find_javac() -> str | None:
    """``$JAVA_HOME/bin/javac`` if there is one, else ``javac`` from PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / ("javac.exe" if os.name == "nt" else "javac")
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("javac")


def _sources() -> list[Path]:
    return sorted(SOURCES.glob("*.java"))


def jar_key(jars: Path) -> str:
    """A hash of the Java sources and the Spark the jar is compiled against."""
    digest = hashlib.sha256()
    for src in _sources():
        digest.update(src.name.encode())
        digest.update(src.read_bytes())
    try:
        spark_version = importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        spark_version = "unknown"
    digest.update(f"{spark_version} {sorted(p.name for p in jars.glob('spark-*.jar'))}".encode())
    return digest.hexdigest()[:20]


def ensure_jar() -> JarResult:
    """The engine's jar, built into the cache if it is not there yet; never raises."""
    jars = spark_jars_dir()
    if jars is None:
        return JarResult(None, "no Spark jars found (pyspark not installed?)")
    if not _sources():
        return JarResult(None, f"no Java sources in {SOURCES}")
    name = f"trioha-commitlog-{jar_key(jars)}.jar"
    # The user's cache, else a private directory under the temporary one (a read-only home)
    fallback = Path(tempfile.gettempdir()) / f"trioha-cache-{_user()}"
    places = [cache_dir(), fallback]
    for place in places:
        if (place / name).is_file() and (place != fallback or _private(place)):
            return JarResult(place / name)
    javac = find_javac()
    if javac is None:
        return JarResult(None, "no javac (a JDK is needed to build the JVM engine)")
    failures = []
    for place in places:
        try:
            if place == fallback:
                place.mkdir(mode=0o700, exist_ok=True)
                if not _private(place):
                    raise PermissionError("not a directory of this user's alone")
            _build(javac, jars, place / name)
        except OSError as exc:
            failures.append(f"{place}: {exc}")
            continue
        except (subprocess.SubprocessError, PipelineError) as exc:
            return JarResult(None, f"building the JVM engine failed: {exc}")
        return JarResult(place / name)
    return JarResult(None, f"no writable place for the JVM engine's jar ({'; '.join(failures)})")


def _private(place: Path) -> bool:
    """Whether *place* belongs to this user and nobody else may write to it: a jar found
    in a shared temporary directory is loaded into Spark only then."""
    try:
        st = place.stat()
    except OSError:
        return False
    getuid = getattr(os, "getuid", None)
    return getuid is None or (st.st_uid == getuid() and not st.st_mode & 0o022)


def _user() -> str:
    getuid = getattr(os, "getuid", None)
    return str(getuid()) if getuid is not None else os.environ.get("USERNAME", "user")


def _build(javac: str, jars: Path, target: Path) -> None:
    """Compile the sources and write the jar atomically (concurrent builds are harmless)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="trioha-jvm-") as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        out = subprocess.run(
            [
                javac,
                "--release",
                "17",
                "-nowarn",
                "-encoding",
                "UTF-8",
                "-cp",
                str(jars / "*"),
                "-d",
                str(classes),
                *map(str, _sources()),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        if out.returncode != 0:
            lines = (out.stderr or out.stdout).strip().splitlines() or ["no output"]
            raise PipelineError(f"javac exited with {out.returncode}: {lines[0]}")
        partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            jar.writestr(_SERVICE, SOURCE_CLASS + "\n")
            for cls in sorted(classes.rglob("*.class")):
                jar.write(cls, cls.relative_to(classes).as_posix())
        partial.replace(target)


def jvm_loaded(spark: SparkSession) -> bool:
    """Whether the session's driver can load the engine's class (the jar is on spark.jars)."""
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
        jvm.java.lang.Class.forName(SOURCE_CLASS, False, loader)
    except Exception:  # py4j's error for a missing class, or no JVM at all
        return False
    return True


def choose_engine(spark: SparkSession, opts: ReadOptions, engine: str | Engine) -> Engine:
    """The engine that reads *opts*: *engine*, or for ``auto`` the JVM's when it can.

    ``auto`` falls back to Python, with one INFO line saying why, when the output is not
    messages, when ``arrow=false`` asks for the Python rows path, or when the session has no
    jar. ``jvm`` raises :class:`PipelineError` in those cases instead.
    """
    wanted = Engine.parse(engine)
    if wanted is Engine.PYTHON:
        return Engine.PYTHON
    why = ""
    if opts.output is not Output.MESSAGES:
        why = f"output={opts.output.value} is read by the Python engine only"
    elif not opts.arrow:
        why = "arrow=false is the Python engine's row path"
    elif not jvm_loaded(spark):
        why = (
            f"the session has no {SOURCE_CLASS} (no JDK to build it, or the session was "
            "not started by trioha.pipeline.spark_session)"
        )
    if not why:
        return Engine.JVM
    if wanted is Engine.JVM:
        raise PipelineError(f"engine=jvm: {why}")
    log.info("commitlog %s: Python engine: %s", opts.path, why)
    return Engine.PYTHON


def plan_json(plan: Sequence[ScanPartition]) -> str:
    """The driver's plan as the JVM source's ``partitions`` option."""
    return json.dumps(
        [
            {
                "ranges": [
                    {
                        "path": r.segment.path,
                        "start": r.segment.start,
                        "length": r.segment.length,
                        "begin": r.begin,
                        "end": r.end,
                    }
                    for r in p.ranges
                ]
            }
            for p in plan
        ],
        separators=(",", ":"),
    )


def load_jvm(spark: SparkSession, opts: ReadOptions) -> DataFrame:
    """A DataFrame of the JVM source over the partitions planned here, on the driver."""
    return (
        spark.read.format(SOURCE_CLASS)
        .option("partitions", plan_json(opts.plan()))
        .option("decompress", str(opts.decompress).lower())
        .option("batchRows", str(min(opts.batch_rows, 4096)))
        .option("batchBytes", str(opts.batch_bytes))
        .load()
    )


def read_commitlog(
    spark: SparkSession, path: str, *, engine: str | Engine | None = None, **options: object
) -> DataFrame:
    """``spark.read.format("commitlog")`` of *path* with *options*, read by *engine*.

    The same rows either way (docs/pipeline.md, "Engines"); ``auto`` takes the JVM engine
    when the session has its jar and the output is messages, else the Python data source.
    Options are the data source's (``startOffset=...``, ``decompress=True``, ...).
    """
    text = {k: _option_text(v) for k, v in options.items() if v is not None}
    opts = ReadOptions.from_options({**text, "path": path})
    wanted = opts.engine if engine is None else Engine.parse(engine)
    if choose_engine(spark, opts, wanted) is Engine.JVM:
        return load_jvm(spark, opts)
    reader = spark.read.format("commitlog")
    for name, value in text.items():
        if name.lower() != "engine":
            reader = reader.option(name, value)
    return reader.load(path)


def _option_text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)

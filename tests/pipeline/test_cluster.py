"""The documented cluster recipe, run: a standalone Spark cluster on 127.0.0.1 whose
executors do not have trioha installed.

A master and two one-core workers start from the pip pyspark (``spark-class``), once for
this module, everything bound to 127.0.0.1. The executors' Python is this interpreter
started with ``-S`` (no site-packages, so no trioha, installed or editable) and given only the
packages the requirements file ``pipeline-dist`` writes names.

The ``spark-submit`` tests run the lines of docs/pipeline.md's recipe as they are written
there (read out of the file, so the docs cannot drift from what is tested): the
``pipeline-dist`` line, then each ``submit`` line with ``sh`` as a test of its own, with the
documented placeholders moved under a temporary directory (``/shared/...``: the logs, a
replica missing a segment, the export's output; ``/opt/...``: the executors' Python) and the
master's URL put in. Under ``spark-submit`` the driver runs that ``-S`` Python too, so a
command that works took its trioha from the zip, and nothing else. What each prints is checked
against what trioha's own store reads from the log.

The session test starts the driver with ``spark_session(master, python=, py_files=)`` in its
own process, as on a gateway host, and reads (with both engines) and audits there.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.pipeline._logs import SEGMENT, copy_log, expected_row, segments
from tests.pipeline._pythons import link_packages
from tests.pipeline.conftest import MISSING, Log
from trioha.pipeline._jvm import find_javac
from trioha.store import StoredMessage

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "pipeline.md"
LOOPBACK = "127.0.0.1"
NO_JDK = find_javac() is None

#: The documented placeholders, and what the tests put in their place (see `recipe`).
MASTER_URL = "spark://gateway:7077"
MOVED = ("/shared/", "/opt/")

#: The test cluster's configuration (``spark-submit`` reads it from ``SPARK_CONF_DIR``): one
#: executor per application, JVMs with the C1 compiler only (short-lived JVMs on two shared
#: cores otherwise spend much of a run compiling), the driver on the loopback interface.
SPARK_DEFAULTS = f"""\
spark.driver.host {LOOPBACK}
spark.driver.bindAddress {LOOPBACK}
spark.executor.memory 512m
spark.cores.max 1
spark.driver.extraJavaOptions -XX:TieredStopAtLevel=1 -XX:+UseSerialGC
spark.executor.extraJavaOptions -XX:TieredStopAtLevel=1 -XX:+UseSerialGC
"""
PROGRESS = re.compile(r"\d\d:\d\d:\d\d INFO +trioha\.progress: ")
LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


# --- the recipe, as docs/pipeline.md writes it ---------------------------------------------


def documented_block(name: str, language: str) -> str:
    """The code block of docs/pipeline.md between ``<!-- name:begin -->`` and ``end``."""
    text = DOCS.read_text()
    found = re.search(
        rf"<!-- {name}:begin -->\n```{language}\n(.*?)```\n<!-- {name}:end -->", text, re.S
    )
    assert found is not None, f"docs/pipeline.md has no {name} block"
    return found.group(1)


@attrs.frozen
class Command:
    """One documented ``submit`` line: what it runs, with which engine."""

    line: str
    what: str  # audit, stats, export, or the job's file
    engine: str | None
    jars: bool

    @classmethod
    def parse(cls, line: str) -> Command:
        words = shlex.split(line)
        assert words[0] == "submit", line
        words = words[1:]
        jars = words[:1] == ["--jars"]
        if jars:
            words = words[2:]
        resource, args = words[0], words[1:]
        if resource == "$ENTRY":
            what = args[0]
            engine = args[args.index("--engine") + 1] if "--engine" in args else None
        else:
            what, engine = resource, args[-1]
        return cls(line, what, engine, jars)

    @property
    def name(self) -> str:
        return self.what if self.engine is None else f"{self.what} --engine {self.engine}"


def documented_commands() -> tuple[str, list[Command]]:
    """The lines before the first ``submit`` (they define it), and every ``submit`` line."""
    lines = documented_block("spark-submit", "sh").splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("submit "))
    assert all(line.startswith("submit ") for line in lines[first:]), lines[first:]
    return "\n".join(lines[:first]), [Command.parse(line) for line in lines[first:]]


#: What this file checks; the docs must show exactly these (see the first test).
SUBMITTED = {
    "audit",
    "stats --engine python",
    "stats --engine jvm",
    "export --engine python",
    "export --engine jvm",
    "count_topics.py --engine python",
    "count_topics.py --engine jvm",
}


def test_the_docs_show_the_commands_these_tests_run() -> None:
    preamble, commands = documented_commands()
    assert {c.name for c in commands} == SUBMITTED
    assert all(c.jars == (c.engine == "jvm") for c in commands)
    assert "pipeline-dist --out trioha-pipeline.zip" in documented_block("pipeline-dist", "sh")
    for placeholder in (MASTER_URL, *MOVED, "trioha-pipeline.zip"):
        assert placeholder in preamble + "".join(c.line for c in commands), placeholder
    compile(documented_block("count-topics", "python"), "count_topics.py", "exec")


# --- a standalone cluster --------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


def _spark_bin() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin"


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
    raise AssertionError(f"{log.name}: no {text!r} within {timeout} s\n{tail}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A standalone master and two one-core workers on 127.0.0.1, shared by every test of
    this module; yields the master URL."""
    if MISSING:
        pytest.skip("pyspark not installed")
    tmp = tmp_path_factory.mktemp("cluster")
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_LOCAL_HOSTNAME": "localhost",
        "SPARK_WORKER_DIR": str(tmp / "work"),
        "SPARK_NO_DAEMONIZE": "1",
    }
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYTHONPATH", None)
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(_spark_bin() / "spark-class"), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: the worker's executors too
            )
        procs.append(proc)
        return proc, log

    port = _free_port()
    url = f"spark://{LOOPBACK}:{port}"
    try:
        master, mlog = start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", LOOPBACK,
            "--port", str(port),
            "--webui-port", str(_free_port()),
        )  # fmt: skip
        _wait_for(mlog, "I have been elected leader", master, 120)
        workers = []
        for i in range(2):
            started = start(
                f"worker{i}",
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--host", LOOPBACK,
                "--webui-port", str(_free_port()),
                "--cores", "1",
                "--memory", "1g",
                "--work-dir", str(tmp / f"work{i}"),
            )  # fmt: skip
            workers.append(started)
        for worker, wlog in workers:
            _wait_for(wlog, "Successfully registered with master", worker, 120)
        yield url
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


def _executor_python(target: Path, requirements: Path, deps: Path) -> Path:
    """This interpreter without site-packages, given only the packages in *requirements*,
    as a script at *target*."""
    link_packages(deps, {line.split("==")[0] for line in requirements.read_text().split()})
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="{deps}${{PYTHONPATH:+:$PYTHONPATH}}" exec {sys.executable} -S "$@"\n'
    )
    target.chmod(0o755)
    probe = subprocess.run(
        [str(target), "-c", "import trioha"], capture_output=True, text=True, check=False
    )
    assert probe.returncode != 0, "the executors' Python must not find trioha on its own"
    return target


@attrs.frozen
class Recipe:
    """Where the documented recipe runs: *gateway* is the directory the commands run in
    (the zip, the jar and the job are there), *base* the directory ``/shared/...`` and
    ``/opt/...`` are moved under."""

    url: str
    base: Path
    gateway: Path
    env: dict[str, str]
    log: Log
    preamble: str

    def place(self, text: str) -> str:
        """*text* with the documented placeholders put where this recipe has them."""
        text = text.replace(MASTER_URL, self.url)
        for prefix in MOVED:
            text = text.replace(prefix, f"{self.base}{prefix}")
        return text

    def shared(self, documented: str) -> Path:
        return Path(self.place(documented))

    def run(self, script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sh", "-c", self.place(script)],
            cwd=self.gateway,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=280,
            check=False,
        )

    def submit(self, command: Command, code: int = 0) -> list[str]:
        """Run the documented *command*; expect exit *code*; return what it printed but
        the progress lines. (Spark's ``PythonRunner`` merges the driver's stderr into its
        stdout, so the progress log lines and any error are there too.)"""
        started = time.monotonic()
        run = self.run(f"{self.preamble}\n{command.line}")
        print(f"$ {command.line}\n({time.monotonic() - started:.1f} s, exit {run.returncode})")
        print(run.stdout)
        assert run.returncode == code, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
        return [line for line in run.stdout.splitlines() if not PROGRESS.match(line)]


@pytest.fixture(scope="module")
def recipe(cluster: str, varied_log: Log, tmp_path_factory: pytest.TempPathFactory) -> Recipe:
    """The gateway's directory after the documented ``pipeline-dist``, the executors' Python
    at the documented place, the logs at theirs."""
    base = tmp_path_factory.mktemp("recipe")
    assert not any(p in str(base) for p in MOVED)
    gateway = base / "gateway"
    gateway.mkdir()
    tools = base / "gateway-bin"  # `python` is the gateway's, with trioha installed
    tools.mkdir()
    (tools / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (tools / "python").chmod(0o755)
    conf = base / "spark-conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(SPARK_DEFAULTS)
    (conf / "log4j2.properties").write_text(LOG4J2)
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(tools), str(_spark_bin()), os.environ.get("PATH", "")]),
        "PYTHONPATH": str(ROOT),
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_CONF_DIR": str(conf),
    }
    for name in ("PYSPARK_GATEWAY_PORT", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME"):
        env.pop(name, None)
    preamble, _ = documented_commands()
    made = Recipe(cluster, base, gateway, env, varied_log, preamble)
    dist = made.run(documented_block("pipeline-dist", "sh"))
    assert dist.returncode == 0, dist.stderr[-3000:]
    assert "wrote trioha-pipeline.zip" in dist.stdout
    (gateway / "count_topics.py").write_text(documented_block("count-topics", "python"))
    _executor_python(
        made.shared("/opt/py/bin/python"),
        gateway / "trioha-pipeline-requirements.txt",
        base / "executor-deps",
    )
    copy_log(varied_log.root, made.shared("/shared/broker-a/store"))
    replica = copy_log(varied_log.root, made.shared("/shared/broker-a-s/store"))
    segments(replica)[1].unlink()
    made.shared("/shared/export").mkdir()
    return made


def _command(what: str, engine: str | None = None) -> Command:
    if engine == "jvm" and NO_JDK:
        pytest.skip("no javac: pipeline-dist writes no JVM engine jar here")
    _, commands = documented_commands()
    (command,) = [c for c in commands if (c.what, c.engine) == (what, engine)]
    return command


# --- the documented commands -----------------------------------------------------------------


@pytest.mark.slow
def test_the_documented_audit_finds_the_missing_segment(recipe: Recipe) -> None:
    printed = recipe.submit(_command("audit"), code=1)  # 1: the audit found a problem
    lost = segments(recipe.log.root)[1].name
    master, slave = (recipe.shared(f"/shared/{b}/store") for b in ("broker-a", "broker-a-s"))
    assert printed[:3] == [
        f"master {master}/commitlog: 4 segment(s) of {SEGMENT} bytes, data [0, {recipe.log.end})",
        f"slave {slave}/commitlog: 3 segment(s) of {SEGMENT} bytes, data [0, {recipe.log.end})",
        f"  verdict: missing range [{SEGMENT}, {2 * SEGMENT}) ({SEGMENT} bytes)",
    ]
    assert any(f"problem: missing_segment at offset {SEGMENT} ({lost})" in p for p in printed)
    assert printed[-1] == "result: PROBLEMS FOUND (see the lines above)"


def _when(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["python", "jvm"])
def test_the_documented_stats(recipe: Recipe, engine: str) -> None:
    lines = recipe.submit(_command("stats", engine))
    ms = recipe.log.messages
    store = recipe.shared("/shared/broker-a/store")
    head = f"{store}: {len(ms)} messages, {sum(m.total_size for m in ms)} bytes, "
    assert lines[0] == f"{head}offsets [0, {recipe.log.end})"
    topics = {m.topic for m in ms}
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["topic", "queues"])
    got = {line.split()[0]: line.split()[1:] for line in lines[start + 1 : start + 1 + len(topics)]}
    want = {}
    for topic in topics:
        mine = [m for m in ms if m.topic == topic]
        stored = [m.store_timestamp for m in mine]
        want[topic] = [
            str(len({m.queue_id for m in mine})),
            str(len(mine)),
            str(sum(m.total_size for m in mine)),
            _when(min(stored)),
            _when(max(stored)),
        ]
    assert got == want


def _exported(out: Path) -> dict[int, dict[str, object]]:
    """The export read back with pyarrow (topics as strings), timestamps in milliseconds."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    topic = ds.partitioning(pa.schema([("topic", pa.string())]), flavor="hive")
    table = ds.dataset(out, format="parquet", partitioning=topic).to_table()
    rows = {}
    for row in table.to_pylist():
        for name in ("born_timestamp", "store_timestamp"):
            when: datetime.datetime = row[name]
            row[name] = (when - datetime.datetime(1970, 1, 1, tzinfo=when.tzinfo)) // (
                datetime.timedelta(milliseconds=1)
            )
        row["properties"] = dict(row["properties"])
        rows[row["physical_offset"]] = row
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["python", "jvm"])
def test_the_documented_export_writes_every_field(recipe: Recipe, engine: str) -> None:
    command = _command("export", engine)
    out = recipe.shared(shlex.split(command.line)[-1])
    printed = recipe.submit(command)
    ms: list[StoredMessage] = recipe.log.messages
    assert printed == [f"wrote {len(ms)} messages of 4 topic(s) to {out}"]
    rows = _exported(out)
    assert sorted(rows) == [m.physical_offset for m in ms]
    differ = [
        (m.physical_offset, name)
        for m in ms
        for name, value in expected_row(m).items()
        if rows[m.physical_offset][name] != value
    ]
    assert differ == []
    assert set(rows[0]) == set(expected_row(ms[0]))  # every column, nothing else


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["python", "jvm"])
def test_the_documented_job_reads_and_counts(recipe: Recipe, engine: str) -> None:
    printed = recipe.submit(_command("count_topics.py", engine))
    ms = recipe.log.messages
    count = Counter(m.topic for m in ms)
    body = Counter[str]()
    for m in ms:
        body[m.topic] += len(m.body)
    want = [f"{t}\t{count[t]}\t{body[t]}" for t in sorted(count)] + [f"total\t{len(ms)}"]
    assert printed == want


# --- the session form ------------------------------------------------------------------------

_DRIVER = """
import json, sys
from trioha.pipeline import audit_replicas, read_commitlog, spark_session
from trioha.pipeline._jvm import jvm_loaded

master, python, zip_path, store, slave = sys.argv[1:]
spark = spark_session(master, python=python, py_files=[zip_path])
sc = spark.sparkContext

def where(_):
    import os, sys
    import trioha.pipeline
    try:
        import trioha.broker  # noqa: F401
        broker = "importable"
    except ImportError as exc:
        broker = str(exc)
    return (sys.executable, sys.flags.no_site, trioha.pipeline.__file__, os.getpid(), broker)

tasks = sc.parallelize(range(4), 4).map(where).collect()
df = spark.read.format("commitlog").option("partitionBytes", "40000").load(store)
offsets = [r[0] for r in df.select("physical_offset").orderBy("physical_offset").collect()]
report = audit_replicas(spark, store, [slave], chunk_bytes=8192)
jvm = None
if jvm_loaded(spark):  # the engine's jar, shipped by spark.jars, decodes in the executors
    jdf = read_commitlog(spark, store, engine="jvm", partitionBytes=40000)
    jvm = [r[0] for r in jdf.select("physical_offset").orderBy("physical_offset").collect()]
print(json.dumps({
    "jvm": jvm,
    "tasks": tasks,
    "partitions": df.rdd.getNumPartitions(),
    "offsets": offsets,
    "verdicts": [s.verdict.value for s in report.slaves],
    "missing": [[r.start, r.end] for s in report.slaves for r in s.missing],
}))
spark.stop()
"""


@pytest.mark.slow
def test_a_session_on_the_cluster_without_trioha_on_the_executors(recipe: Recipe) -> None:
    env = {**recipe.env, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            _DRIVER,
            recipe.url,
            str(recipe.shared("/opt/py/bin/python")),
            str(recipe.gateway / "trioha-pipeline.zip"),
            str(recipe.shared("/shared/broker-a/store")),
            str(recipe.shared("/shared/broker-a-s/store")),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=280,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    for executable, no_site, module, pid, broker in got["tasks"]:
        assert (executable, no_site) == (sys.executable, 1)
        assert "trioha-pipeline.zip" in module, module  # trioha came from the shipped zip
        assert pid != os.getpid()
        assert broker.startswith("No module named"), broker  # the broker was not shipped
    ms = recipe.log.messages
    assert got["partitions"] > 4
    assert got["offsets"] == [m.physical_offset for m in ms]  # read, every row once
    assert got["verdicts"] == ["missing"]
    assert got["missing"] == [[SEGMENT, 2 * SEGMENT]]
    if not NO_JDK:  # the JVM engine ran in the executors, same rows
        assert got["jvm"] == got["offsets"]

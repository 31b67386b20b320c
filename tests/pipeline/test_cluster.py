"""The documented cluster recipe, run: a standalone Spark cluster on 127.0.0.1 whose
executors do not have trioha installed.

A master and two workers start from the pip pyspark (``spark-class``), everything bound to
127.0.0.1. The executors' Python is this interpreter started with ``-S`` (no site-packages,
so no trioha, installed or editable) and given only the packages the requirements file
``pipeline-dist`` writes names. The driver, in its own process as on a gateway host, ships
the zip ``pipeline-dist`` built and runs a read, a count and an audit there.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pipeline._logs import copy_log, segments
from tests.pipeline.conftest import MISSING, Log
from trioha.pipeline._jvm import find_javac

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"

_DRIVER = """
import json, sys
from trioha.pipeline import audit_replicas, read_commitlog, spark_session
from trioha.pipeline._jvm import jvm_loaded

master, python, zip_path, store, slave = sys.argv[1:]
spark = spark_session(
    master,
    python=python,
    py_files=[zip_path],
    conf={
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
    },
)
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
count = df.count()
offsets = [r[0] for r in df.select("physical_offset").orderBy("physical_offset").collect()]
ids = df.select("msg_id").limit(1).collect()[0][0]
report = audit_replicas(spark, store, [slave], chunk_bytes=8192)
jvm = None
if jvm_loaded(spark):  # the engine's jar, shipped by spark.jars, decodes in the executors
    jdf = read_commitlog(spark, store, engine="jvm", partitionBytes=40000)
    jvm = [r[0] for r in jdf.select("physical_offset").orderBy("physical_offset").collect()]
print(json.dumps({
    "jvm": jvm,
    "tasks": tasks,
    "partitions": df.rdd.getNumPartitions(),
    "count": count,
    "offsets": offsets,
    "msg_id": ids,
    "verdicts": [s.verdict.value for s in report.slaves],
    "missing": [[r.start, r.end] for s in report.slaves for r in s.missing],
}))
spark.stop()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


def _spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


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


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    """A standalone master and two one-core workers on 127.0.0.1; yields the master URL."""
    if MISSING:
        pytest.skip("pyspark not installed")
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_LOCAL_HOSTNAME": "localhost",
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
        "SPARK_NO_DAEMONIZE": "1",
    }
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYTHONPATH", None)
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(_spark_class()), *args],
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
        for i in range(2):
            worker, wlog = start(
                f"worker{i}",
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--host", LOOPBACK,
                "--webui-port", str(_free_port()),
                "--cores", "1",
                "--memory", "1g",
                "--work-dir", str(tmp_path / f"work{i}"),
            )  # fmt: skip
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


def _executor_python(tmp_path: Path, requirements: Path) -> Path:
    """This interpreter without site-packages, given only the packages in *requirements*."""
    import numpy

    site = Path(numpy.__file__).resolve().parents[1]
    deps = tmp_path / "executor-deps"
    deps.mkdir()
    wanted = [line.split("==")[0] for line in requirements.read_text().split()]
    for entry in site.iterdir():
        base = entry.name.split("-")[0].split(".")[0].lower()
        if base in wanted and not entry.name.endswith(".dist-info"):
            (deps / entry.name).symlink_to(entry)
    wrapper = tmp_path / "executor-python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="{deps}${{PYTHONPATH:+:$PYTHONPATH}}" exec {sys.executable} -S "$@"\n'
    )
    wrapper.chmod(0o755)
    probe = subprocess.run(
        [str(wrapper), "-c", "import trioha"], capture_output=True, text=True, check=False
    )
    assert probe.returncode != 0, "the executors' Python must not find trioha on its own"
    return wrapper


def test_a_standalone_cluster_without_trioha_on_the_executors(
    cluster: str, varied_log: Log, tmp_path: Path
) -> None:
    dist = subprocess.run(
        [sys.executable, "-m", "trioha", "pipeline-dist", "--out", str(tmp_path / "tp.zip")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    assert f"wrote {tmp_path / 'tp.zip'}" in dist.stdout
    python = _executor_python(tmp_path, tmp_path / "tp-requirements.txt")
    slave = copy_log(varied_log.root, tmp_path / "slave")
    segments(slave)[1].unlink()

    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": LOOPBACK}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYSPARK_PYTHON", None)
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            _DRIVER,
            cluster,
            str(python),
            str(tmp_path / "tp.zip"),
            str(varied_log.root),
            str(slave),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    for executable, no_site, module, pid, broker in got["tasks"]:
        assert (executable, no_site) == (sys.executable, 1)
        assert "tp.zip" in module, module  # trioha came from the shipped zip
        assert pid != os.getpid()
        assert broker.startswith("No module named"), broker  # the broker was not shipped
    assert got["partitions"] > 4
    assert got["count"] == len(varied_log.messages)
    assert got["offsets"] == [m.physical_offset for m in varied_log.messages]
    assert len(got["msg_id"]) in (32, 56)
    assert got["verdicts"] == ["missing"]
    assert got["missing"] == [[65536, 131072]]
    if find_javac() is not None:  # the JVM engine ran in the executors, same rows
        assert got["jvm"] == got["offsets"]

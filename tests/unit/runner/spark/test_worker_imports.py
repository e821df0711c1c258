"""Spark's Python processes import the installed pyspark, not the zip bundled inside it
(``ember.runner.spark.worker_imports``; ``make venv`` writes the ``.pth`` file)."""

import os
import subprocess
import sys

from ember.runner.spark.worker_imports import CHATTY_WORKERS, KEEP_ZIPS, PTH_NAME, archive_dir, pth_line


def _imported_from(pythonpath: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", "import pyspark, py4j; print(pyspark.__file__); print(py4j.__file__)"],
        env={**os.environ, "PYTHONPATH": pythonpath}, capture_output=True, text=True, check=True,
    )
    return out.stdout


def test_a_process_started_with_sparks_worker_path_imports_pyspark_from_site_packages():
    lib = archive_dir()
    assert lib is not None, "pyspark is pip-installed in the test environment"
    site = os.path.dirname(os.path.dirname(os.path.dirname(lib)))
    assert os.path.isfile(os.path.join(site, PTH_NAME)), "run `make venv` (python -m ember.runner.spark.worker_imports)"
    zips = [os.path.join(lib, name) for name in sorted(os.listdir(lib)) if name.endswith(".zip")]
    # Spark's worker path: its archives first (PythonUtils.sparkPythonPath)
    files = _imported_from(os.pathsep.join(zips)).split()
    assert len(files) == 2 and not any(".zip" in f for f in files), files
    assert all(f.startswith(site) for f in files)


def test_the_line_drops_only_the_archives_of_that_installation():
    lib = "/opt/site/pyspark/python/lib"
    namespace: dict = {}
    paths = [f"{lib}/pyspark.zip", f"{lib}/py4j-0.10.9.9-src.zip", "/elsewhere/pyspark.zip", f"{lib}/extra",
             "/opt/site/pyspark/python/lib2/x.zip", "/opt/site"]
    fake_sys = type(sys)("sys")
    fake_sys.path = list(paths)
    fake_os = type(sys)("os")
    fake_os.environ = {}
    exec(pth_line(lib).splitlines()[0].replace("import os, sys; ", ""), {"sys": fake_sys, "os": fake_os}, namespace)
    assert fake_sys.path == ["/elsewhere/pyspark.zip", f"{lib}/extra", "/opt/site/pyspark/python/lib2/x.zip", "/opt/site"]
    fake_os.environ = {KEEP_ZIPS: "1"}  # kept on request (to measure the difference)
    fake_sys.path = list(paths)
    exec(pth_line(lib).splitlines()[0].replace("import os, sys; ", ""), {"sys": fake_sys, "os": fake_os}, namespace)
    assert fake_sys.path == paths


def test_the_line_quiets_only_the_chatty_spark_process():
    """Spark's transformWithStateInPandas driver process prints its UDF and schemas on every
    query start; its stdout (nothing else: it talks over a socket) goes to os.devnull."""
    quiet = pth_line("/opt/site/pyspark/python/lib").splitlines()[1].replace("import os, sys; ", "")
    for argv, silenced in ((["python", "-m", CHATTY_WORKERS[0]], True), (["python", "-m", "pyspark.worker"], False)):
        fake_sys = type(sys)("sys")
        fake_sys.orig_argv, fake_sys.stdout = argv, "the terminal"
        exec(quiet, {"sys": fake_sys, "os": os})
        assert (fake_sys.stdout != "the terminal") is silenced
        if silenced:
            assert fake_sys.stdout.name == os.devnull
            fake_sys.stdout.close()

"""The driver JVM's class archive is used only when it is whole and this installation's, and
only while it is on (no JVM started here; make venv builds the real one)."""

from ember.job import EnvironmentConfig
from ember.runner.spark import class_archive
from ember.runner.spark.session import session_defaults


def _driver_options():
    return session_defaults(EnvironmentConfig())["spark.driver.extraJavaOptions"]


def test_a_sealed_archive_is_mapped_by_every_session_ember_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(class_archive.OFF_SWITCH, raising=False)
    path = class_archive.archive_path()
    assert path.parent == tmp_path / "jvm" and path.name.startswith("spark-") and path.suffix == ".jsa"
    assert _driver_options() == "-Xss64m"  # none built yet
    path.parent.mkdir(parents=True)
    written = path.with_name("archive.tmp")
    written.write_bytes(b"x" * 1000)
    assert class_archive.seal(written, path) == 1000 and not written.exists()
    assert _driver_options() == f"-Xss64m -XX:SharedArchiveFile={path} -Xlog:cds=off -Xlog:cds+dynamic=off"
    monkeypatch.setenv(class_archive.OFF_SWITCH, "off")
    assert _driver_options() == "-Xss64m"


def test_an_archive_cut_short_or_unrecorded_is_never_mapped(tmp_path, monkeypatch):
    """The JVM crashes mapping a truncated archive: one whose size is not the recorded one,
    or that has no record, is left alone."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(class_archive.OFF_SWITCH, raising=False)
    path = class_archive.archive_path()
    path.parent.mkdir(parents=True)
    written = path.with_name("archive.tmp")
    written.write_bytes(b"x" * 1000)
    class_archive.seal(written, path)
    path.write_bytes(b"x" * 999)
    assert class_archive.java_options() == ""
    path.with_suffix(".json").unlink()
    path.write_bytes(b"x" * 1000)
    assert class_archive.java_options() == ""


def test_the_archive_is_named_for_the_installation_its_java_and_class_path(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    first = class_archive.archive_path()
    other = tmp_path / "jdk2" / "bin" / "java"
    other.parent.mkdir(parents=True)
    other.write_text("")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk2"))
    second = class_archive.archive_path()
    assert second != first
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "conf"))  # first on the driver's class path
    assert class_archive.archive_path() not in (first, second)

"""Sources that are Spark's own: files and ``rate``, plus a scripted test source."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ember.connectors.base import Source
from ember.errors import ConfigError

__all__ = ["FileSource", "RateSource", "ScriptedSource"]

_FILE_FORMATS = ("parquet", "json", "csv", "text", "orc")


@dataclass(frozen=True)
class FileSource(Source):
    """New files appearing in ``path`` (Spark's file stream source). ``schema`` is a Spark DDL string."""

    path: str = ""
    format: str = "json"
    schema: str | None = None
    max_files_per_batch: int | None = None
    options: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.format not in _FILE_FORMATS:
            raise ConfigError(f"FileSource: format must be one of {', '.join(_FILE_FORMATS)}, got {self.format!r}")
        if not self.path:
            raise ConfigError("FileSource: path is required")
        if self.format != "text" and not self.schema:
            raise ConfigError(f"FileSource: streaming {self.format} files need a schema (Spark DDL string)")

    @property
    def schema_ddl(self) -> str | None:
        return "value string" if self.format == "text" else self.schema

    def describe(self) -> str:
        return f"files {self.format} at {self.path}"


@dataclass(frozen=True)
class RateSource(Source):
    """Spark's ``rate`` source: ``(timestamp timestamp, value bigint)`` at ``rows_per_second``."""

    rows_per_second: int = 1000
    partitions: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.rows_per_second, int) or self.rows_per_second <= 0:
            raise ConfigError(f"RateSource: rows_per_second must be a positive int, got {self.rows_per_second!r}")

    @property
    def schema_ddl(self) -> str:
        return "timestamp timestamp, value bigint"

    def describe(self) -> str:
        return f"spark rate {self.rows_per_second}/s"


@dataclass(frozen=True)
class ScriptedSource(Source):
    """A bounded source whose micro-batches are given explicitly — for deterministic tests.

    ``batches`` is a list of batches, each a list of tuples (or dicts) matching
    ``schema`` (Spark DDL). Micro-batch ``i`` of the job holds exactly
    ``batches[i]`` (an empty batch still makes a micro-batch, which lets Spark
    advance the watermark), so tests script batch boundaries and watermarks.
    With ``ends=False`` the source stays open after its last batch (a stream that
    may yet bring more, as a message queue's): the job has no end of input and
    runs until another stop condition (``max_events``, ``duration``).
    ``partitions``: each micro-batch's rows dealt over that many Spark partitions
    (row ``i`` of a batch to partition ``i % partitions``), as a source read in
    parallel delivers them.
    """

    batches: tuple[tuple[Any, ...], ...] = field(default=())
    schema: str = ""
    ends: bool = True
    partitions: int = 1

    def __init__(self, batches: Sequence[Sequence[Any]], schema: str, *, ends: bool = True, partitions: int = 1) -> None:
        if not schema:
            raise ConfigError("ScriptedSource: schema (Spark DDL string) is required")
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise ConfigError(f"ScriptedSource: partitions must be a positive integer, got {partitions!r}")
        frozen = tuple(tuple(_row(r) for r in b) for b in batches)
        object.__setattr__(self, "batches", frozen)
        object.__setattr__(self, "schema", schema)
        object.__setattr__(self, "ends", bool(ends))
        object.__setattr__(self, "partitions", partitions)

    @property
    def bounded(self) -> bool:
        return self.ends

    @property
    def schema_ddl(self) -> str:
        return self.schema

    def describe(self) -> str:
        rows = sum(len(b) for b in self.batches)
        return f"scripted {len(self.batches)} batches, {rows} rows"


def _row(r: Any) -> Any:
    return dict(r) if isinstance(r, dict) else tuple(r)

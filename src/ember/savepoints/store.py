"""Savepoints on disk: an addressable, self-describing, verifiable copy of a job's state.

A savepoint is a directory holding a Spark checkpoint cut at one committed
micro-batch N — the offset and commit logs up to N (source positions), every
operator's state store files up to state version N + 1, Spark's query metadata
and Ember's files (pipeline manifest, generator origins) — plus
``_savepoint.json``: the manifest (job, batch, time, Spark and Ember versions,
state partitions, operators with their keys and state, and the size and
SHA-256 of every file). The manifest is written last and the directory is
renamed into place, so a savepoint either exists whole or not at all; reading
one checks every file against the manifest first, so a corrupted or truncated
savepoint is refused before anything of it is used.

Spark's state files are immutable once written (RocksDB snapshots and
changelogs are named by version and uploaded by rename), which is why a
running job can be copied while it runs: the cut is the newest batch in the
commit log, whose state version exists before the commit entry does.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

from ember.errors import SavepointError
from ember.runner.spark.checkpoint import (
    EMBER_DIR,
    INITIAL_STATE,
    QUIET,
    START_OFFSETS,
    checkpoint_partitions,
    is_runtime_marker,
    last_batch,
)

__all__ = [
    "SavepointError",
    "MANIFEST",
    "FORMAT_VERSION",
    "SavepointInfo",
    "cut_checkpoint",
    "read_manifest",
    "verify",
    "copy_into_checkpoint",
    "list_savepoints",
    "delete_savepoint",
]

MANIFEST = "_savepoint.json"
FORMAT_VERSION = 1
_STATE_FILE = re.compile(r"^(\d+)(?:_[0-9a-f-]+)?\.(changelog|zip|delta|snapshot)$")
# Files never part of a cut: Hadoop's checksums (recomputed on write), in-flight temporary
# files, and Ember's run-time markers (checkpoint.is_runtime_marker: the running job, stop requests,
# the end of input and the sources' done marks).
_SKIP_NAMES = re.compile(r"^\..*\.crc$|\.tmp$|^\..*tmp.*")


@dataclass(frozen=True)
class SavepointInfo:
    path: str
    job: str
    batch_id: int
    created: str
    partitions: int
    size_bytes: int


def _wanted(rel: str, name: str, batch: int) -> bool:
    """Is ``rel/name`` of a checkpoint part of the cut at committed batch ``batch``?"""
    if _SKIP_NAMES.search(name):
        return False
    top = rel.split(os.sep)[0]
    if top in ("offsets", "commits"):
        return name.isdigit() and int(name) <= batch
    if top == "state":
        found = _STATE_FILE.match(name)
        return found is None or int(found.group(1)) <= batch + 1  # state version = batch + 1
    if top == EMBER_DIR:
        # (not: marks of one run, keyed/reach.py; a conversion's state and source positions, needed
        # only until its micro-batch 0 commits, and a cut is at a committed batch: conversion.py)
        return not is_runtime_marker(name) and rel.split(os.sep)[1:2] not in ([QUIET], [INITIAL_STATE]) \
            and not (rel == EMBER_DIR and name == START_OFFSETS)
    return True


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _walk(root: str) -> Iterator[tuple[str, str]]:
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        rel = os.path.relpath(folder, root)
        for name in sorted(files):
            yield ("" if rel == "." else rel), name


def cut_checkpoint(checkpoint: str, dest: str, manifest: dict[str, Any], batch: int | None = None) -> dict[str, Any]:
    """Copy ``checkpoint`` cut at committed ``batch`` (default: the newest) to the
    new directory ``dest`` with its manifest; returns the manifest written."""
    if batch is None:
        batch = last_batch(checkpoint, "commits")
    if batch < 0:
        raise SavepointError(f"the checkpoint {checkpoint} has no committed micro-batch yet: nothing to save")
    if not os.path.exists(os.path.join(checkpoint, "offsets", str(batch))):
        raise SavepointError(f"the checkpoint {checkpoint} has no offsets for batch {batch}")
    if os.path.exists(dest):
        raise SavepointError(f"{dest} already exists; a savepoint is written to a new directory")
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, f".{os.path.basename(dest)}.{uuid.uuid4().hex[:8]}.partial")
    files: dict[str, list[Any]] = {}
    try:
        for rel, name in _walk(checkpoint):
            if not _wanted(rel, name, batch):
                continue
            src = os.path.join(checkpoint, rel, name)
            target_dir = os.path.join(staging, rel)
            os.makedirs(target_dir, exist_ok=True)
            try:
                shutil.copyfile(src, os.path.join(target_dir, name))
            except FileNotFoundError:
                continue  # an old file Spark's maintenance removed meanwhile (not part of version batch + 1)
            key = os.path.join(rel, name) if rel else name
            files[key] = [os.path.getsize(os.path.join(target_dir, name)), _sha256(os.path.join(target_dir, name))]
        full = {
            "format": FORMAT_VERSION,
            **manifest,
            "batch_id": batch,
            "partitions": checkpoint_partitions(checkpoint, batch),
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "files": files,
        }
        with open(os.path.join(staging, MANIFEST), "w") as f:
            json.dump(full, f, indent=1, sort_keys=True)
        os.rename(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return full


def read_manifest(path: str) -> dict[str, Any]:
    """The savepoint's manifest (no file checks; see :func:`verify`)."""
    file = os.path.join(path, MANIFEST)
    if not os.path.isdir(path):
        raise SavepointError(f"no savepoint at {path}: not a directory")
    if not os.path.exists(file):
        raise SavepointError(f"{path} is not a savepoint (no {MANIFEST}); an interrupted savepoint is never completed")
    try:
        with open(file) as f:
            manifest = json.load(f)
    except ValueError as exc:
        raise SavepointError(f"the savepoint manifest {file} is corrupt ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION or "files" not in manifest:
        raise SavepointError(f"{file} is not a savepoint manifest of format {FORMAT_VERSION}")
    return manifest


def verify(path: str) -> dict[str, Any]:
    """The manifest of the savepoint at ``path`` once every file matches it
    (present, same size, same SHA-256); raises :class:`SavepointError` listing what does not."""
    manifest = read_manifest(path)
    problems = []
    for rel, (size, digest) in sorted(manifest["files"].items()):
        file = os.path.join(path, rel)
        if not os.path.exists(file):
            problems.append(f"{rel} is missing")
        elif os.path.getsize(file) != size:
            problems.append(f"{rel} has {os.path.getsize(file):,} bytes, the manifest says {size:,} (truncated or changed)")
        elif _sha256(file) != digest:
            problems.append(f"{rel} does not match its checksum (corrupted)")
    listed = set(manifest["files"])
    extra = [f"{os.path.join(r, n) if r else n}" for r, n in _walk(path) if n != MANIFEST]
    problems += [f"{rel} is not part of the savepoint" for rel in extra if rel not in listed and not _SKIP_NAMES.search(rel)]
    if problems:
        shown = "\n  - ".join(problems[:20]) + (f"\n  - ... and {len(problems) - 20} more" if len(problems) > 20 else "")
        raise SavepointError(f"the savepoint {path} is damaged and was not used:\n  - {shown}")
    return manifest


def copy_into_checkpoint(path: str, checkpoint: str) -> None:
    """Copy a verified savepoint's files into the new (empty) checkpoint directory."""
    manifest = read_manifest(path)
    staging = f"{checkpoint}.{uuid.uuid4().hex[:8]}.restoring"
    try:
        for rel in manifest["files"]:
            target = os.path.join(staging, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(os.path.join(path, rel), target)
        if os.path.isdir(checkpoint):
            os.rmdir(checkpoint)  # empty: the caller checked it holds nothing
        os.rename(staging, checkpoint)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def list_savepoints(root: str) -> list[SavepointInfo]:
    """The complete savepoints directly under ``root``, oldest first."""
    out: list[SavepointInfo] = []
    if not os.path.isdir(root):
        return out
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if not os.path.exists(os.path.join(path, MANIFEST)):
            continue
        try:
            m = read_manifest(path)
        except SavepointError:
            continue
        size = sum(int(s) for s, _ in m["files"].values())
        out.append(SavepointInfo(path, m.get("job", "?"), int(m["batch_id"]), m["created"], int(m.get("partitions") or 0), size))
    return sorted(out, key=lambda s: (s.created, s.path))


def delete_savepoint(path: str) -> None:
    """Delete the savepoint at ``path`` (refused for a directory that is not one)."""
    read_manifest(path)
    shutil.rmtree(path)

"""A store as a folder of Parquet files, and a new store from one: how a replica joins.

`write` exports every table of a store (DuckDB's EXPORT DATABASE: a schema script, a load
script and one Parquet file per table) from one read-only connection, which sees one
committed checkpoint: the buckets, the stages' state and the offsets they cover agree.
`snapshot.json` beside them says what the folder holds (schema version, offsets per topic
and partition, the newest minute), so an operator can tell how far a replica restored from
it has to catch up. `restore` imports such a folder into a store file that does not exist
yet; the worker that opens it resumes from the snapshot's offsets and follows live.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import duckdb

from tailwatch import store
MANIFEST = "snapshot.json"


@dataclass
class Manifest:
    schema_version: int
    written_at: str  # UTC, when the snapshot was taken (wall clock: for people, not decisions)
    newest_minute: str | None  # the newest closed request minute it holds, UTC
    offsets: dict[str, dict[str, int]]  # topic → partition → next offset to read
    rows: dict[str, int]  # table → rows


class SnapshotError(store.StoreError):
    """A snapshot cannot be written or restored (one line for the user)."""


def write(store_path: str | Path, folder: str | Path, wait_s: float = 60.0) -> Manifest:
    """Export the store at `store_path` into `folder` (which must not hold anything yet)."""
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise SnapshotError(f"{folder} is not an empty folder: a snapshot goes into a new one")
    con = store.connect(store_path, read_only=True, wait_s=wait_s)
    try:
        version = store.schema_version(con)
        tables = [t for (t,) in con.execute("SELECT table_name FROM information_schema.tables "
                                            "WHERE table_schema = 'main' ORDER BY 1").fetchall()]
        rows = {t: int(con.execute(f'SELECT count(*) FROM "{t}"').fetchall()[0][0]) for t in tables}
        offsets: dict[str, dict[str, int]] = {}
        for topic, part, nxt in con.execute("SELECT topic, part, next_offset FROM _tw_offsets "
                                            "WHERE next_offset IS NOT NULL ORDER BY 1, 2").fetchall():
            offsets.setdefault(topic, {})[str(part)] = int(nxt)
        newest = con.execute("SELECT strftime(max(window_start), '%Y-%m-%dT%H:%MZ') FROM sli_minute").fetchall()[0][0]
        folder.mkdir(parents=True, exist_ok=True)
        con.execute(f"EXPORT DATABASE '{_quoted(folder)}' (FORMAT parquet, COMPRESSION zstd)")
    except duckdb.Error as exc:
        raise SnapshotError(f"snapshot of {store_path} into {folder}: {str(exc).splitlines()[0]}") from None
    finally:
        con.close()
    manifest = Manifest(schema_version=version, written_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        newest_minute=newest, offsets=offsets, rows=rows)
    (folder / MANIFEST).write_text(json.dumps(asdict(manifest), indent=2) + "\n")
    return manifest


def read_manifest(folder: str | Path) -> Manifest:
    path = Path(folder) / MANIFEST
    try:
        return Manifest(**json.loads(path.read_text()))
    except FileNotFoundError:
        raise SnapshotError(f"{folder} is not a tailwatch snapshot (no {MANIFEST}): write one with "
                            "`tailwatch store snapshot DIR`") from None
    except (ValueError, TypeError) as exc:
        raise SnapshotError(f"{path} cannot be read: {exc}") from None


def restore(folder: str | Path, store_path: str | Path) -> Manifest | None:
    """Import the snapshot in `folder` as the store at `store_path`, if that store holds
    nothing yet; returns the manifest, or None when the store already had data (a replica
    restarted with the same command line resumes from its own store)."""
    store_path = Path(store_path)
    if store_path.exists():
        con = store.connect(store_path, read_only=True, wait_s=60.0)
        try:
            if store.schema_version(con) > 0:
                return None
        finally:
            con.close()
    manifest = read_manifest(folder)
    if manifest.schema_version > store.SCHEMA_VERSION:
        raise SnapshotError(f"snapshot {folder} was written by a newer tailwatch (schema {manifest.schema_version}; "
                            f"this release reads up to {store.SCHEMA_VERSION})")
    partial = store_path.with_name(store_path.name + ".restoring")
    partial.unlink(missing_ok=True)
    store_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = duckdb.connect(str(partial))
        try:
            con.execute(f"IMPORT DATABASE '{_quoted(Path(folder))}'")
        finally:
            con.close()
    except duckdb.Error as exc:
        partial.unlink(missing_ok=True)
        raise SnapshotError(f"restoring {folder}: {str(exc).splitlines()[0]}") from None
    # Whole or not at all: a restore killed half-way leaves no store that looks complete.
    store_path.unlink(missing_ok=True)
    partial.rename(store_path)
    store.connect(store_path).close()  # migrates a snapshot of an older release
    return manifest


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")

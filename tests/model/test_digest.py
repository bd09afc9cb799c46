"""The checkpoint digest cache: a file is hashed once; a changed, replaced or touched file again."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from duplex_actors.model import digest
from duplex_actors.model.digest import cached_sha256, file_sha256


def _hash(path: Path) -> tuple[str, int]:
    """(digest, progress calls)."""
    calls: list[tuple[int, int]] = []
    value = file_sha256(path, progress=lambda done, total: calls.append((done, total)))
    return value, len(calls)


def test_a_file_is_hashed_once_and_again_when_it_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("DUPLEX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(digest, "_CHUNK", 1000)
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"a" * 2500)
    expected = hashlib.sha256(b"a" * 2500).hexdigest()
    assert cached_sha256(path) is None
    assert _hash(path) == (expected, 3)  # read, with progress
    assert _hash(path) == (expected, 0)  # cached: not read
    (entry,) = (tmp_path / "cache" / "digests").glob("*.json")
    assert str(path.resolve()) in entry.read_text()

    # Same size, new content: the modification time changed.
    stat = path.stat()
    path.write_bytes(b"b" * 2500)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert _hash(path) == (hashlib.sha256(b"b" * 2500).hexdigest(), 3)

    # Replaced by another file with the same bytes and times: a new inode.
    other = tmp_path / "other"
    other.write_bytes(b"b" * 2500)
    stat = path.stat()
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    other.replace(path)
    assert path.stat().st_ino != stat.st_ino
    assert _hash(path)[1] == 3

    # Touched only: hashed again (a stat cannot tell it from a rewrite).
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000))
    assert _hash(path)[1] == 3
    assert _hash(path)[1] == 0


def test_an_unwritable_cache_only_costs_a_re_hash(tmp_path, monkeypatch):
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache directory would be")
    monkeypatch.setenv("DUPLEX_CACHE_DIR", str(blocked))
    path = tmp_path / "f"
    path.write_bytes(b"x")
    assert _hash(path) == (hashlib.sha256(b"x").hexdigest(), 1)
    assert _hash(path)[1] == 1


def test_a_hugging_face_blob_is_named_by_its_digest(tmp_path):
    name = hashlib.sha256(b"weights").hexdigest()
    blob = tmp_path / "blobs" / name
    blob.parent.mkdir()
    blob.write_bytes(b"not even those bytes")  # the name is trusted, as the hub's cache does
    link = tmp_path / "model.safetensors"
    link.symlink_to(blob)
    assert _hash(link) == (name, 0)

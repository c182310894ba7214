"""rasterflow.atomic on a real file system: a target is the old file or a complete new one, never part of one, and
no temporary file outlives a write."""

from __future__ import annotations

import ast
import errno
import os
import sys
import threading
from pathlib import Path

import pytest

from rasterflow import atomic
from rasterflow.atomic import atomic_path, publish, write_bytes_atomic, write_text_atomic
from rasterflow.errors import OutputExistsError


def _others(directory: Path, *keep: str) -> list[str]:
    """What is in ``directory`` besides ``keep``: leftover temporary files."""
    return sorted(name for name in os.listdir(directory) if name not in keep)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_writes_the_content_with_the_permissions_of_a_new_file(tmp_path):
    target = tmp_path / "deep" / "er" / "report.json"  # missing parents are made
    assert write_text_atomic(target, "{\"ü\": 1}\n") == target
    assert target.read_bytes() == "{\"ü\": 1}\n".encode()
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask() == atomic.new_file_mode()
    assert atomic.current_umask() == _umask()
    write_bytes_atomic(target, b"\x00\x01", mode=0o600)
    assert target.read_bytes() == b"\x00\x01"
    assert target.stat().st_mode & 0o777 == 0o600
    assert _others(target.parent, "report.json") == []


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_failure_mid_write_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch, error):
    target = tmp_path / "items.json"
    target.write_text("old\n")
    real_fdopen = os.fdopen

    class HalfWriter:
        """A file that takes half of the content, then fails (a full disk, Ctrl-C)."""

        def __init__(self, handle):
            self.handle = handle

        def write(self, data):
            self.handle.write(data[: len(data) // 2])
            self.handle.flush()
            raise error

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: HalfWriter(real_fdopen(fd, *a, **k)))
    with pytest.raises(type(error)):
        write_text_atomic(target, "new content " * 1000)
    monkeypatch.undo()
    assert target.read_text() == "old\n"
    assert _others(tmp_path, "items.json") == []


def test_a_failing_sync_or_move_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "r.json"
    target.write_text("old")

    def boom(*_args, **_kwargs):
        raise OSError(errno.EIO, "Input/output error")

    for name in ("fsync", "replace"):
        with monkeypatch.context() as patched:
            patched.setattr(os, name, boom)
            with pytest.raises(OSError, match="Input/output"):
                write_bytes_atomic(target, b"new")
        assert target.read_text() == "old"
        assert _others(tmp_path, "r.json") == []


def test_fsync_false_does_not_sync(tmp_path, monkeypatch):
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    write_text_atomic(tmp_path / "a", "x", fsync=False)
    assert synced == []
    write_text_atomic(tmp_path / "a", "y")
    assert len(synced) == 1
    assert (tmp_path / "a").read_text() == "y"


def test_without_replace_an_existing_target_is_kept(tmp_path):
    target = tmp_path / "out.tif"
    write_bytes_atomic(target, b"first", replace=False)
    with pytest.raises(OutputExistsError, match="appeared during the run"):
        write_bytes_atomic(target, b"second", replace=False)
    assert target.read_bytes() == b"first"
    assert _others(tmp_path, "out.tif") == []


def test_atomic_path_moves_the_file_into_place_only_when_the_block_succeeds(tmp_path):
    target = tmp_path / "sub" / "ndvi.tif"
    with atomic_path(target, suffix=".tif") as tmp:
        name = os.path.basename(tmp)
        assert os.path.dirname(tmp) == str(target.parent) and name.startswith(".ndvi.tif.") and name.endswith(".tif")
        assert not os.path.lexists(tmp)  # the writer creates it
        Path(tmp).write_bytes(b"v1")
    assert target.read_bytes() == b"v1"

    with pytest.raises(RuntimeError, match="GDAL"):
        with atomic_path(target, fsync=True) as tmp:
            Path(tmp).write_bytes(b"v2, half")
            raise RuntimeError("GDAL failed")
    assert target.read_bytes() == b"v1"
    assert _others(target.parent, "ndvi.tif") == []

    with pytest.raises(OutputExistsError):
        with atomic_path(target, replace=False) as tmp:
            Path(tmp).write_bytes(b"v3")
    assert target.read_bytes() == b"v1"
    assert _others(target.parent, "ndvi.tif") == []

    with pytest.raises(FileNotFoundError):
        with atomic_path(target):
            pass  # nothing written: nothing to move
    with atomic_path(target, fsync=True) as tmp:
        Path(tmp).write_bytes(b"v4")
    assert target.read_bytes() == b"v4"
    assert _others(target.parent, "ndvi.tif") == []


def test_publish_without_hard_links_checks_then_renames(tmp_path, monkeypatch):
    def no_links(*_args):
        raise PermissionError(errno.EPERM, "Operation not permitted")  # e.g. some FUSE and SMB mounts

    monkeypatch.setattr(os, "link", no_links)
    temp, final = tmp_path / ".a.tmp", tmp_path / "a"
    temp.write_text("one")
    publish(temp, final, replace=False)
    assert final.read_text() == "one" and not temp.exists()
    temp.write_text("two")
    with pytest.raises(OutputExistsError):
        publish(temp, final, replace=False)
    assert final.read_text() == "one" and temp.read_text() == "two"  # the caller removes its temporary file
    publish(temp, final, replace=True)
    assert final.read_text() == "two" and not temp.exists()


def test_concurrent_writers_end_with_one_complete_version_and_readers_never_see_part_of_one(tmp_path):
    target = tmp_path / "run_results.json"
    versions = {bytes([65 + i]) * (256 * 1024 + i) for i in range(6)}  # distinct sizes and bytes
    write_bytes_atomic(target, b"initial")
    seen: set[bytes] = set()
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(data: bytes) -> None:
        try:
            for _ in range(15):
                write_bytes_atomic(target, data, fsync=False)
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    def reader() -> None:
        while not stop.is_set():
            seen.add(target.read_bytes())

    watcher = threading.Thread(target=reader)
    watcher.start()
    threads = [threading.Thread(target=writer, args=(data,)) for data in versions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    watcher.join()
    assert not errors, errors
    assert target.read_bytes() in versions
    assert seen <= versions | {b"initial"}, "a reader saw a partly written file"
    assert _others(tmp_path, "run_results.json") == []


def test_the_helper_sits_at_the_bottom_of_the_layering():
    """Standard library and rasterflow.errors only: anything may import it."""
    tree = ast.parse(Path(atomic.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    ours = {name for name in imported if name.split(".")[0] == "rasterflow"}
    assert ours == {"rasterflow.errors"}
    assert all(name.split(".")[0] in sys.stdlib_module_names for name in imported - ours), imported

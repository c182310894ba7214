"""Where outputs live: local paths and fsspec URLs (``s3://...``), whether something is there, its size, removing it,
and uploading a finished local file to an object store, checked against the object.

Moving a finished *local* file into place is :func:`rasterflow.atomic.publish`. Standard library at import time;
fsspec loads inside the functions that need it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from typing import TYPE_CHECKING

from rasterflow.errors import OutputExistsError

if TYPE_CHECKING:  # pragma: no cover
    from fsspec import AbstractFileSystem

__all__ = ["is_remote", "filesystem", "exists", "remove", "path_size", "upload_verified"]


def is_remote(path: str) -> bool:
    """Whether ``path`` is an fsspec URL (``s3://bucket/x.zarr``); ``file://`` URLs and plain paths are local.

    Parameters
    ----------
    path : str
        A local path or a URL.

    Returns
    -------
    bool
    """
    return "://" in str(path) and not str(path).startswith("file://")


def _local(path: str) -> str:
    path = str(path)
    return path[len("file://"):] if path.startswith("file://") else path


def filesystem(path: str) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem of a URL or a local path, and the path inside it.

    Credentials, region and endpoint come from the environment as boto users set them (``AWS_ACCESS_KEY_ID``,
    ``AWS_PROFILE``, ``AWS_REGION``, ``AWS_ENDPOINT_URL[_S3]``...): s3fs hands them to botocore unchanged. The listing
    cache is dropped first: workers (other processes) write objects this process's cached listings never saw.

    Parameters
    ----------
    path : str
        A local path or a URL.

    Returns
    -------
    (fsspec.AbstractFileSystem, str)
        The filesystem and the path inside it.
    """
    import fsspec.core

    fs, inner = fsspec.core.url_to_fs(str(path))
    fs.invalidate_cache()
    return fs, inner


_fs = filesystem


def exists(path: str) -> bool:
    """Whether anything (file, directory, store) exists at ``path``.

    Parameters
    ----------
    path : str
        A local path (a dangling symlink counts) or a URL.

    Returns
    -------
    bool
    """
    if is_remote(path):
        fs, p = _fs(path)
        return bool(fs.exists(p))
    return os.path.lexists(_local(path))


def remove(path: str) -> None:
    """Delete a file or a directory tree at ``path``; no error when it is absent.

    Parameters
    ----------
    path : str
        A local path (a symlink is removed, not followed) or a URL (every object under the prefix).
    """
    if is_remote(path):
        fs, p = _fs(path)
        if fs.exists(p):
            try:
                fs.rm(p, recursive=True)
            except FileNotFoundError:  # an object store's "directory" vanished with its last object
                pass
        return
    p = _local(path)
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p)
    elif os.path.lexists(p):
        os.remove(p)


def path_size(path: str) -> int:
    """Bytes on disk of a file, or of every file under a directory (a Zarr store).

    Parameters
    ----------
    path : str
        A local path or a URL.

    Returns
    -------
    int
        0 for a URL where nothing is.
    """
    if is_remote(path):
        fs, p = _fs(path)
        return int(fs.du(p, total=True)) if fs.exists(p) else 0
    p = _local(path)
    if os.path.isfile(p):
        return os.path.getsize(p)
    total = 0
    for root, _dirs, files in os.walk(p):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:  # pragma: no cover - vanished while walking
                pass
    return total


def _digests(local: str) -> tuple[str, str, int]:
    """(MD5 hex, SHA2-256 hex, size) of a local file, in one pass."""
    md5, sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    size = 0
    with open(local, "rb") as handle:
        for chunk in iter(lambda: handle.read(8 * 2**20), b""):
            md5.update(chunk)
            sha.update(chunk)
            size += len(chunk)
    return md5.hexdigest(), sha.hexdigest(), size


def upload_verified(local: str, url: str, *, replace: bool, part_size: int | None = None) -> str:
    """Upload a finished local file to an fsspec URL in one go, then check that the object is that file.

    s3fs's ``put_file`` sends a file under 100 MiB in one PUT and a larger one as a multipart upload (50 MiB parts,
    more when the file would need over 10,000), which S3 makes visible only when the upload completes: readers never
    see half an object. Without ``replace`` the PUT is conditional (``If-None-Match: *``), so an object that
    appeared meanwhile is never replaced.

    The check: the object's size, then its checksum -- the ETag when it is the MD5 of the bytes (a single-part upload
    without SSE-KMS), otherwise a re-download whose SHA2-256 must equal the local file's. A mismatch deletes the
    object and raises.

    Parameters
    ----------
    local : str
        The finished local file.
    url : str
        Where it goes (an fsspec URL).
    replace : bool
        Whether an existing object may be replaced.
    part_size : int, optional
        Bytes per part of a multipart upload (s3fs's ``chunksize``; at least 5 MiB on S3); default: s3fs's.

    Returns
    -------
    str
        The file's ``file:checksum`` (SHA2-256 multihash), so nobody needs to download it again.

    Raises
    ------
    OutputExistsError
        Without ``replace``: the object exists.
    RunFailedError
        The upload failed, or the object differs from the local file (size or checksum).
    """
    from rasterflow.errors import RunFailedError

    md5, sha, size = _digests(local)
    fs, target = _fs(url)
    if not replace and fs.exists(target):
        raise OutputExistsError(f"output {url} appeared during the run; it was left as it is")
    options = {} if part_size is None else {"chunksize": int(part_size)}
    try:
        fs.put_file(local, target, mode="overwrite" if replace else "create", **options)
    except FileExistsError:  # the conditional PUT lost a race (HTTP 412)
        raise OutputExistsError(f"output {url} appeared during the run; it was left as it is") from None
    except OSError as err:
        if replace or err.errno != errno.ENOSYS:
            raise
        # an S3 API without conditional writes (HTTP 501): the check above is all there is
        fs.put_file(local, target, **options)
    info = fs.info(target)
    problem = ""
    if int(info.get("size", -1)) != size:
        problem = f"{info.get('size')} bytes arrived instead of {size}"
    elif str(info.get("ETag", "")).strip('"') != md5:
        remote_sha = hashlib.sha256()
        with fs.open(target, "rb", block_size=8 * 2**20) as handle:
            for chunk in iter(lambda: handle.read(8 * 2**20), b""):
                remote_sha.update(chunk)
        if remote_sha.hexdigest() != sha:
            problem = f"its SHA2-256 is {remote_sha.hexdigest()}, the file's is {sha}"
    if problem:
        try:
            fs.rm(target)
        except OSError:  # pragma: no cover - best effort; the message says what is wrong
            pass
        raise RunFailedError(f"uploading {url} failed the check: {problem}; the object was deleted")
    return "1220" + sha

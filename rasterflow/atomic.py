"""Atomic local file writes: the file at a path is the old one or the complete new one, never part of one.

Every writer here puts the new content in a temporary file in the *same directory* as the target (a rename is
atomic only within one filesystem), then moves it onto the target in one step:

* :func:`write_bytes_atomic` / :func:`write_text_atomic`: content in memory (a run report, a results file, a STAC
  document, a tile marker);
* :func:`atomic_path`: a context manager yielding a temporary path for writers that make a file by path (GDAL
  writing a COG), moved into place when the ``with`` block ends without an error;
* :func:`publish`: the last step on its own, for callers that manage their temporary files themselves.

The move is ``os.replace`` (whatever is at the target is replaced), or, with ``replace=False``, a hard link that
fails when the target exists: a file that appeared meanwhile is never replaced (:class:`OutputExistsError`). Any
error (an exception or an interrupt, ``BaseException``) removes the temporary file and leaves the target as it was.
Temporary files are hidden (``.<name>.<random>.tmp``) and unique per call, so threads and processes writing one
target each commit a complete version, the last one winning.

Not here: remote objects (an object store's PUT is atomic by itself:
:func:`rasterflow.write.files.upload_verified`) and a Zarr store's staging directory (``os.replace`` cannot move a
directory onto a non-empty one: :mod:`rasterflow.write.zarr` moves the old store aside first, and back on failure).

Standard library only (and :mod:`rasterflow.errors`): it sits at the bottom of the layering, beside ``errors`` and
``units``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from rasterflow.errors import OutputExistsError

__all__ = [
    "write_bytes_atomic",
    "write_text_atomic",
    "atomic_path",
    "publish",
    "temp_path",
    "current_umask",
    "new_file_mode",
]

_TEMP_SUFFIX = ".tmp"
_APPEARED = "appeared during the run; it was left as it is"


def current_umask() -> int:
    """The process umask.

    Read from ``/proc/self/status`` where Linux tells it: ``os.umask()`` can only be read by setting it, which
    changes it for every thread of the process for a moment.

    Returns
    -------
    int
        The umask bits, e.g. ``0o022``.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The permissions ``open()`` gives a new file: ``0o666`` minus the umask.

    Returns
    -------
    int
        Permission bits for :func:`os.chmod`.
    """
    return 0o666 & ~current_umask()


def temp_path(path: str | os.PathLike[str], suffix: str = _TEMP_SUFFIX) -> str:
    """A new hidden name beside ``path`` for a temporary file: ``<dir>/.<name>.<random><suffix>``.

    Nothing is created; the random part (12 hex digits) keeps concurrent writers of one target apart.

    Parameters
    ----------
    path : str or os.PathLike
        The target.
    suffix : str, default ".tmp"
        The end of the name (e.g. ``".tif"`` for a writer that picks its format by extension).

    Returns
    -------
    str
        A path in the target's directory.
    """
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    return os.path.join(directory, f".{name}.{uuid.uuid4().hex[:12]}{suffix}")


def publish(temp: str | os.PathLike[str], final: str | os.PathLike[str], *, replace: bool) -> None:
    """Move a finished local file into place, in one step.

    Parameters
    ----------
    temp : str or os.PathLike
        The finished file, in the same directory (filesystem) as ``final``.
    final : str or os.PathLike
        The target.
    replace : bool
        True: ``os.replace`` (whatever is at ``final`` is replaced). False: a hard link, which fails if ``final``
        exists, atomically, so a file that appeared meanwhile is never replaced; on a filesystem without hard links,
        a check then a rename (a rasterflow output's lock keeps other runs out between the two).

    Raises
    ------
    OutputExistsError
        Without ``replace``: ``final`` exists. ``temp`` is left where it is (the caller removes it).
    """
    if replace:
        os.replace(temp, final)
        return
    try:
        os.link(temp, final)
    except FileExistsError:
        raise OutputExistsError(f"output {os.fspath(final)} {_APPEARED}") from None
    except OSError:  # a filesystem without hard links: check, then rename (the output's lock keeps rasterflow out)
        if os.path.lexists(final):
            raise OutputExistsError(f"output {os.fspath(final)} {_APPEARED}") from None
        os.rename(temp, final)
        return
    os.remove(temp)


def _discard(temp: str) -> None:
    """Remove a temporary file if it is there (after an error: the error that is being raised matters more)."""
    try:
        os.remove(temp)
    except FileNotFoundError:
        pass


def _write_atomic(path: str | os.PathLike[str], data: bytes | str, *, text_encoding: str | None, mode: int | None,
                  fsync: bool, replace: bool) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=_TEMP_SUFFIX, dir=target.parent)
    try:
        # mkstemp creates 0600: give the file the permissions asked (by default those of any new file)
        os.chmod(tmp, new_file_mode() if mode is None else mode)
        handle: IO[Any] = (os.fdopen(fd, "wb") if text_encoding is None
                           else os.fdopen(fd, "w", encoding=text_encoding))
        fd = -1  # the handle owns it now
        with handle:
            handle.write(data)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        publish(tmp, target, replace=replace)
    except BaseException:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
        _discard(tmp)
        raise
    return target


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None, fsync: bool = True,
                       replace: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically: a temporary file beside it, then one move onto it.

    The parent directories are created when missing.

    Parameters
    ----------
    path : str or os.PathLike
        The target (a local path).
    data : bytes
        The whole content.
    mode : int, optional
        The file's permissions; default: those of any new file (``0o666`` minus the umask).
    fsync : bool, default True
        Flush the content to the disk before the move, so a crash cannot leave an empty file at ``path`` (the
        directory entry itself is not synced).
    replace : bool, default True
        False: never replace an existing ``path`` (see :func:`publish`).

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    OutputExistsError
        Without ``replace``: ``path`` exists.
    OSError
        The write failed; ``path`` is as it was and no temporary file is left.
    """
    return _write_atomic(path, bytes(data), text_encoding=None, mode=mode, fsync=fsync, replace=replace)


def write_text_atomic(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8", mode: int | None = None,
                      fsync: bool = True, replace: bool = True) -> Path:
    """Write ``text`` to ``path`` atomically: a temporary file beside it, then one move onto it.

    As :func:`write_bytes_atomic`, the text written through a text-mode file (the platform's newline translation).

    Parameters
    ----------
    path : str or os.PathLike
        The target (a local path).
    text : str
        The whole content.
    encoding : str, default "utf-8"
    mode : int, optional
        The file's permissions; default: those of any new file (``0o666`` minus the umask).
    fsync : bool, default True
        Flush the content to the disk before the move.
    replace : bool, default True
        False: never replace an existing ``path`` (see :func:`publish`).

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    OutputExistsError
        Without ``replace``: ``path`` exists.
    OSError
        The write failed; ``path`` is as it was and no temporary file is left.
    """
    return _write_atomic(path, str(text), text_encoding=encoding, mode=mode, fsync=fsync, replace=replace)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, replace: bool = True, fsync: bool = False,
                suffix: str = _TEMP_SUFFIX) -> Iterator[str]:
    """A temporary path beside ``path`` for a writer that makes a file by its name; moved onto ``path`` when the
    ``with`` block ends without an error.

    The parent directories are created when missing. The writer creates the file (with its own permissions).

    Parameters
    ----------
    path : str or os.PathLike
        The target (a local path).
    replace : bool, default True
        False: never replace an existing ``path`` (see :func:`publish`).
    fsync : bool, default False
        Flush the finished file to the disk before the move (writers such as GDAL do not).
    suffix : str, default ".tmp"
        The end of the temporary name (:func:`temp_path`).

    Yields
    ------
    str
        The temporary path; nothing exists there yet.

    Raises
    ------
    OutputExistsError
        Without ``replace``: ``path`` exists when the block ends.
    FileNotFoundError
        The block ended without making the file.

    Examples
    --------
    >>> with atomic_path("out/ndvi.tif", suffix=".tif") as tmp:  # doctest: +SKIP
    ...     rasterio.shutil.copy(source, tmp, driver="COG")
    """
    final = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(final)), exist_ok=True)
    tmp = temp_path(final, suffix)
    try:
        yield tmp
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        publish(tmp, final, replace=replace)
    except BaseException:
        _discard(tmp)
        raise

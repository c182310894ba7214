"""One lock per output, so overlapping runs of a spec (a slow night, a retry, a second cron entry) never write it at once.

The lock is an OS file lock (``flock`` through the ``filelock`` library) on the hidden file
``.<name>.rasterflow-lock`` beside a local output ``<name>``.
The kernel drops it when its holder dies, however it dies, so a lock left by a dead run is taken over by the next run
without any guessing; the file itself stays (unlinking a lock file others may hold breaks mutual exclusion). The
holder writes its host, pid and start time into the file, so a refused run can say who holds it and since when.

For remote outputs (``s3://...``) the lock lives under ``~/.cache/rasterflow/locks``: it excludes overlapping runs on
this host only (object stores have no lock to take). Two hosts writing one remote output are not kept apart; what
still holds then is the writers' own: a Zarr store at the final prefix is complete only once its consolidated
metadata is written last, a COG object appears whole, and without ``overwrite`` a COG upload is conditional
(``If-None-Match``). Schedule one writer per remote output.

Stdlib + ``filelock`` only.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rasterflow.errors import OutputLocationError, OutputLockedError

if TYPE_CHECKING:
    from filelock import BaseFileLock

__all__ = ["OutputLock", "lock_path_for", "read_holder", "pid_alive"]

LOCK_SUFFIX = ".rasterflow-lock"


def lock_path_for(output_path: str) -> Path:
    """``.<name>.rasterflow-lock`` beside a local output; a per-user cache path for a remote one."""
    text = str(output_path).rstrip("/")
    if "://" in text and not text.startswith("file://"):
        digest = hashlib.sha256(text.encode()).hexdigest()[:24]
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rasterflow" / "locks"
        return base / f"{digest}{LOCK_SUFFIX}"
    if text.startswith("file://"):
        text = text[len("file://"):]
    directory, name = os.path.split(text)
    return Path(directory or ".") / f".{name}{LOCK_SUFFIX}"


def read_holder(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The holder record in a lock file (empty when unreadable or not yet written)."""
    try:
        data = json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except (OSError, ValueError, OverflowError):
        return False
    return True


def _make_dirs(directory: Path, output: str) -> list[Path]:
    """Make the lock's folder (and its parents); the folders made, outermost first."""
    missing: list[Path] = []
    probe = directory
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _location_error(output, directory, err) from None
    return list(reversed(missing))


def _probe_writable(path: Path, output: str) -> None:
    """Create (or open) the lock file for writing, so an unwritable place is said as such, not as a lock held by
    another run (``filelock`` reads any failure to open as "held")."""
    for attempt in range(3):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            break
        except FileNotFoundError as err:
            # a run that wrote nothing removed the folder it had made, between our mkdir and this open: make it again
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError:
                raise _location_error(output, path.parent, err) from None
            if attempt == 2:
                raise _location_error(output, path.parent, err) from None
        except OSError as err:
            raise _location_error(output, path.parent, err) from None
    os.close(fd)


def _location_error(output: str, directory: Path, err: OSError) -> OutputLocationError:
    import errno

    why = {errno.EROFS: "it is on a read-only file system", errno.EACCES: "no permission to write there",
           errno.EPERM: "no permission to write there",
           errno.ENOTDIR: "a file stands where a folder is needed",
           errno.ENOENT: "files cannot be created there (a pseudo file system such as /proc or /sys?)",
           errno.EEXIST: "a file stands where a folder is needed"}.get(err.errno or 0, err.strerror or str(err))
    return OutputLocationError(
        f"cannot write the output {output}: {directory} is not writable ({why}; {err.strerror or err}); nothing was "
        f"written. Change output.path to a folder you can write to (or fix the folder's permissions or mount)")


def _locked_file_is_current(lock: BaseFileLock, path: Path) -> bool:
    """Whether the file ``lock`` holds is still the one at ``path`` (a holder may delete it as it releases)."""
    fd = getattr(getattr(lock, "_context", None), "lock_file_fd", None)
    if fd is None:  # pragma: no cover - another filelock layout: trust it
        return True
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except OSError:
        return False


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another run (it has not written its details yet)"
    return (f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('started_at')}"
            + (f" (spec {holder['spec']})" if holder.get("spec") else ""))


@dataclass
class OutputLock:
    """The lock of one output. Use :meth:`acquire` / :meth:`release`, or as a context manager.

    Attributes
    ----------
    output : str
        The output path as the spec names it (after variables).
    path : Path
        The lock file.
    took_over : dict
        The record of a previous holder whose lock was free when we took it (a run that died), else empty.
    """

    output: str
    spec: str = ""
    path: Path = field(init=False)
    took_over: dict[str, Any] = field(default_factory=dict, init=False)
    _lock: BaseFileLock | None = field(default=None, init=False, repr=False)
    _made_dirs: list[Path] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.path = lock_path_for(self.output)

    def acquire(self) -> OutputLock:
        """Take the lock without waiting.

        Raises
        ------
        OutputLockedError
            Another live run holds it; the message names its host, pid and start time.
        """
        from filelock import FileLock, Timeout

        self._made_dirs = _make_dirs(self.path.parent, self.output)
        _probe_writable(self.path, self.output)
        for _attempt in range(5):
            lock = FileLock(str(self.path), timeout=0, thread_local=False)
            previous = read_holder(self.path)  # read first: the winner's acquire truncates the file
            try:
                lock.acquire(timeout=0)
            except Timeout:
                if not self.path.exists():  # the holder removed it as it released (a run that wrote nothing)
                    continue
                holder = read_holder(self.path)
                raise OutputLockedError(
                    f"output {self.output} is being written by {_describe(holder)}; this run changed nothing. "
                    f"Wait for it to finish (or stop it), then run again.", holder) from None
            if _locked_file_is_current(lock, self.path):
                break
            # the holder removed the lock file between our open and our lock (release(remove=True)): the inode we
            # locked is no longer the lock; take the file that is there now
            lock.release()
        else:  # pragma: no cover - five removals in a row
            raise OutputLockedError(f"output {self.output}: its lock file keeps being replaced; try again", {})
        self._lock = lock
        here = previous.get("host") == socket.gethostname()
        if previous and not (here and previous.get("pid") == os.getpid()) and not (
                here and pid_alive(previous.get("pid", -1))):
            # A record without a lock: its holder died (kill -9, a reboot) and the kernel dropped the lock. (A live
            # holder clears its record when it releases; one that just did is not reported.)
            self.took_over = previous
        record = {"host": socket.gethostname(), "pid": os.getpid(),
                  "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
                  "started_unix": time.time(), "spec": self.spec, "output": self.output}
        with open(self.path, "w") as handle:  # we own it now; contenders only read
            json.dump(record, handle)
            handle.flush()
        return self

    @property
    def held(self) -> bool:
        return self._lock is not None

    def release(self, *, remove: bool = False) -> None:
        """Release the lock (idempotent). The holder record is cleared so a later reader sees no stale holder.

        ``remove``: the run wrote nothing (it failed or was refused before its output existed): the lock file is
        deleted while still held (a contender that opened it meanwhile sees the file gone after locking it and
        takes the new one: :meth:`acquire`), and so are the folders :meth:`acquire` made for it, when empty."""
        if self._lock is None:
            return
        try:
            if remove:
                self.path.unlink(missing_ok=True)
            else:
                with open(self.path, "w"):
                    pass
        except OSError:  # pragma: no cover - the directory vanished
            pass
        self._lock.release()
        self._lock = None
        if remove:
            for directory in reversed(self._made_dirs):
                try:
                    directory.rmdir()
                except OSError:  # not empty (something else was written there) or gone
                    break
        self._made_dirs = []

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

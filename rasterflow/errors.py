"""The exception hierarchy and the process exit codes.

Every error rasterflow raises on purpose derives from :class:`RasterflowError`; each subclass also inherits the
built-in exception it resembles, so callers that catch ``ValueError`` or ``MemoryError`` keep working. Only the CLI
turns errors into exit codes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ExitCode",
    "RasterflowError",
    "SpecError",
    "SpecIssue",
    "ExpressionError",
    "BudgetExceededError",
    "CatalogError",
    "CatalogFileError",
    "NoItemsFoundError",
    "OutputExistsError",
    "ClusterError",
    "RunFailedError",
    "SourceReadError",
    "SourceMismatchError",
    "OutputLockedError",
    "OutputNotOursError",
    "OutputLocationError",
    "UsageError",
    "RunInterrupted",
]


class ExitCode(enum.IntEnum):
    """Process exit codes; part of the contract with cron jobs and CI (SPEC.md)."""

    OK = 0
    RUN_FAILED = 1
    INVALID = 2
    OVER_BUDGET = 3
    USAGE = 64
    """Bad command line (unknown option, missing argument): sysexits' EX_USAGE, distinct from an invalid spec."""
    LOCKED = 75
    """Another run holds the output's lock: sysexits' EX_TEMPFAIL (try again later); nothing was touched."""
    # An interrupted run exits 128 + the signal number (130 SIGINT, 143 SIGTERM, 129 SIGHUP), as shells report it.


class RasterflowError(Exception):
    """Root of every error rasterflow raises on purpose."""

    exit_code: ExitCode = ExitCode.RUN_FAILED


class SpecIssue:
    """One problem found in a spec file, with where it is.

    Attributes
    ----------
    path : str
        The spec file as the user named it.
    line, column : int or None
        1-based position of the offending key or value, when known.
    field : str
        Dotted location in the spec, e.g. ``chunks.y``; empty for file-level problems.
    message : str
        What is wrong and what to change.
    """

    __slots__ = ("path", "line", "column", "field", "message")

    def __init__(self, path: str, line: int | None, column: int | None, field: str, message: str):
        self.path = path
        self.line = line
        self.column = column
        self.field = field
        self.message = message

    def __str__(self) -> str:
        where = self.path
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        what = f"{self.field}: {self.message}" if self.field else self.message
        return f"{where}: {what}"

    def __repr__(self) -> str:
        return f"SpecIssue({str(self)!r})"


class SpecError(RasterflowError, ValueError):
    """The spec file is invalid; carries every problem found, not just the first."""

    exit_code = ExitCode.INVALID

    def __init__(self, issues: list[SpecIssue] | SpecIssue | str):
        if isinstance(issues, str):
            issues = [SpecIssue("<spec>", None, None, "", issues)]
        elif isinstance(issues, SpecIssue):
            issues = [issues]
        self.issues: list[SpecIssue] = list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


class ExpressionError(RasterflowError, ValueError):
    """A band-math expression is malformed, unsafe or names something unknown.

    ``str(err)`` is the full message: the reason, the expression, and a caret under the offending token.
    """

    exit_code = ExitCode.INVALID

    def __init__(self, reason: str, expression: str = "", offset: int | None = None, hint: str = ""):
        self.reason = reason
        self.expression = expression
        self.offset = offset
        self.hint = hint
        parts = [reason]
        if expression:
            parts.append("    " + expression)
            if offset is not None:
                parts.append("    " + " " * offset + "^")
        if hint:
            parts.append(hint)
        super().__init__("\n".join(parts))


class BudgetExceededError(RasterflowError, MemoryError):
    """The static estimate says the job will not fit in the workers' memory."""

    exit_code = ExitCode.OVER_BUDGET


class CatalogError(RasterflowError, RuntimeError):
    """The STAC catalog could not be searched or read."""


class CatalogFileError(CatalogError, ValueError):
    """The spec's local catalog file is of a kind rasterflow does not read: the spec is at fault (exit 2, as any
    other invalid value). A file that does not exist (yet) is a failed run (exit 1): another step may write it."""

    exit_code = ExitCode.INVALID


class NoItemsFoundError(CatalogError, LookupError):
    """The search matched no items; a cron job must notice, so this is a failed run."""

    field: str = ""
    """The search key most likely at fault: ``bbox`` when it misses every item of a local catalog, else empty."""


class OutputExistsError(RasterflowError, FileExistsError):
    """The output exists and ``output.overwrite`` is false."""

    exit_code = ExitCode.INVALID


class ClusterError(RasterflowError, ConnectionError):
    """The Dask cluster could not be started or reached."""


class RunFailedError(RasterflowError, RuntimeError):
    """The computation or the write failed."""


class SourceReadError(RasterflowError, OSError):
    """A source file could not be opened or read; the message names the item, the asset and the href."""


class SourceMismatchError(SourceReadError, ValueError):
    """A source file contradicts its item's metadata (data type, band count, CRS or grid)."""


class OutputNotOursError(OutputExistsError):
    """``overwrite`` was asked but what is at the output path is not a rasterflow output (or is an input of the job,
    or a symlink): rasterflow never deletes it."""


class OutputLocationError(RasterflowError, OSError):
    """The output's location cannot be written (a read-only file system, no permission, a file where a folder is
    needed, a pseudo file system such as ``/proc``): the user's to fix in ``output.path`` or on the disk, so the spec is
    invalid as it stands (exit 2) and ``retry`` does not re-queue it. Nothing was written."""

    exit_code = ExitCode.INVALID


class OutputLockedError(RasterflowError, BlockingIOError):
    """Another run holds the output's lock; the message says which host, pid and since when."""

    exit_code = ExitCode.LOCKED

    def __init__(self, message: str, holder: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.holder = dict(holder or {})


class UsageError(RasterflowError, ValueError):
    """The command line is wrong (a bad ``--var``, an empty selection, no results file to retry)."""

    exit_code = ExitCode.USAGE


class RunInterrupted(KeyboardInterrupt):
    """A signal (SIGINT, SIGTERM, SIGHUP) stopped the run.

    Deliberately *not* a :class:`RasterflowError`: it must pass through every ``except Exception`` (writers, Dask) the
    way ``KeyboardInterrupt`` does, so the run stops where it is and cleans up on the way out.
    """

    def __init__(self, signum: int):
        import signal as _signal

        self.signum = int(signum)
        try:
            self.signal_name = _signal.Signals(self.signum).name
        except ValueError:  # pragma: no cover - an unknown number
            self.signal_name = f"signal {self.signum}"
        super().__init__(self.signal_name)

    @property
    def exit_code(self) -> int:
        """128 + the signal number, what a shell reports for a process ended by that signal."""
        return 128 + self.signum

"""How the CLI shows a run: human lines, or one JSON event per line for a log collector (``--log-format json``).

Event names: ``start``, ``plan``, ``progress``, ``warning``, ``up_to_date``, ``done``, ``error`` (and a few more, see
:data:`rasterflow.commands.Emit`); every event carries ``spec`` (the spec's name) and a UTC ``time``. Stdlib only.
"""

from __future__ import annotations

import json
import re
import os
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Iterator, TextIO

__all__ = ["json_event", "error_fields", "worker_log_env", "ProgressEvents"]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_event(event: str, spec: str | None, stream: TextIO | None = None, **fields: Any) -> None:
    """Write one JSON object on one line: ``{"time", "event", "spec", ...fields}``."""
    record = {"time": _now(), "event": event, "spec": spec, **fields}
    stream = stream or sys.stderr
    stream.write(json.dumps(record, default=str) + "\n")
    stream.flush()


_LOCATED = re.compile(r"^(?P<file>[^\n]+?):(?P<line>\d+)(?::(?P<column>\d+))?: (?:(?P<field>[A-Za-z_][\w.\[\]-]*): )?")


def error_fields(error: BaseException | None, exit_code: int | None = None) -> dict[str, Any]:
    """The structured fields of an ``error`` event: ``type``, ``exit_code``, and where the spec is at fault —
    ``file``, ``line``, ``column``, ``field`` (of the first problem; null when not known) and, for an invalid spec,
    ``issues`` (every problem with its own position)."""
    from rasterflow.errors import RasterflowError, SpecError

    code = exit_code
    if code is None and error is not None:
        code = int(getattr(error, "exit_code", 1)) if isinstance(error, (RasterflowError, KeyboardInterrupt)) else 1
    fields: dict[str, Any] = {"type": type(error).__name__ if error is not None else None,
                              "exit_code": None if code is None else int(code),
                              "file": None, "line": None, "column": None, "field": None}
    if isinstance(error, SpecError) and error.issues:
        issues = [{"file": i.path, "line": i.line, "column": i.column, "field": i.field or None,
                   "message": i.message} for i in error.issues]
        first = issues[0]
        fields.update(file=first["file"], line=first["line"], column=first["column"], field=first["field"],
                      issues=issues)
        return fields
    if error is not None:  # errors of later stages start with the spec's "file:line:col: field: "
        match = _LOCATED.match(str(error))
        if match and not match.group("file").startswith(("http:", "https:", "s3:")):
            fields.update(file=match.group("file"), line=int(match.group("line")),
                          column=int(match.group("column")) if match.group("column") else None,
                          field=match.group("field"))
    return fields


class ProgressEvents:
    """A text stream for :class:`rasterflow.cluster.CountingProgress` that turns its lines into ``progress`` events."""

    def __init__(self, spec: str | None, stream: TextIO | None = None):
        self.spec = spec
        self.stream = stream

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.strip():
                json_event("progress", self.spec, self.stream, message=line.strip())
        return len(text)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return False


@contextmanager
def worker_log_env(path: str | None) -> Iterator[None]:
    """While LocalCluster workers are spawned, tell them (through the environment they inherit) where to log."""
    from rasterflow.workerinit import WORKER_LOG_ENV

    if not path:
        yield
        return
    saved = os.environ.get(WORKER_LOG_ENV)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    open(path, "w").close()  # this run's log: the workers append to it
    os.environ[WORKER_LOG_ENV] = path
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(WORKER_LOG_ENV, None)
        else:
            os.environ[WORKER_LOG_ENV] = saved

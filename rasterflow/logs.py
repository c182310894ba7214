"""How the CLI shows a run: human lines, or one JSON event per line for a log collector (``--log-format json``).

Event names: ``start``, ``plan``, ``progress``, ``warning``, ``up_to_date``, ``done``, ``error`` (and a few more, see
:data:`rasterflow.run.Emit`); every event carries ``spec`` (the spec's name) and a UTC ``time``. Stdlib only.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Iterator, TextIO

__all__ = ["json_event", "worker_log_env", "ProgressEvents"]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_event(event: str, spec: str | None, stream: TextIO | None = None, **fields: Any) -> None:
    """Write one JSON object on one line: ``{"time", "event", "spec", ...fields}``."""
    record = {"time": _now(), "event": event, "spec": spec, **fields}
    stream = stream or sys.stderr
    stream.write(json.dumps(record, default=str) + "\n")
    stream.flush()


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

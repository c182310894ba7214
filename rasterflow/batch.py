"""Batches: specs from folders and globs, selection by name or tag, and the results file of one invocation.

Like dbt's ``run_results.json``: every ``rasterflow run`` writes one results file with an entry per spec (status,
exit code, timings, outputs, the report's path); ``rasterflow retry`` reads it back and reruns the failed,
interrupted and locked entries. Stdlib only.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

from rasterflow.errors import UsageError

__all__ = ["expand_spec_paths", "matches", "ResultsFile", "default_results_path", "RETRY_STATUSES", "RESULTS_ENV"]

SPEC_SUFFIXES = (".yaml", ".yml")
RESULTS_ENV = "RASTERFLOW_RESULTS"
RETRY_STATUSES = ("failed", "interrupted", "locked")
"""What ``retry`` reruns: failed runs, interrupted ones, and those that found the output locked."""


def default_results_path() -> Path:
    """``$RASTERFLOW_RESULTS``, else ``.rasterflow/run_results.json`` in the working directory."""
    from rasterflow.run import DEFAULT_STATE_DIR

    return Path(os.environ.get(RESULTS_ENV) or Path(DEFAULT_STATE_DIR) / "run_results.json")


def expand_spec_paths(args: Sequence[str | os.PathLike]) -> list[Path]:
    """Spec files named by ``args``: files as given, folders as their ``*.yaml`` / ``*.yml`` (sorted, not
    recursive), and glob patterns (``pipelines/*.yaml``, ``pipelines/**/*.yaml``). Each file once, in order.

    Raises
    ------
    UsageError
        A folder or pattern that names no spec file.
    """
    out: list[Path] = []
    seen: set[str] = set()

    def add(path: Path) -> None:
        key = os.path.abspath(path)
        if key not in seen:
            seen.add(key)
            out.append(path)

    for arg in args:
        text = str(arg)
        path = Path(text)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix.lower() in SPEC_SUFFIXES and p.is_file())
            if not found:
                raise UsageError(f"{text} is a folder without spec files (*.yaml, *.yml)")
            for p in found:
                add(p)
        elif glob.has_magic(text) and not path.exists():
            found = sorted(Path(p) for p in glob.glob(text, recursive=True)
                           if Path(p).suffix.lower() in SPEC_SUFFIXES and Path(p).is_file())
            if not found:
                raise UsageError(f"the pattern {text!r} matches no spec file")
            for p in found:
                add(p)
        else:
            add(path)  # a missing file is reported by the loader, with the others
    return out


def matches(name: str, tags: Iterable[str], stem: str, selectors: Sequence[str]) -> bool:
    """Whether a spec matches any selector: ``tag:X`` (a tag, glob allowed), or a name / file stem (glob allowed)."""
    for selector in selectors:
        if selector.startswith("tag:"):
            wanted = selector[4:]
            if any(fnmatch.fnmatchcase(tag, wanted) for tag in tags):
                return True
        elif fnmatch.fnmatchcase(name, selector) or fnmatch.fnmatchcase(stem, selector):
            return True
    return False


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class ResultsFile:
    """The results of one invocation; written after every spec, so an interrupted batch leaves a true file."""

    path: Path
    command: str
    argv: list[str] = field(default_factory=list)
    started_at: str = field(default_factory=_now)
    results: list[dict[str, Any]] = field(default_factory=list)

    def add(self, entry: dict[str, Any]) -> None:
        self.results.append(entry)
        self.write()

    def to_dict(self, finished: bool = False) -> dict[str, Any]:
        from rasterflow import __version__

        counts: dict[str, int] = {}
        for entry in self.results:
            counts[entry.get("status", "?")] = counts.get(entry.get("status", "?"), 0) + 1
        return {"rasterflow_version": __version__, "command": self.command, "argv": self.argv,
                "cwd": os.getcwd(), "started_at": self.started_at, "finished_at": _now() if finished else None,
                "counts": counts, "results": self.results}

    def write(self, finished: bool = False) -> Path:
        """Write atomically (a temporary file beside it, then a rename)."""
        text = json.dumps(self.to_dict(finished), indent=2, default=str) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return self.path

    @staticmethod
    def read(path: str | os.PathLike) -> dict[str, Any]:
        """A results file's content.

        Raises
        ------
        UsageError
            No such file, or not a rasterflow results file.
        """
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise UsageError(f"no results file at {path}; run `rasterflow run ...` first (or pass --results)") from None
        except (OSError, ValueError) as err:
            raise UsageError(f"cannot read the results file {path}: {err}") from None
        if not isinstance(data, dict) or not isinstance(data.get("results"), list):
            raise UsageError(f"{path} is not a rasterflow results file")
        return data


def retry_entries(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries ``retry`` reruns (see :data:`RETRY_STATUSES`)."""
    return [e for e in data["results"] if e.get("status") in RETRY_STATUSES and e.get("spec")]


def argv() -> list[str]:
    return list(sys.argv[1:])

"""Batches: specs from folders and globs, selection by name or tag, and the results file of one invocation.

Like dbt's ``run_results.json``: every ``rasterflow run`` writes one results file with an entry per spec (status,
exit code, timings, outputs, the report's path); ``rasterflow retry`` reads it back and reruns the failed,
interrupted and locked entries.

By default each invocation keeps its own file, ``.rasterflow/results/<UTC time>-<pid>.json`` (two invocations from
one folder, a cron entry and a hand run, no longer overwrite each other's), and ``.rasterflow/run_results.json`` is a
copy of the last one written (its ``results_file`` names the invocation's own file). ``retry`` without ``--results``
reruns every spec whose *latest* result in the kept files is failed, interrupted or locked. The newest
:data:`KEEP_RESULTS` results files and :data:`KEEP_STATE_REPORTS` reports in ``.rasterflow/reports/`` are kept; older
ones are removed. With ``--results PATH`` (or ``$RASTERFLOW_RESULTS``) that one file is written and read, as before.
Stdlib only.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

from rasterflow.atomic import write_text_atomic
from rasterflow.errors import UsageError

__all__ = ["expand_spec_paths", "matches", "ResultsFile", "default_results_path", "RETRY_STATUSES", "RESULTS_ENV",
           "invocation_results", "latest_retry_entries", "prune_state", "KEEP_RESULTS", "KEEP_STATE_REPORTS"]

SPEC_SUFFIXES = (".yaml", ".yml")
RESULTS_ENV = "RASTERFLOW_RESULTS"
RETRY_STATUSES = ("failed", "interrupted", "locked")
"""What ``retry`` reruns: failed runs, interrupted ones, and those that found the output locked."""
KEEP_RESULTS = 100
"""Results files of past invocations kept in ``.rasterflow/results/`` (the newest; older ones are removed)."""
KEEP_STATE_REPORTS = 200
"""Run reports kept in ``.rasterflow/reports/`` (those of refused, up-to-date, locked and failed-before-writing runs;
the newest; older ones are removed). The report beside an output is never removed."""


def default_results_path() -> Path:
    """``$RASTERFLOW_RESULTS``, else ``.rasterflow/run_results.json`` in the working directory."""
    from rasterflow.commands import DEFAULT_STATE_DIR

    return Path(os.environ.get(RESULTS_ENV) or Path(DEFAULT_STATE_DIR) / "run_results.json")


def expand_spec_paths(args: Sequence[str | os.PathLike[str]]) -> list[Path]:
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
    pointer: Path | None = None
    """Also written as a copy (``.rasterflow/run_results.json``: the last invocation's results)."""

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
                "results_file": str(self.path), "counts": counts, "results": self.results}

    def write(self, finished: bool = False) -> Path:
        """Write atomically (a temporary file beside it, then a rename), and the pointer copy when there is one."""
        text = json.dumps(self.to_dict(finished), indent=2, default=str) + "\n"
        for target in [self.path] + ([self.pointer] if self.pointer is not None else []):
            # as written before the shared helper: private (0600, mkstemp's mode) and not synced to the disk
            write_text_atomic(target, text, mode=0o600, fsync=False)
        return self.path

    @staticmethod
    def read(path: str | os.PathLike[str]) -> dict[str, Any]:
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


def _results_dir(pointer: Path) -> Path:
    return pointer.parent / "results"


def invocation_results(explicit: Path | None, command: str, args: list[str]) -> ResultsFile:
    """The results file of this invocation: ``explicit`` (``--results`` / ``$RASTERFLOW_RESULTS``) as named, else its
    own file in ``.rasterflow/results/`` with ``.rasterflow/run_results.json`` as the pointer to the last."""
    if explicit is not None or os.environ.get(RESULTS_ENV):
        return ResultsFile(Path(explicit or default_results_path()), command, args)
    pointer = default_results_path()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return ResultsFile(_results_dir(pointer) / f"{stamp}-{os.getpid()}.json", command, args, pointer=pointer)


def _entry_key(entry: dict[str, Any]) -> str:
    spec = str(entry.get("spec") or "")
    return json.dumps([os.path.normpath(spec), entry.get("variables") or {}], sort_keys=True)


def latest_retry_entries() -> tuple[list[dict[str, Any]], str]:
    """For ``retry`` without ``--results``: the specs whose latest result in the kept results files (oldest first,
    each invocation's entries after the previous one's) is failed, interrupted or locked; and where they were read.

    Raises
    ------
    UsageError
        No results at all (no run yet in this folder).
    """
    pointer = default_results_path()
    files = sorted(_results_dir(pointer).glob("*.json")) if _results_dir(pointer).is_dir() else []
    if not files:  # results written before the per-invocation files: the single file
        data = ResultsFile.read(pointer)
        return [dict(e, cwd=data.get("cwd")) for e in retry_entries(data)], str(pointer)
    latest: dict[str, dict[str, Any]] = {}
    datas = []
    for path in files:
        try:
            data = ResultsFile.read(path)
        except UsageError:  # half-written or foreign: skip it
            continue
        datas.append((data.get("started_at") or "", str(path), data))
    for _started, _name, data in sorted(datas, key=lambda d: (d[0], d[1])):
        for entry in data["results"]:
            if entry.get("spec"):
                latest[_entry_key(entry)] = dict(entry, cwd=data.get("cwd"))
    entries = [e for e in latest.values() if e.get("status") in RETRY_STATUSES]
    return entries, str(_results_dir(pointer))


def prune_state(pointer: Path | None = None, *, keep_results: int = KEEP_RESULTS,
                keep_reports: int = KEEP_STATE_REPORTS) -> None:
    """Remove all but the newest ``keep_results`` results files and ``keep_reports`` reports of the state folder
    (``.rasterflow``). Never fails a run: what cannot be removed stays."""
    state = (pointer or default_results_path()).parent
    for folder, pattern, keep in ((state / "results", "*.json", keep_results),
                                  (state / "reports", "*.report.json", keep_reports)):
        try:
            files = sorted(folder.glob(pattern), key=lambda p: (p.stat().st_mtime, p.name))
        except OSError:
            continue
        for old in files[: max(0, len(files) - keep)]:
            try:
                old.unlink()
                if folder.name == "reports":  # its memory plot, when there is one
                    old.with_suffix(".png").unlink(missing_ok=True)
            except OSError:
                pass


def retry_entries(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries ``retry`` reruns (see :data:`RETRY_STATUSES`)."""
    return [e for e in data["results"] if e.get("status") in RETRY_STATUSES and e.get("spec")]


def argv() -> list[str]:
    return list(sys.argv[1:])

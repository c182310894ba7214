"""What a run leaves beside its output: where its report goes, its worker log, and what the report records."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import TYPE_CHECKING

from rasterflow.planning import JobPlan

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.report import RunReport, StageTimer


def timer_for(report: RunReport) -> StageTimer:
    """A stage timer that adds into ``report.stage_seconds``."""
    from rasterflow.report import StageTimer

    return StageTimer(report.stage_seconds)


def report_fingerprint(report: RunReport, job_id: str) -> None:
    """Record the output's fingerprint in the report (the COG's proof of origin; Zarr also keeps it in its attrs)."""
    report.fingerprint = job_id


def worker_log_path(report_file: Path | None) -> str | None:
    if report_file is None:
        return None
    name = report_file.name
    stem = name[: -len(".report.json")] if name.endswith(".report.json") else report_file.stem
    return str(report_file.with_name(stem + ".workers.log"))


def drop_if_empty(path: str | None) -> None:
    """Remove the worker log when the workers said nothing (the usual case)."""
    try:
        if path and os.path.getsize(path) == 0:
            os.remove(path)
    except OSError:
        pass


def output_exists(output_path: str, fmt: str, expected: list[str]) -> bool:
    """Whether anything of the output is there: the output, one of its files, or a Zarr run's kept blocks."""
    from rasterflow.write.common import exists, zarr_staging_path

    paths = [output_path, *expected] + ([zarr_staging_path(output_path)] if fmt == "zarr" else [])
    try:
        return any(exists(p) for p in paths)
    except Exception:  # cannot tell: keep the files as they are
        return True


def report_fallbacks(first: Path, state_dir: str | os.PathLike[str], name: str, status: str) -> list[Path]:
    """Where the report goes: ``first``, else (an unwritable output folder) ``<state_dir>/reports/``."""
    fallback = _state_report_path(state_dir, name, status)
    return [first] if Path(first).parent == fallback.parent else [first, fallback]


def _state_report_path(state_dir: str | os.PathLike[str], name: str, status: str) -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(state_dir) / "reports" / f"{name}-{stamp}-{os.getpid()}-{status}.report.json"


def report_destination(own: Path | None, state_dir: str | os.PathLike[str], name: str, *, committed: bool,
                        lost_lock: bool, status: str, explicit: bool) -> Path:
    """Beside the output when this run owns it (or ``--report`` was given), else ``<state_dir>/reports/``."""
    from rasterflow.outputs import report_may_replace

    if own is not None and (explicit or committed or (
            not lost_lock and status not in ("up_to_date", "would_run")
            and report_may_replace(str(own), committed=committed))):
        return own
    return _state_report_path(state_dir, name, status)


def record_plan(report: RunReport, plan: JobPlan) -> None:
    report.grid = {"crs": plan.grid.crs, "bounds": list(plan.grid.bounds), "shape": list(plan.grid.shape),
                   "transform": list(plan.grid.transform)}
    report.chunks = dict(plan.chunks)
    report.task_count = plan.report.task_count
    report.predicted_peak_per_worker = plan.report.peak_per_worker
    report.predicted_client_peak = plan.report.client_peak
    report.memory_limit = plan.layout.memory_limit

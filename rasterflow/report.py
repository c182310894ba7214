"""The run report: what ran, on what, predicted versus measured memory, timings and outputs (one JSON per run).

Like dbt's ``run_results.json``: written after every run that got as far as knowing its output, successful or not,
atomically, so a cron job or CI never reads half a file. :func:`plot_memory` draws the memory samples against the
worker's thresholds and the budget's prediction.

Light to import: no dask, no matplotlib, no numpy at import time (matplotlib is imported by :func:`plot_memory`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import re
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from rasterflow import compiled
from rasterflow.atomic import write_text_atomic
from rasterflow.units import format_bytes

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.cluster.telemetry import MemorySampler

__all__ = [
    "RunReport",
    "StageTimer",
    "default_report_path",
    "library_versions",
    "thin_samples",
    "memory_plot_data",
    "plot_memory",
    "STATUS_BY_EXIT_CODE",
    "MAX_MEMORY_SAMPLES",
    "DEFAULT_THRESHOLDS",
    "SHOWN_PER_LIST",
    "shortened",
]

STATUS_BY_EXIT_CODE = {0: "ok", 1: "failed", 2: "invalid", 3: "over_budget", 64: "usage", 75: "locked"}
"""``status`` for each process exit code (:class:`rasterflow.errors.ExitCode`)."""

MAX_MEMORY_SAMPLES = 2000
"""Memory samples kept in a report; longer runs are thinned, keeping each window's peak."""

DEFAULT_THRESHOLDS = {"target": 0.6, "spill": 0.7, "pause": 0.8, "terminate": 0.95}

SHOWN_PER_LIST = 5
"""Entries of a long list (outputs of a tiled run, failed reads) a summary shows; the report file has them all."""


def shortened(entries: list[str], what: str, *, shown: int = SHOWN_PER_LIST) -> list[str]:
    """``entries`` as they are when there are at most ``shown + 1`` of them, else the first ``shown`` and one line
    that counts the rest ("... and 995 more outputs (in the run report)")."""
    if len(entries) <= shown + 1:
        return list(entries)
    return [*entries[:shown], f"... and {len(entries) - shown:,} more {what} (in the run report)"]

CLIENT = "client"
"""The ``worker`` value of samples taken in the client process (as in :mod:`rasterflow.cluster`)."""

_DISTRIBUTIONS = {
    "numpy": "numpy",
    "dask": "dask",
    "distributed": "distributed",
    "xarray": "xarray",
    "rasterio": "rasterio",
    "stackstac": "stackstac",
    "pystac_client": "pystac-client",
    "zarr": "zarr",
}


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _gdal_version() -> str | None:
    """GDAL's version without importing rasterio when it is not loaded yet.

    From rasterio if it is already imported; else from the name of the libgdal bundled in the rasterio wheel
    (``rasterio.libs/libgdal-<hash>.so.<abi>.<x.y.z>``); else from an installed ``GDAL`` (osgeo) distribution.
    """
    rasterio = sys.modules.get("rasterio")
    if rasterio is not None and getattr(rasterio, "__gdal_version__", None):
        return str(rasterio.__gdal_version__)
    import importlib.metadata as md
    import importlib.util

    try:
        spec = importlib.util.find_spec("rasterio")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        libs = Path(spec.origin).parent.parent / "rasterio.libs"
        if libs.is_dir():
            for lib in sorted(libs.iterdir()):
                match = re.match(r"libgdal[-.].*\.so\.\d+\.(\d+\.\d+\.\d+)$", lib.name)
                if match:
                    return match.group(1)
    try:
        return md.version("GDAL")
    except md.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str | None]:
    """Versions of the stack, from package metadata (nothing heavy is imported); None when not installed."""
    import importlib.metadata as md

    versions: dict[str, str | None] = {"python": platform.python_version()}
    for key, dist in _DISTRIBUTIONS.items():
        try:
            versions[key] = md.version(dist)
        except md.PackageNotFoundError:
            versions[key] = None
    versions["gdal"] = _gdal_version()
    # where setup.py found no C compiler the kernels run on their NumPy paths: same values, slower (the client's
    # install; workers of an external cluster import their own)
    versions["compiled_kernels"] = "rasterflow._native" if compiled.available() else None
    # local tiled COGs decoded by tifffile + imagecodecs (rasterflow.read.tiles); None: GDAL decodes every read
    from rasterflow.read.tiles import decoder_available

    decoders = ("tifffile", "imagecodecs")
    versions["tile_decoder"] = (" + ".join(f"{name} {md.version(name)}" for name in decoders)
                                if decoder_available() else None)
    order = ["python", "numpy", "dask", "distributed", "xarray", "rasterio", "gdal", "stackstac", "pystac_client", "zarr",
             "compiled_kernels", "tile_decoder"]
    return {key: versions[key] for key in order}


def default_report_path(output_path: str) -> str:
    """``<output>.report.json`` next to the output (a trailing ``/`` of a ``.zarr`` directory is dropped)."""
    return str(output_path).rstrip("/") + ".report.json"


def thin_samples(samples: list[dict[str, Any]], max_points: int = MAX_MEMORY_SAMPLES) -> list[dict[str, Any]]:
    """At most about ``max_points`` samples, keeping every series' shape and peaks.

    Time is cut into equal windows; in each window each series (worker or client) keeps its highest-RSS sample.
    Samples already under the cap are returned unchanged.
    """
    if len(samples) <= max_points or not samples:
        return list(samples)
    series = {s["worker"] for s in samples}
    windows = max(1, max_points // max(1, len(series)))
    t0 = min(s["t"] for s in samples)
    span = max(s["t"] for s in samples) - t0 or 1.0
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for s in samples:
        index = min(windows - 1, int((s["t"] - t0) / span * windows))
        key = (s["worker"], index)
        kept = best.get(key)
        if kept is None or max(s["rss"], s.get("rss_peak", 0)) > max(kept["rss"], kept.get("rss_peak", 0)):
            best[key] = s
    return sorted(best.values(), key=lambda s: (s["t"], s["worker"]))


def _jsonable(value: Any) -> Any:
    """Plain JSON values: tuples -> lists, Paths -> str, NumPy scalars -> Python, NaN/inf -> None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and type(value).__module__ == "numpy":
        return _jsonable(value.item())
    raise TypeError(f"cannot put {type(value).__name__} into a run report: {value!r}")


@dataclass
class RunReport:
    """One run, as written to ``<output>.report.json``."""

    rasterflow_version: str = ""
    spec_path: str = ""
    spec_sha256: str = ""
    started_at: str = ""
    """ISO 8601, UTC."""
    finished_at: str | None = None
    status: str = "failed"
    """``ok`` | ``failed`` | ``invalid`` | ``over_budget`` (from the exit code)."""
    exit_code: int | None = None
    error: str | None = None
    library_versions: dict[str, str | None] = field(default_factory=dict)
    catalog: str | None = None
    item_ids: list[str] = field(default_factory=list)
    grid: dict[str, Any] = field(default_factory=dict)
    """crs, bounds, shape, transform."""
    chunks: dict[str, int] = field(default_factory=dict)
    task_count: int | None = None
    predicted_peak_per_worker: int | None = None
    """The static budget's estimate, bytes."""
    memory_limit: int | None = None
    """Per-worker memory limit, bytes."""
    measured_peak_per_worker: dict[str, int] = field(default_factory=dict)
    """Worker address -> highest RSS seen, bytes."""
    spilled_bytes: int = 0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    """``{"path": ..., "bytes": ...}`` per file or store written."""
    memory_samples: list[dict[str, Any]] = field(default_factory=list)
    """``{"t", "worker", "rss", "managed", "spilled", ...}``; thinned to about :data:`MAX_MEMORY_SAMPLES`."""
    stage_marks: list[list[Any]] = field(default_factory=list)
    """``[t, stage]``: when each stage started, in the samples' clock."""
    cluster: dict[str, Any] = field(default_factory=dict)
    """address, n_workers, threads_per_worker, dashboard_link, is_local."""
    name: str | None = None
    """The spec's ``name`` (plot title); the spec file's stem when unset."""
    memory_thresholds: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))
    """Worker thresholds as fractions of ``memory_limit`` (target, spill, pause, terminate)."""
    client_peak: int | None = None
    """Highest RSS of the client (driver) process, bytes."""
    predicted_client_peak: int | None = None
    """The budget's estimate of the client process (it assembles COG output), bytes."""
    fingerprint: str | None = None
    """The output's identity (spec after variables, item ids and updated times, rasterflow version); ``if_exists:
    skip`` compares it, and a COG is recognised as rasterflow's by being listed here with it."""
    note: str | None = None
    """Something the status alone does not say (a signal that arrived after the output was committed)."""
    reads: dict[str, Any] = field(default_factory=dict)
    """Source reads (issue 9): ``files``, ``failed_count``, ``failed_fraction``, ``failed`` (per href: item_id,
    asset, href, error, status, attempts, windows, retries), ``retried_files``, ``total_retries``, ``retries``
    (href -> retries), the ``policy`` (retry, on_read_error, max_failed_fraction, sign, io) and, where the
    concurrent reader read remote files, ``io``: ``requests``, ``bytes``, ``header_reads``, ``in_flight_peak``,
    ``request_seconds``, ``wait_seconds`` (``first_wait_seconds`` of it at tasks' first windows), ``held_peak``,
    ``tasks``, ``tasks_ahead`` and ``longest_waits`` (the five longest waits for bytes: href, bytes, seconds,
    asked_before, slot_seconds, request_seconds, started_ahead, first_window; see the remote sources how-to)."""
    gdal_options: dict[str, Any] = field(default_factory=dict)
    """GDAL settings of the reads (``reads``: config options rasterflow set) and the S3 variables of the
    environment (``aws_env``; credentials only as ``(set)``)."""

    # ---- building -------------------------------------------------------------------------------------------

    @classmethod
    def start(cls, **fields: Any) -> RunReport:
        """A report for a run starting now: version, start time and library versions filled in."""
        from rasterflow import __version__

        fields.setdefault("rasterflow_version", __version__)
        fields.setdefault("started_at", _now_iso())
        fields.setdefault("library_versions", library_versions())
        return cls(**fields)

    def finish(self, exit_code: int, error: str | None = None) -> RunReport:
        """Record the end: finish time, exit code and the status it means."""
        self.finished_at = _now_iso()
        self.exit_code = int(exit_code)
        self.status = STATUS_BY_EXIT_CODE.get(int(exit_code), "interrupted" if 128 < exit_code < 160 else "failed")
        if error is not None:
            self.error = error
        return self

    def record_memory(self, sampler: MemorySampler, *, max_points: int = MAX_MEMORY_SAMPLES) -> RunReport:
        """Take the measurements of a :class:`rasterflow.cluster.MemorySampler` (peaks from all samples)."""
        self.measured_peak_per_worker = {str(k): int(v) for k, v in sampler.peak_per_worker().items()}
        self.spilled_bytes = int(sampler.spilled_bytes_total())
        self.memory_samples = thin_samples(list(sampler.samples), max_points)
        self.stage_marks = [[float(t), str(name)] for t, name in sampler.marks]
        client_peak = getattr(sampler, "client_peak", None)
        if callable(client_peak):
            self.client_peak = int(client_peak()) or None
        return self

    def record_process_peak(self, peak: int | None) -> RunReport:
        """Fold this process's peak RSS since the sampler stopped (:func:`rasterflow.cluster.process_peak_since_sample`)
        into the client's peak, or into the worker's when the run was one process (its worker is this process)."""
        if not peak:
            return self
        if self.client_peak is not None:
            self.client_peak = max(self.client_peak, int(peak))
        elif "process" in self.measured_peak_per_worker:  # cluster.IN_PROCESS: a one-process run
            self.measured_peak_per_worker["process"] = max(self.measured_peak_per_worker["process"], int(peak))
        return self

    # ---- reading and writing ----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = _jsonable(dataclasses.asdict(self))
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunReport:
        """Read back a report dict; unknown keys (from a newer rasterflow) are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json(cls, text: str) -> RunReport:
        return cls.from_dict(json.loads(text))

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> RunReport:
        return cls.from_json(Path(path).read_text())

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the JSON atomically: serialise first, write a temporary file beside ``path``, then rename.

        The file gets the permissions of the outputs it sits beside (``0o666`` minus the umask) and is synced to the
        disk before the rename (:func:`rasterflow.atomic.write_text_atomic`).
        """
        text = self.to_json()  # fails before anything is touched
        return write_text_atomic(path, text)

    # ---- summary ------------------------------------------------------------------------------------------------

    @property
    def title(self) -> str:
        return self.name or (Path(self.spec_path).stem if self.spec_path else "rasterflow run")

    def wall_seconds(self) -> float | None:
        """Seconds from start to finish, when both are known."""
        try:
            start = datetime.fromisoformat(self.started_at.replace("Z", "+00:00"))
            end = datetime.fromisoformat(str(self.finished_at).replace("Z", "+00:00"))
        except (TypeError, ValueError):
            return None
        return (end - start).total_seconds()

    def summary_lines(self) -> list[str]:
        """A short human summary: status, outputs, time per stage, predicted vs measured peak, spilled bytes."""
        status = f"status: {self.status}"
        if self.exit_code is not None:
            status += f" (exit {self.exit_code})"
        if self.error:
            status += f": {self.error}"
        lines = [status]
        if self.grid:  # planned: the search ran
            lines.append(f"items: {len(self.item_ids):,} used (ids in the report's item_ids)")
        lines.extend(self._read_lines())
        outputs = [f"output: {out.get('path')} ({_size_words(out.get('bytes'))})" for out in self.outputs]
        lines.extend(shortened(outputs, "outputs"))
        if len(outputs) > SHOWN_PER_LIST + 1:
            sizes = [out.get("bytes") for out in self.outputs]
            known = sum(int(size) for size in sizes if size is not None)
            lines.append(f"outputs: {len(outputs):,} in all, {format_bytes(known)}"
                         + (f" ({sum(size is None for size in sizes):,} of unknown size)" if None in sizes else ""))
        if self.stage_seconds:
            total = sum(self.stage_seconds.values())
            parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.stage_seconds.items())
            lines.append(f"time: {parts} (total {total:.1f} s)")
        lines.extend(self._memory_lines())
        if self.measured_peak_per_worker or self.spilled_bytes:
            lines.append(
                f"spilled to disk: {format_bytes(self.spilled_bytes)}"
                + (" (memory pressure: halve the chunks or the threads)" if self.spilled_bytes else "")
            )
        return lines

    def _read_lines(self) -> list[str]:
        """Failed source reads and retries (never a silent success), and what the remote reads cost."""
        reads = self.reads or {}
        lines = []
        failed = reads.get("failed") or []
        if failed:
            policy = (reads.get("policy") or {}).get("on_read_error", "fail")
            treated = " and treated as missing (on_read_error: nodata)" if policy == "nodata" else ""
            lines.append(f"reads: {len(failed)} of {reads.get('files', '?')} source files "
                         f"({float(reads.get('failed_fraction') or 0):.1%}) could not be read{treated}:")
            lines.extend(shortened([f"  {entry.get('error')}" for entry in failed], "failed reads"))
        if reads.get("total_retries"):
            lines.append(f"reads: {reads['total_retries']} retries of {reads.get('retried_files', 0)} files "
                         "after transient failures")
        io = reads.get("io") or {}
        if io.get("requests"):
            line = (f"remote reads: {int(io['requests']):,} requests, {format_bytes(int(io.get('bytes') or 0))}, "
                    f"{int(io.get('in_flight_peak') or 0)} in flight at most per process; the tasks waited "
                    f"{float(io.get('wait_seconds') or 0):.1f} s for bytes")
            longest = (io.get("longest_waits") or [None])[0]
            if longest:
                line += f" (longest {float(longest['seconds']):.2f} s, {longest['href']})"
            if io.get("tasks"):
                line += f"; {int(io.get('tasks_ahead') or 0)} of {int(io['tasks'])} tasks found their reads started"
            lines.append(line)
        return lines

    def _memory_lines(self) -> list[str]:
        predicted, measured, limit = self.predicted_peak_per_worker, self.measured_peak_per_worker, self.memory_limit
        if not measured:
            if predicted:
                return [f"peak per worker: predicted {format_bytes(predicted)}, not measured"]
            return []
        worst_worker, worst = max(measured.items(), key=lambda kv: kv[1])
        # a run in one process samples that process (client, scheduler and tasks) as its one "worker"
        what = "peak of the process (one process: client, scheduler and tasks)" if list(measured) == ["process"] \
            else "peak per worker"
        line = f"{what}: measured {format_bytes(worst)}"
        if predicted:
            line += f", predicted {format_bytes(predicted)} (measured/predicted {worst / predicted:.2f})"
        if limit:
            line += f", limit {format_bytes(limit)} ({worst / limit:.0%})"
        lines = [line]
        if len(measured) > 1:
            lines.append(
                "  per worker: " + ", ".join(f"{_short(w)} {format_bytes(b)}" for w, b in sorted(measured.items()))
            )
        return lines


def _size_words(size: int | None) -> str:
    return format_bytes(size) if size is not None else "size unknown"


def _short(worker: str) -> str:
    """``tcp://127.0.0.1:40575`` -> ``127.0.0.1:40575``."""
    return worker.split("://", 1)[-1]


class StageTimer:
    """Wall time per stage, accumulated into a dict: ``with timer("compute"): ...``.

    ``seconds`` is the dict (e.g. a report's ``stage_seconds``); a stage entered twice accumulates. ``on_start``
    is called with the stage name on entry (e.g. ``MemorySampler.mark``) so stage boundaries appear in the plot.
    """

    def __init__(
        self,
        seconds: dict[str, float] | None = None,
        *,
        on_start: Callable[[str], object] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.seconds = seconds if seconds is not None else {}
        self.on_start = on_start
        self.clock = clock

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.on_start is not None:
            self.on_start(name)
        started = self.clock()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + (self.clock() - started), 6)

    stage = __call__


# ---- plotting -------------------------------------------------------------------------------------------------------


def memory_plot_data(report: RunReport) -> dict[str, Any]:
    """What :func:`plot_memory` draws, as plain lists (bytes and seconds).

    ``series``: worker (and ``client``) -> ``{"t": [...], "rss": [...], "rss_peak": [...]}`` from the report's
    samples in order; ``thresholds``: name -> bytes (memory_limit times each fraction, plus ``limit``);
    ``predicted``: bytes or None; ``marks``: ``[(t, stage), ...]``.
    """
    series: dict[str, dict[str, list[float]]] = {}
    for s in report.memory_samples:
        line = series.setdefault(str(s["worker"]), {"t": [], "rss": [], "rss_peak": []})
        line["t"].append(float(s["t"]))
        line["rss"].append(int(s["rss"]))
        line["rss_peak"].append(int(s.get("rss_peak", s["rss"])))
    thresholds: dict[str, int] = {}
    if report.memory_limit:
        fractions = {**DEFAULT_THRESHOLDS, **(report.memory_thresholds or {})}
        thresholds = {name: int(report.memory_limit * fractions[name]) for name in DEFAULT_THRESHOLDS}
        thresholds["limit"] = int(report.memory_limit)
    return {
        "series": series,
        "thresholds": thresholds,
        "predicted": report.predicted_peak_per_worker,
        "marks": [(float(t), str(name)) for t, name in report.stage_marks],
        "title": report.title,
    }


_THRESHOLD_STYLE = {
    "target": ("tab:olive", ":"),
    "spill": ("tab:orange", ":"),
    "pause": ("tab:red", "--"),
    "terminate": ("darkred", "-"),
    "limit": ("black", "-"),
}


def plot_y_top(data: dict[str, Any]) -> int:
    """The top of the plot's y axis in bytes: 30% above the highest measured or predicted memory, so a 140 MB curve
    under a 10 GB limit is not a flat line at the bottom (thresholds above it are listed, not drawn to scale)."""
    highest = max([v for line in data["series"].values() for v in line["rss_peak"] + line["rss"]]
                  + [data["predicted"] or 0], default=0)
    if not highest:
        return max(data["thresholds"].values(), default=10**9)
    return int(highest * 1.3)


def mark_rows(marks: list[tuple[float, str]], t_min: float, t_max: float, *, char_width: float = 0.0105,
              gap: float = 0.01) -> list[int]:
    """A row per stage label so labels written side by side at the top of the plot do not overlap: each goes in the
    first row whose previous label ends (in axes fraction, ``char_width`` per character) before it starts."""
    span = max(t_max - t_min, 1e-9)
    ends: list[float] = []
    rows = []
    for t, name in marks:
        start = (t - t_min) / span
        for row, end in enumerate(ends):
            if end + gap <= start:
                break
        else:
            row = len(ends)
            ends.append(-1.0)
        ends[row] = start + char_width * (len(name) + 1)
        rows.append(row)
    return rows


def plot_memory(report: RunReport, png_path: str | os.PathLike[str]) -> Path:
    """Save a PNG of RSS over time: one line per worker, the worker thresholds, the predicted peak, stage marks.

    The y axis fits the measured and predicted memory (:func:`plot_y_top`); thresholds above it are named in the
    legend with "(above)". Stage labels are set in rows so that close stages do not overlap (:func:`mark_rows`)."""
    # The Agg canvas on a bare Figure: no pyplot, no global backend switch, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    data = memory_plot_data(report)
    top = plot_y_top(data)
    unit, unit_name = (1e9, "GB") if top >= 2e9 else (1e6, "MB")
    fig = Figure(figsize=(10, 5.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    times = [t for line in data["series"].values() for t in line["t"]] + [t for t, _ in data["marks"]]
    for worker, line in data["series"].items():
        if worker == CLIENT:
            ax.plot(line["t"], [v / unit for v in line["rss"]], color="grey", lw=1, ls="--", label="client (driver)")
            continue
        (drawn,) = ax.plot(line["t"], [v / unit for v in line["rss"]], lw=1.5, label=_short(worker))
        if line["rss_peak"] != line["rss"]:
            ax.fill_between(
                line["t"], [v / unit for v in line["rss"]], [v / unit for v in line["rss_peak"]],
                color=drawn.get_color(), alpha=0.2, lw=0,
            )
    for name, value in data["thresholds"].items():
        color, style = _THRESHOLD_STYLE[name]
        if value > top:  # off the chart: named, not drawn (it would squash the curves to a flat line)
            ax.plot([], [], color=color, ls=style, lw=1, label=f"{name} {format_bytes(value)} (above)")
            continue
        ax.axhline(value / unit, color=color, ls=style, lw=1, label=f"{name} {format_bytes(value)}")
    if data["predicted"]:
        ax.axhline(data["predicted"] / unit, color="tab:blue", ls="-.", lw=1.5,
                   label=f"predicted peak {format_bytes(data['predicted'])}")
    rows = mark_rows(data["marks"], min(times, default=0.0), max(times, default=1.0))
    for (t, name), row in zip(data["marks"], rows):
        ax.axvline(t, color="0.5", lw=0.8)
        ax.annotate(name, xy=(t, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -3 - 11 * row),
                    textcoords="offset points", va="top", ha="left", fontsize=8,
                    bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})
    ax.set_xlabel("seconds since the sampler started")
    ax.set_ylabel(f"process RSS ({unit_name})")
    ax.set_ylim(bottom=0, top=top / unit * (1 + 0.06 * (max(rows, default=-1) + 1)))  # room for the labels' rows
    ax.set_title(f"{data['title']}: worker memory ({report.status})")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    if not data["series"]:
        ax.text(0.5, 0.5, "no memory samples", transform=ax.transAxes, ha="center", va="center", color="0.4")
    path = Path(png_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path

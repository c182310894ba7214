"""The thin orchestrator: spec -> search -> plan -> budget -> cluster -> graph -> writer -> report.

Every step is a function of its own module; this one wires them, times them and keeps the run report honest: a
report is written after every run that got as far as knowing its output, successful or not.

Nothing here prints. :func:`run_command` returns a :class:`RunResult` and tells the caller what happens through
``emit(kind, fields)`` events (warnings, the dashboard link, progress, resumed blocks); the CLI renders them, the
Python API (:mod:`rasterflow.api`) hands them to a callback. Errors of the run are recorded in the result (the CLI
maps them to exit codes, the API raises them).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from rasterflow import budget
from rasterflow.errors import ExitCode, OutputLocationError, RasterflowError, RunFailedError, RunInterrupted
from rasterflow.planning import JobPlan, check_items, local_layout, make_plan
from rasterflow.signals import Interrupts

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.planning import RemoteProbe
    from rasterflow.read.policy import ReadPolicy
    from rasterflow.report import RunReport, StageTimer
    from rasterflow.sizing import WorkerLayout
    from rasterflow.sources import FileHeader
    from rasterflow.spec import LoadedSpec, Spec
    from rasterflow.write.describe import RunDescription
    from rasterflow.write.encoding import Encoding
    from rasterflow.write.result import WriteResult
    from rasterflow.write.targets import Output

__all__ = [
    "search", "resolve_layout", "plan_with_items", "plan_command", "plan_payload", "run_command", "profile_command",
    "demo_command", "fingerprint", "RunResult", "PlanResult", "Emit", "TextSink", "DEFAULT_STATE_DIR",
]

REPO_ROOT = Path(__file__).resolve().parent.parent

DEFAULT_STATE_DIR = ".rasterflow"
"""Where a run keeps what is not beside its output (relative to the working directory, like dbt's ``target/``):
``run_results.json`` and ``reports/`` of runs that do not own their output (refused, up to date, lost the lock)."""

Emit = Callable[[str, dict[str, Any]], None]
"""``emit(kind, fields)``: what the run tells its caller; kinds: start, warning, plan, dashboard, resumed, took_over,
up_to_date, memory_plot, done."""


def _no_emit(kind: str, fields: dict[str, Any]) -> None:
    return None


class TextSink(Protocol):
    """Where block progress lines go: a text stream (``sys.stdout``) or :class:`rasterflow.logs.ProgressEvents`."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...

    def isatty(self) -> bool: ...


@dataclass(frozen=True)
class RunResult:
    """The outcome of one spec's run.

    Attributes
    ----------
    spec_path : str
    name : str
        The spec's ``name``.
    status : str
        ``ok`` | ``up_to_date`` | ``failed`` | ``invalid`` | ``over_budget`` | ``locked`` | ``interrupted``.
    exit_code : int
        What the CLI exits with for this spec (see README, exit codes).
    outputs : tuple of str
        The files or stores written (or found up to date).
    report_path : str or None
        Where the run report was written.
    report : dict or None
        The report's content.
    error : str or None
        The error message, when the run did not succeed.
    exception : BaseException or None
        The error itself (the API raises it).
    seconds : float
        Wall time of the run.
    left : str
        For an interrupted run: what is left and how a rerun continues.
    """

    spec_path: str
    name: str
    status: str
    exit_code: int
    outputs: tuple[str, ...] = ()
    report_path: str | None = None
    report: dict[str, Any] | None = field(default=None, repr=False)
    error: str | None = None
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    seconds: float = 0.0
    left: str = ""

    @property
    def ok(self) -> bool:
        """True for ``ok`` and ``up_to_date``."""
        return self.exit_code == 0

    def to_dict(self) -> dict[str, Any]:
        """A results-file entry (JSON-ready)."""
        return {"spec": self.spec_path, "name": self.name, "status": self.status, "exit_code": self.exit_code,
                "outputs": list(self.outputs), "report": self.report_path, "error": self.error,
                "seconds": round(self.seconds, 3), "left": self.left or None}


ADVICE_TIMEOUT = 3.0
"""Seconds the tile-shape probe of ``plan`` waits for a file's header (advice: no answer means no advice)."""


def plan_with_items(loaded: LoadedSpec, items: list[dict[str, Any]], layout: WorkerLayout) -> JobPlan:
    """The plan for searched items, checked against the spec (asset keys, mask types: exit 2 before any pixel is
    read); also reads file headers (no pixels): the first loaded asset's tile shape, and data type and nodata of
    assets whose items declare none."""
    from rasterflow.budget import pipeline_shape
    from rasterflow.catalog import source_header, undeclared_headers
    from rasterflow.read import header_reader
    from rasterflow.read.policy import policy_from_spec

    spec = loaded.spec
    keys = [spec.source.assets[name] for name in pipeline_shape(spec).assets_loaded]
    # headers are opened as the workers will open the files: signed, the run's GDAL options and retries
    hrefs = [str(((item.get("assets") or {}).get(key) or {}).get("href") or "") for item in items for key in keys]
    policy = policy_from_spec(spec.source, [h for h in hrefs if h])
    read_header = header_reader(policy) if items else None
    headers = undeclared_headers(items, keys, read_header) if items else {}
    plan = make_plan(spec, items=items, layout=layout, headers=headers)
    check_items(loaded, plan)
    header = None
    probed = None
    if keys and items:
        # the tile shape is only advice: one try, a short timeout (a server that never answers held plan for
        # 488 s with the run's retries; tests/test_plan_scale.py)
        from dataclasses import replace

        quick = replace(policy, retry=replace(policy.retry, attempts=1, timeout=min(policy.retry.timeout,
                                                                                     ADVICE_TIMEOUT)))
        remote = remote_probe(items[0], keys[0], quick, spec.source.io.reader)
        if remote is not None:
            header, probed = remote
        else:
            advice = header_reader(quick)
            header = headers[keys[0]] if keys[0] in headers else source_header(items[:1], keys[0], advice)
    if header is not None and (header.tile_shape is not None or header.compression is not None):
        plan = make_plan(spec, items=items, layout=layout, source_tile=header.tile_shape, headers=headers,
                         source_codec=header.compression, remote=probed)
    return _located(loaded, plan)


def _located(loaded: LoadedSpec, plan: JobPlan) -> JobPlan:
    """The plan with the paths the spec gives relative to its own folder made absolute (the catalog, for the
    output's STAC links): after this, nothing needs the loaded spec."""
    from dataclasses import replace

    return replace(plan, output=replace(plan.output, catalog=loaded.resolve(plan.output.catalog)))


def remote_probe(item: dict[str, Any], key: str, policy: ReadPolicy,
                 reader: str) -> tuple[FileHeader, RemoteProbe] | None:
    """For a remote first file the concurrent reader reads (http(s), s3): its header through that reader, timed
    -> ``(FileHeader, RemoteProbe)``; None when the file is local, left to GDAL or did not answer (then GDAL's
    header read gives the advice, and nothing is said of the network)."""
    from rasterflow.planning import RemoteProbe
    from rasterflow.sources import AssetRead, FileHeader

    href = str(((item.get("assets") or {}).get(key) or {}).get("href") or "")
    from rasterflow.read.fetch import supported

    if reader == "gdal" or not supported(href):
        return None
    from rasterflow.read.prefetch import probe

    read = AssetRead(item_id=str(item.get("id")), name=key, key=key, href=href, data_type=None, nodata=None,
                     scale=1.0, offset=0.0, crs=None, transform=None, shape=None, band_count=None, footprint=None,
                     direct=False)
    parsed, seconds = probe(read, policy)
    if parsed is None or parsed.facts is None:
        return None
    facts = parsed.facts
    header = FileHeader(href=href, data_type=facts.dtype, nodata=facts.nodata, band_count=facts.count,
                        tile_shape=facts.tile_shape, compression=facts.codec)
    return header, RemoteProbe(round_trip=seconds, bytes_per_pixel=facts.compressed_bytes_per_pixel,
                               decodable=parsed.index is not None)


def search(loaded: LoadedSpec, now: dt.datetime | None = None) -> list[dict[str, Any]]:
    """Search the spec's catalog (metadata only); a relative window ends at ``now`` (default: the current time)."""
    from rasterflow.catalog import StacQuery, resolve_datetime, search_items

    stac = loaded.spec.source.stac
    bbox = None
    if stac.bbox is not None:  # four numbers (the spec's validation)
        west, south, east, north = stac.bbox
        bbox = (west, south, east, north)
    query = StacQuery(
        catalog=loaded.resolve(stac.catalog),
        collections=tuple(stac.collections),
        bbox=bbox,
        intersects=stac.intersects if isinstance(stac.intersects, dict) else None,
        datetime=resolve_datetime(stac.datetime, now) if now is not None else stac.datetime,
        query=stac.query,
        filter=stac.filter,
        max_items=stac.max_items,
    )
    from rasterflow import retry  # source.retry covers the STAC API requests too
    from rasterflow.errors import CatalogError, NoItemsFoundError

    try:
        with retry.using(retry.RetryPolicy.from_spec(loaded.spec.source.retry)):
            return search_items(query)
    except CatalogError as err:  # the spec's file:line: which key to change
        if isinstance(err, NoItemsFoundError):
            field = getattr(err, "field", "")
            where, key = ((loaded.where("source", "stac", "bbox"), "source.stac.bbox") if field == "bbox"
                          else (loaded.where("source", "stac"), "source.stac"))
        else:
            where, key = loaded.where("source", "stac", "catalog"), "source.stac.catalog"
        hint = ("; a relative path is relative to the spec file's folder" if "not found" in str(err)
                and "://" not in str(loaded.spec.source.stac.catalog) else "")
        located = type(err)(f"{where}: {key}: {err}{hint}")
        located.__dict__.update(err.__dict__)
        raise located from err.__cause__


def resolve_layout(spec: Spec) -> WorkerLayout:
    """The workers the job will run on: the real ones of a scheduler address, or the local sizing (worker
    processes or one process: ``cluster.processes``)."""
    from rasterflow.cluster import ClusterSettings, local_run_layout, remote_layout, resolve_address

    settings = ClusterSettings.from_spec(spec.cluster)
    address = resolve_address(settings)
    if address:
        return remote_layout(address)
    return local_run_layout(settings)


def long_for_one_process(plan: JobPlan) -> bool:
    """Whether ``processes: auto`` runs the job in worker processes for its length: ``plan`` estimates at least
    :data:`~rasterflow.cluster.ONE_PROCESS_MAX_SECONDS` of compute (start-up not counted)."""
    from rasterflow.cluster import ONE_PROCESS_MAX_SECONDS
    from rasterflow.planning import STARTUP_SECONDS

    return plan.cost is not None and plan.cost.wall_seconds - STARTUP_SECONDS >= ONE_PROCESS_MAX_SECONDS


def _processes_if_refused(loaded: LoadedSpec, items: list[dict[str, Any]], layout: WorkerLayout,
                          plan: JobPlan) -> tuple[WorkerLayout, JobPlan]:
    """``cluster.processes: auto`` planned one process: plan worker processes when the budget refused it, or when
    the job is long (:data:`~rasterflow.cluster.ONE_PROCESS_MAX_SECONDS` of estimated compute) and fits them."""
    from rasterflow.cluster import ClusterSettings, process_fallback

    fallback = process_fallback(ClusterSettings.from_spec(loaded.spec.cluster), layout)
    if fallback is None:
        return layout, plan
    if not plan.report.ok:
        return fallback, plan_with_items(loaded, items, fallback)
    if long_for_one_process(plan):
        processes = plan_with_items(loaded, items, fallback)
        if processes.report.ok:
            return fallback, processes
    return layout, plan


def fingerprint(loaded: LoadedSpec, plan: JobPlan, period_items: Sequence[dict[str, Any]] | None = None) -> str:
    """Identity of a job's output: same spec (after variables), same items with the same ``updated`` times, same
    grid and chunks, same rasterflow version -> same output. Used to resume, and by ``if_exists: skip``; with
    ``items`` (those of one period), the identity of that period's files (``if_exists: update``)."""
    from rasterflow import __version__

    digest = hashlib.sha256()
    digest.update(loaded.sha256.encode())
    items = [[item.get("id"), (item.get("properties") or {}).get("updated")]
             for item in (plan.items if period_items is None else period_items)]
    digest.update(json.dumps(items, default=str).encode())
    # a period's files do not depend on how many items other periods have (the whole time axis' chunk length)
    chunks = plan.chunks if period_items is None else {k: v for k, v in plan.chunks.items() if k != "time"}
    digest.update(json.dumps([plan.grid.bounds, plan.grid.shape, chunks]).encode())
    digest.update(__version__.encode())
    return digest.hexdigest()[:32]


@dataclass(frozen=True)
class PlanResult:
    """What ``rasterflow plan`` shows: the resolved plan and its JSON form; ``exit_code`` 3 when the budget refuses."""

    loaded: LoadedSpec
    plan: JobPlan
    payload: dict[str, Any]
    exit_code: int


def plan_command(loaded: LoadedSpec, *, now: dt.datetime | None = None) -> PlanResult:
    """``rasterflow plan``: search, resolve, estimate (nothing printed; the CLI renders the result)."""
    items = search(loaded, now)
    layout = resolve_layout(loaded.spec)
    plan = plan_with_items(loaded, items, layout)
    layout, plan = _processes_if_refused(loaded, items, layout, plan)
    code = ExitCode.OK if plan.report.ok else ExitCode.OVER_BUDGET
    return PlanResult(loaded=loaded, plan=plan, payload=plan_payload(loaded, plan), exit_code=int(code))


def plan_payload(loaded: LoadedSpec, plan: JobPlan) -> dict[str, Any]:
    """The plan as plain JSON values (``plan --json``)."""
    layout = plan.layout
    return {
        "spec": str(loaded.path),
        "name": plan.name,
        "items": len(plan.items),
        "item_ids": [item["id"] for item in plan.items],
        "grid": {"crs": plan.grid.crs, "bounds": list(plan.grid.bounds), "shape": list(plan.grid.shape),
                 "transform": list(plan.grid.transform)},
        "layout": {"n_workers": layout.n_workers, "threads_per_worker": layout.threads_per_worker,
                   "memory_limit": layout.memory_limit, "source": layout.source},
        "assets": assets_applied(plan),
        "budget": plan.report.to_dict(),
        # what the tasks hold and read (the chunk index; the items' declared grids): no file was opened for these
        "items_per_task": plan.report.inputs.items_per_task,
        "cost": None if plan.cost is None else dataclasses.asdict(plan.cost),
        # per statistic of the reduction, its terms in the budget's reduce stage (rasterflow.statcost)
        "statistics": None if plan.statistics_cost is None else plan.statistics_cost.to_dict(),
    }


def assets_applied(plan: JobPlan) -> dict[str, dict[str, Any]]:
    """Per loaded asset: its key, the dtype it loads in and what metadata was applied (for how many items)."""
    if plan.sources is None:
        return {}
    return {a.name: {"key": a.key, "load_dtype": a.load_dtype, "applied": list(a.applied)} for a in plan.sources.assets}


def run_command(loaded: LoadedSpec, *, report_path: Path | None = None, plot: bool = False, overwrite: bool = False,
                emit: Emit | None = None, progress_stream: TextSink | None = None, interrupts: Interrupts | None = None,
                state_dir: str | os.PathLike[str] = DEFAULT_STATE_DIR, now: dt.datetime | None = None,
                dry_run: bool = False) -> RunResult:
    """``rasterflow run`` for one loaded spec; never prints, never raises for the run's own errors.

    Order matters for safety: the output's lock is taken before anything is deleted or written; the output policy
    (``if_exists``) is decided with the items known (the fingerprint), before the cluster starts. The report goes
    beside the output only when this run owns it (see :func:`rasterflow.outputs.report_may_replace`), else into
    ``<state_dir>/reports/``.

    Parameters
    ----------
    overwrite : bool
        ``--overwrite``: act as ``if_exists: overwrite`` whatever the spec says.
    emit : callable, optional
        ``emit(kind, fields)`` for what happens (see :data:`Emit`).
    progress_stream : text stream, optional
        Where block progress lines go (None: no progress display).
    interrupts : Interrupts, optional
        The signal state (the CLI installs its handlers); lets the run defer signals while committing.
    now : datetime, optional
        The time a relative window ends at (default: now), fixed once so the search and dated paths agree.
    dry_run : bool
        Search and plan, decide run / skip / refuse, and stop before the lock's owner would write anything.
    """
    from rasterflow import write
    from rasterflow.lock import OutputLock
    from rasterflow.outputs import decide, leftover_temp_files, render_output_path, window_of
    from rasterflow.report import RunReport, StageTimer, default_report_path

    emit = emit or _no_emit
    interrupts = interrupts or Interrupts()
    started = time.monotonic()
    spec = loaded.spec
    fmt = spec.output.resolved_format
    policy = "overwrite" if overwrite else spec.output.policy
    now = now or dt.datetime.now(dt.timezone.utc)
    report = RunReport.start(spec_path=str(loaded.path), spec_sha256=loaded.sha256, catalog=spec.source.stac.catalog,
                             name=spec.name, memory_thresholds=spec.cluster.memory.model_dump())
    code: int = int(ExitCode.RUN_FAILED)
    status: str | None = None
    error: BaseException | None = None
    output_path = ""
    lock: OutputLock | None = None
    lost_lock = committed = False
    result = None
    counts = [0, 0]  # blocks done, total: what an interrupted run leaves
    output: Output | None = None  # Zarr, COG or tiles
    job_id = ""
    left = ""
    own_report: Path | None = Path(report_path) if report_path else None
    expected: list[str] = []
    writing = False  # the writer started: from then on the output's folder holds this run's traces (worker log)
    try:
        start, end = window_of(spec.source.stac.datetime, now)
        output_path = _output_path(loaded, render_output_path(spec.output.path, start, end,
                                                              where=loaded.where("output", "path")))
        # beside a local output; a remote output's report stays on this machine (<state_dir>/reports/): pathlib
        # would turn "s3://b/x" into a local "s3:/b/x" directory
        own_report = own_report or (None if write.common.is_remote(output_path)
                                    else Path(default_report_path(output_path)))
        emit("start", {"spec": str(loaded.path), "name": spec.name, "output": output_path, "policy": policy})
        if not dry_run:
            lock = OutputLock(output_path, spec=str(loaded.path))
            try:
                lock.acquire()
            except OutputLocationError as err:
                raise OutputLocationError(f"{loaded.where('output', 'path')}: output.path: {err}") from None
            except RasterflowError:
                lost_lock = True
                raise
            if lock.took_over:
                emit("took_over", {"holder": lock.took_over, "lock": str(lock.path)})
        if policy == "error":
            # Refuse before any work: never replace an existing result unless asked.
            write.check_output_target(output_path, fmt, overwrite=False, fingerprint=None)
        with timer_for(report)("search"):
            items = search(loaded, now)
            layout = resolve_layout(spec)
        report.item_ids = [item["id"] for item in items]
        with timer_for(report)("plan"):
            plan = plan_with_items(loaded, items, layout)
            layout, plan = _processes_if_refused(loaded, items, layout, plan)
        _record_plan(report, plan)
        for warning in plan.report.warnings:
            emit("warning", {"message": str(warning)})
        emit("plan", {"items": len(items), "tasks": plan.report.task_count,
                      "predicted_peak_per_worker": plan.report.peak_per_worker})
        budget.enforce(plan.report, where=loaded.where("chunks"))
        job_id = fingerprint(loaded, plan)
        report_fingerprint(report, job_id)
        # Now that the items are known, so are all the files the output makes (COGs: one per period / quantile;
        # output.tiling: every tile's files, ours and finished by their markers).
        from rasterflow.write.targets import CogOutput, output_for

        output = output_for(plan, output_path)
        expected = output.files()
        existing = output.inspect(_input_hrefs(items))
        action = decide(policy, existing, job_id, output_path)
        if action == "up_to_date":
            status, code = "up_to_date", int(ExitCode.OK)
            report.outputs = [{"path": p, "bytes": write.path_size(p)} for p in expected]
            emit("up_to_date", {"outputs": list(expected), "fingerprint": job_id})
        elif dry_run:
            status, code = "would_run", int(ExitCode.OK)
            report.outputs = [{"path": p, "bytes": None} for p in expected]
        else:
            files = (_file_fingerprints(loaded, plan, output_path)
                     if isinstance(output, CogOutput) and plan.period_labels else {})
            kept: list[dict[str, Any]] = []
            run_plan = plan
            if policy == "update" and not existing.empty and existing.ours and files:
                run_plan, kept = _update_plan(loaded, plan, output_path, files, layout)
                emit("update", {"kept": [k["path"] for k in kept],
                                "recomputed": sorted(set(files) - {k["path"] for k in kept})})
            writing = True
            for leftover in leftover_temp_files(expected):
                write.common.remove(leftover)  # a killed run's hidden temp file; we hold the lock, so nobody owns it
            if run_plan is not plan:
                output = output_for(run_plan, output_path)
            result = _execute(run_plan, output, job_id, report, StageTimer(report.stage_seconds),
                              # replace only what was ours when decided; whatever appears meanwhile stays
                              replace=policy != "error" and not existing.empty, emit=emit,
                              progress_stream=progress_stream,
                              interrupts=interrupts, counts=counts, log_path=_worker_log_path(own_report),
                              # a tile done by this job is kept, unless asked to redo a complete output
                              redo_all=policy == "overwrite" and existing.complete)
            committed = True
            interrupts.defer()  # the output is in place: nothing may turn this into a failure now
            report.outputs = kept + [{"path": p, "bytes": write.path_size(p), **files.get(p, {})}
                                     for p in result.paths]
            code = int(ExitCode.OK)
    except KeyboardInterrupt as err:  # RunInterrupted (our handlers) or Python's own SIGINT
        interrupts.defer()
        interrupts.note(err)
        signum = interrupts.received or 2
        error = err if isinstance(err, RunInterrupted) else RunInterrupted(signum)
        code, status = 128 + signum, "interrupted"
        if output is not None:
            left = output.what_is_left(job_id, counts)
        else:
            left = "no block was finished; rerunning the same command starts it again"
        report.error = f"interrupted by {error.signal_name}" + (f"; {left}" if left else "")
    except RasterflowError as err:
        error, code = err, int(err.exit_code)
        report.error = str(err)
    except Exception as err:
        error = RunFailedError(f"run failed: {type(err).__name__}: {err}")
        error.__cause__ = err
        report.error = f"{type(err).__name__}: {err}"
    finally:
        interrupts.defer()  # writing the report and releasing the lock must not be cut short
        report.finish(code)
        if status is not None:
            report.status = status
        if committed and interrupts.received:
            report.note = (f"{_signal_name(interrupts.received)} arrived after the output was committed; "
                           f"the run finished normally")
        # a run that stopped before writing (failed, refused or interrupted before its writer started) leaves nothing
        # beside an output that does not exist: its report goes to <state_dir>/reports/ and its lock file (and the
        # folders made for it) go
        nothing_there = (not writing and not committed and not dry_run and bool(output_path)
                         and not write.common.is_remote(output_path) and not _output_exists(output_path, fmt,
                                                                                               expected))
        report_file = _report_destination(own_report, state_dir, spec.name, committed=committed,
                                          lost_lock=lost_lock or nothing_there, status=report.status,
                                          explicit=report_path is not None)
        written_report: str | None = None
        if not dry_run:  # a dry run writes nothing
            for attempt, destination in enumerate(_report_fallbacks(report_file, state_dir, spec.name,
                                                                    report.status)):
                try:
                    report.write(destination)
                    written_report = str(destination)
                    break
                except OSError as err:
                    emit("warning", {"message": f"could not write the run report {destination}: "
                                                f"{err.strerror or err}" + ("" if attempt else
                                                                            "; writing it elsewhere")})
        if written_report and committed and output_path and write.common.is_remote(output_path):
            # beside the object too: it is how a later run recognises this output as its own (if_exists)
            try:
                write.common.upload_verified(written_report, default_report_path(output_path), replace=True)
            except Exception as err:  # the output is complete; only a later overwrite/skip would not know it
                emit("warning", {"message": f"could not upload the run report beside {output_path}: {err}; a "
                                            "later run with if_exists skip/overwrite will refuse this output"})
        if plot and report.memory_samples and output_path:  # drawn last, so a failed run's plot says so too
            from rasterflow.report import plot_memory

            try:
                png = plot_memory(report, Path(str(output_path).rstrip("/") + ".memory.png")
                                  if not write.common.is_remote(output_path) else report_file.with_suffix(".png"))
                emit("memory_plot", {"path": str(png)})
            except Exception as err:  # a plot must not fail the run
                emit("warning", {"message": f"could not draw the memory plot: {type(err).__name__}: {err}"})
        if lock is not None:
            lock.release(remove=nothing_there)
        _drop_if_empty(_worker_log_path(own_report))
    outcome = RunResult(
        spec_path=str(loaded.path), name=spec.name, status=report.status, exit_code=int(code),
        outputs=tuple(o["path"] for o in report.outputs), report_path=written_report, report=report.to_dict(),
        error=report.error if code != 0 else None, exception=error, seconds=time.monotonic() - started, left=left,
    )
    emit("done", {"result": outcome, "summary": report.summary_lines() if code == 0 else []})
    return outcome


def _output_path(loaded: LoadedSpec, path: str) -> str:
    """The absolute output path, *without* following symlinks (a symlinked output must be seen as one, and
    refused, not silently replaced by its target)."""
    if "://" in path or os.path.isabs(path):
        return path
    return os.path.abspath(os.path.join(loaded.base_dir, path))


def _items_by_period(plan: JobPlan) -> dict[str, list[dict[str, Any]]]:
    """The items of each output period, exactly as the plan groups them (passes included)."""
    program = plan.program
    if program is None or not plan.period_labels:
        return {}
    per_time = program.steps or tuple((index,) for index in range(len(plan.items)))
    return {str(label): [plan.items[i] for t in group for i in per_time[t]]
            for label, group in zip(plan.period_labels, program.groups)}


def _file_fingerprints(loaded: LoadedSpec, plan: JobPlan, output_path: str) -> dict[str, dict[str, str]]:
    """Per COG file of a per-period output: its period and that period's fingerprint (recorded in the report)."""
    from rasterflow.write.common import cog_entries

    by_period = _items_by_period(plan)
    out: dict[str, dict[str, str]] = {}
    for _positions, labels, path in cog_entries(output_path, _leading_coords(plan)):
        period = str(labels.get("period"))
        if period in by_period:
            out[path] = {"period": period, "fingerprint": fingerprint(loaded, plan, by_period[period])}
    return out


def _update_plan(loaded: LoadedSpec, plan: JobPlan, output_path: str, files: dict[str, dict[str, str]],
                 layout: WorkerLayout) -> tuple[JobPlan, list[dict[str, Any]]]:
    """``if_exists: update``: the plan of the periods whose files are missing or stale, and the report entries of
    the files kept. Falls back to the whole plan when the existing report does not say enough."""
    from rasterflow.outputs import _report_of
    from rasterflow.write.common import exists, path_size

    listed = {str(o.get("path")): o for o in _report_of(output_path).get("outputs", []) if isinstance(o, dict)}
    kept, stale = [], set()
    for path, info in files.items():
        old = listed.get(path)
        if (old and old.get("fingerprint") == info["fingerprint"] and exists(path)
                and (old.get("bytes") is None or path_size(path) == old.get("bytes"))):
            kept.append(dict(old))
        else:
            stale.add(info["period"])
    if not kept or not stale:  # nothing to keep (or, with the whole fingerprint changed, nothing known stale)
        return plan, []
    by_period = _items_by_period(plan)
    subset_ids = {id(item) for period in stale for item in by_period[period]}
    subset = [item for item in plan.items if id(item) in subset_ids]
    partial = plan_with_items(loaded, subset, layout)
    if partial.program is None:
        return plan, []
    # every period of the window is in a plan; the partial one writes only the stale periods (the others' files
    # are kept as they are)
    keep = [k for k, label in enumerate(partial.period_labels) if label in stale]
    if {partial.period_labels[k] for k in keep} != stale:  # the subset must make exactly those periods, or do all
        return plan, []
    from dataclasses import replace

    program = replace(partial.program, groups=tuple(partial.program.groups[k] for k in keep))
    partial = replace(partial, program=program, period_labels=tuple(partial.period_labels[k] for k in keep),
                      period_bounds=tuple(partial.period_bounds[k] for k in keep))
    return partial, kept


def timer_for(report: RunReport) -> StageTimer:
    """A stage timer that adds into ``report.stage_seconds``."""
    from rasterflow.report import StageTimer

    return StageTimer(report.stage_seconds)


def report_fingerprint(report: RunReport, job_id: str) -> None:
    """Record the output's fingerprint in the report (the COG's proof of origin; Zarr also keeps it in its attrs)."""
    report.fingerprint = job_id


def _input_hrefs(items: list[dict[str, Any]]) -> list[str]:
    return [str(a.get("href")) for item in items for a in (item.get("assets") or {}).values()
            if isinstance(a, dict) and a.get("href")]


def _signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _worker_log_path(report_file: Path | None) -> str | None:
    if report_file is None:
        return None
    name = report_file.name
    stem = name[: -len(".report.json")] if name.endswith(".report.json") else report_file.stem
    return str(report_file.with_name(stem + ".workers.log"))


def _drop_if_empty(path: str | None) -> None:
    """Remove the worker log when the workers said nothing (the usual case)."""
    try:
        if path and os.path.getsize(path) == 0:
            os.remove(path)
    except OSError:
        pass


def _output_exists(output_path: str, fmt: str, expected: list[str]) -> bool:
    """Whether anything of the output is there: the output, one of its files, or a Zarr run's kept blocks."""
    from rasterflow.write.common import exists, zarr_staging_path

    paths = [output_path, *expected] + ([zarr_staging_path(output_path)] if fmt == "zarr" else [])
    try:
        return any(exists(p) for p in paths)
    except Exception:  # cannot tell: keep the files as they are
        return True


def _report_fallbacks(first: Path, state_dir: str | os.PathLike[str], name: str, status: str) -> list[Path]:
    """Where the report goes: ``first``, else (an unwritable output folder) ``<state_dir>/reports/``."""
    fallback = _state_report_path(state_dir, name, status)
    return [first] if Path(first).parent == fallback.parent else [first, fallback]


def _state_report_path(state_dir: str | os.PathLike[str], name: str, status: str) -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(state_dir) / "reports" / f"{name}-{stamp}-{os.getpid()}-{status}.report.json"


def _report_destination(own: Path | None, state_dir: str | os.PathLike[str], name: str, *, committed: bool,
                        lost_lock: bool, status: str, explicit: bool) -> Path:
    """Beside the output when this run owns it (or ``--report`` was given), else ``<state_dir>/reports/``."""
    from rasterflow.outputs import report_may_replace

    if own is not None and (explicit or committed or (
            not lost_lock and status not in ("up_to_date", "would_run")
            and report_may_replace(str(own), committed=committed))):
        return own
    return _state_report_path(state_dir, name, status)


def _leading_coords(plan: JobPlan) -> dict[str, list[str] | list[float]]:
    """The output's leading dimensions (period, quantile) as the writers will name them (one rule: the STAC
    writer's)."""
    from rasterflow.write.stac import leading_coords

    return leading_coords(plan)


def _record_plan(report: RunReport, plan: JobPlan) -> None:
    report.grid = {"crs": plan.grid.crs, "bounds": list(plan.grid.bounds), "shape": list(plan.grid.shape),
                   "transform": list(plan.grid.transform)}
    report.chunks = dict(plan.chunks)
    report.task_count = plan.report.task_count
    report.predicted_peak_per_worker = plan.report.peak_per_worker
    report.predicted_client_peak = plan.report.client_peak
    report.memory_limit = plan.layout.memory_limit


def _execute(plan: JobPlan, output: Output, job_id: str, report: RunReport, timer: StageTimer, *, replace: bool,
             emit: Emit, progress_stream: TextSink | None, interrupts: Interrupts, counts: list[int],
             log_path: str | None, redo_all: bool = False) -> WriteResult:
    """The run's phases once decided: cluster, reads watched, the lazy result written by its output, then STAC."""
    from rasterflow import graph
    from rasterflow.cluster import ClusterSettings, CountingProgress, MemorySampler, open_cluster
    from rasterflow.logs import worker_log_env
    from rasterflow.report import library_versions
    from rasterflow.signals import start_resource_tracker_deaf_to_hangups
    from rasterflow.write.targets import WriteContext

    def on_progress(done: int, total: int) -> None:
        interrupts.check()  # a signal whose exception Python swallowed (it landed in a __del__) still stops the run
        counts[:] = [done, total]
        progress.update(done, total)
        reads.check(done, total)  # source.on_read_error: nodata over its quota stops the run before the commit
        if total and done >= total:
            interrupts.defer()  # every block is computed: the writer now commits; a signal waits for it

    if plan.read_policy is None:
        raise ValueError("a run needs a plan made with the searched items")
    if plan.layout.processes:  # one process (cluster.processes) spawns no worker: no tracker to start either
        start_resource_tracker_deaf_to_hangups()
    description, encoding, options = output_options(plan, output.path)
    context = WriteContext(description, encoding, options, library_versions())
    with ExitStack() as stack:
        with timer("cluster start"), worker_log_env(log_path):
            handle = stack.enter_context(open_cluster(ClusterSettings.from_spec(plan.cluster, plan.gdal_cachemax),
                                                      plan.layout))
        report.cluster = {**handle.as_dict(), "gdal_cachemax": plan.gdal_cachemax}  # each worker's GDAL cache
        if log_path:
            report.cluster["worker_log"] = log_path
        if handle.dashboard_link:
            emit("dashboard", {"link": handle.dashboard_link})
        sampler = MemorySampler(handle.client)
        stack.callback(report.record_memory, sampler)  # kept when the run fails or is interrupted (issue 10)
        from rasterflow.read.policy import job_hrefs, read_monitor  # issue 9: retries, failures

        reads = stack.enter_context(read_monitor(handle.client, plan.read_policy, job_hrefs(plan), report))
        with sampler:
            timer.on_start = sampler.mark
            with timer("graph"):
                dataset = graph.build_dataset(plan)
            progress = CountingProgress(label="blocks", done_word="written", stream=progress_stream or _NullStream(),
                                        interactive=None if progress_stream is not None else False)
            with timer("compute+write"), progress:
                result = output.write(dataset, context, job_id=job_id, replace=replace, redo_all=redo_all,
                                      client=handle.client, progress=on_progress)
            timer.on_start = None
    with timer("stac"):  # issue 12: after the data, so an item's presence means the output is complete
        result = output.write_stac(result, context)
    from rasterflow.cluster import process_peak_since_sample

    # the STAC stage ran after the sampler stopped (it reads a COG back for its statistics): its peak still counts
    report.record_process_peak(process_peak_since_sample(reset=False))
    if result.blocks_skipped:
        emit("resumed", {"skipped": result.blocks_skipped, "written": result.blocks_written})
    return result


def output_options(plan: JobPlan, output_path: str) -> tuple[RunDescription, Encoding, dict[str, Any]]:
    """Issue 12: the run's description, the resolved encoding and the writer options of the plan's output."""
    from rasterflow.spec.timeparse import parse_datetime_window
    from rasterflow.write.common import Encoding
    from rasterflow.write.stac import cog_file_metadata, describe_run

    out = plan.output
    description = describe_run(plan, window=parse_datetime_window(out.datetime).resolve(), period=out.period,
                               mask=out.mask)
    enc = out.encoding
    encoding = Encoding(dtype=enc.dtype, scale=enc.scale, offset=enc.offset,
                        nodata=enc.nodata).resolved(plan.program.dtype if plan.program else "float32")
    options: dict[str, Any] = {"encoding": encoding, "metadata": description.attrs()}
    if out.format == "zarr":
        options["zarr_format"] = out.zarr_format
        if out.zarr_shards is not None:
            options["shards"] = out.zarr_shards
    else:
        options.update(blocksize=out.cog_blocksize, resampling=out.cog_overview_resampling,
                       predictor=out.cog_predictor,
                       file_metadata=cog_file_metadata(description, output_path, plan))
    return description, encoding, options


class _NullStream:
    """A text stream that drops what is written (no progress display)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return False


def profile_command(loaded: LoadedSpec, *, flamegraph: str | None = None, use_memray: bool = True,
                    emit: Emit | None = None) -> list[str]:
    """``rasterflow profile``: one representative task in this process, measured vs the model's prediction; returns
    the lines to show."""
    from rasterflow.profile import profile_one_task

    emit = emit or _no_emit
    plan = plan_with_items(loaded, search(loaded), local_layout(loaded.spec))
    if not plan.report.ok:
        emit("warning", {"message": "the budget check refuses this spec; profiling one task anyway"})
    result = profile_one_task(plan, use_memray=use_memray, flamegraph=flamegraph)
    return list(result.lines())


def demo_command(*, spec_path: Path | None = None, data_dir: Path | None = None, emit: Emit | None = None,
                 out_dir: Path | None = None, **run_options: Any) -> RunResult:
    """Generate the sample scenes where the demo spec expects them (if missing), then run it (``run_options`` go to
    :func:`run_command`). Without ``spec_path`` the spec bundled in the package is copied into ``out_dir``
    (default ``./rasterflow-demo``) and everything is written there."""
    from rasterflow.sample import DEMO_FOLDER, generate_sample, write_demo_spec
    from rasterflow.spec import load_spec

    spec_path = Path(spec_path) if spec_path else write_demo_spec(Path(out_dir) if out_dir else Path(DEMO_FOLDER))
    if not spec_path.exists():
        raise RunFailedError(f"the demo spec {spec_path} is missing; pass an existing file to --spec")
    loaded = load_spec(spec_path)
    catalog = Path(loaded.resolve(loaded.spec.source.stac.catalog))
    target = Path(data_dir) if data_dir else catalog.parent
    started = time.perf_counter()
    sample = generate_sample(target)
    emit = emit or _no_emit
    emit("sample", {"directory": str(sample.directory), "dates": len(sample.item_ids),
                    "seconds": time.perf_counter() - started})
    result = run_command(loaded, emit=emit, **run_options)
    if result.exit_code == ExitCode.OK:
        from rasterflow.write.stac import stac_paths

        output = loaded.resolve(loaded.spec.output.path)
        emit("demo_result", {"output": output, "format": loaded.spec.output.resolved_format,
                             "folder": str(Path(spec_path).resolve().parent), "band": next(iter(loaded.spec.bands)),
                             "stac_items": stac_paths(output)[1]})
    return result


"""Running a job: lock, search, plan, decide, compute and write, with a run report in every outcome; the demo."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rasterflow import budget
from rasterflow.commands.planjob import processes_if_refused, fingerprint, plan_with_items, resolve_layout, search
from rasterflow.commands.results import DEFAULT_STATE_DIR, Emit, RunResult, TextSink, no_emit, NullStream
from rasterflow.commands.runfiles import (
    drop_if_empty,
    output_exists,
    record_plan,
    report_destination,
    report_fallbacks,
    worker_log_path,
    report_fingerprint,
    timer_for,
)
from rasterflow.commands.update import file_fingerprints, update_plan
from rasterflow.errors import ExitCode, OutputLocationError, RasterflowError, RunFailedError, RunInterrupted
from rasterflow.planning import JobPlan
from rasterflow.signals import Interrupts

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.report import RunReport, StageTimer
    from rasterflow.spec import LoadedSpec
    from rasterflow.write.describe import RunDescription
    from rasterflow.write.encoding import Encoding
    from rasterflow.write.result import WriteResult
    from rasterflow.write.targets import Output


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

    emit = emit or no_emit
    interrupts = interrupts or Interrupts()
    started = time.monotonic()
    # the spec is read here, before planning (the lock and the report start before the search); after
    # make_plan everything comes from the plan
    spec = loaded.spec
    name = spec.name
    fmt = spec.output.resolved_format
    policy = "overwrite" if overwrite else spec.output.policy
    now = now or dt.datetime.now(dt.timezone.utc)
    report = RunReport.start(spec_path=str(loaded.path), spec_sha256=loaded.sha256, catalog=spec.source.stac.catalog,
                             name=name, memory_thresholds=spec.cluster.memory.model_dump())
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
        emit("start", {"spec": str(loaded.path), "name": name, "output": output_path, "policy": policy})
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
        del spec  # from here on, the plan
        report.item_ids = [item["id"] for item in items]
        with timer_for(report)("plan"):
            plan = plan_with_items(loaded, items, layout)
            layout, plan = processes_if_refused(loaded, items, layout, plan)
        record_plan(report, plan)
        for warning in plan.report.warnings:
            emit("warning", {"message": str(warning)})
        emit("plan", {"items": len(items), "tasks": plan.report.task_count,
                      "predicted_peak_per_worker": plan.report.peak_per_worker})
        budget.enforce(plan.report, where=loaded.where("chunks"))
        job_id = fingerprint(plan)
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
            files = (file_fingerprints(plan, output_path)
                     if isinstance(output, CogOutput) and plan.period_labels else {})
            kept: list[dict[str, Any]] = []
            run_plan = plan
            if policy == "update" and not existing.empty and existing.ours and files:
                run_plan, kept = update_plan(loaded, plan, output_path, files, layout)
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
                              interrupts=interrupts, counts=counts, log_path=worker_log_path(own_report),
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
                         and not write.common.is_remote(output_path) and not output_exists(output_path, fmt,
                                                                                               expected))
        report_file = report_destination(own_report, state_dir, name, committed=committed,
                                          lost_lock=lost_lock or nothing_there, status=report.status,
                                          explicit=report_path is not None)
        written_report: str | None = None
        if not dry_run:  # a dry run writes nothing
            for attempt, destination in enumerate(report_fallbacks(report_file, state_dir, name,
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
        drop_if_empty(worker_log_path(own_report))
    outcome = RunResult(
        spec_path=str(loaded.path), name=name, status=report.status, exit_code=int(code),
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


def _input_hrefs(items: list[dict[str, Any]]) -> list[str]:
    return [str(a.get("href")) for item in items for a in (item.get("assets") or {}).values()
            if isinstance(a, dict) and a.get("href")]


def _signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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
            settings = dataclasses.replace(ClusterSettings.from_spec(plan.cluster, plan.gdal_cachemax),
                                           work_stealing=not plan.places_reads)
            handle = stack.enter_context(open_cluster(settings, plan.layout))
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
            progress = CountingProgress(label="blocks", done_word="written", stream=progress_stream or NullStream(),
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
    emit = emit or no_emit
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

"""The verdict: :func:`estimate` adds the worker-level terms to the largest tasks' stages and decides;
:func:`static_estimate` is ``validate``'s check before the items are read."""

from __future__ import annotations

import dataclasses

from rasterflow.budget.cogclient import client_peak_bytes
from rasterflow.budget.constants import (
    LARGE_JOB_BYTES,
    MAX_TASKS,
    MIN_CHUNK_BYTES,
    MIN_TASKS_FOR_LARGE_JOB,
    NARROWEST_LOAD,
    ORDER_STATISTICS,
    SMALL_JOB_BYTES,
)
from rasterflow.budget.messages import (
    FLOAT64_WARNING,
    budget_assumptions,
    client_check,
    tile_misalignment,
    assumed_items,
    narrower_loads,
    over_budget,
    small_chunks,
    time_split,
    too_many_tasks,
    under_used,
    unused_bands,
)
from rasterflow.budget.model import BudgetInputs, BudgetReport, PipelineShape
from rasterflow.budget.paths import (
    largest_tasks,
    code_path,
    concurrent_tasks,
    estimate_task_count,
    held_between_tasks,
    held_for_shards,
    sub_block,
)
from rasterflow.budget.workers import (
    concurrent_bytes,
    baseline_bytes,
    gdal_cache_bytes,
    open_files_bytes,
    remote_io_total,
    stage_estimates,
)


def estimate(shape: PipelineShape, inputs: BudgetInputs, *, on_exceed: str = "error") -> BudgetReport:
    """Estimate the peak per worker (and of the client) and decide. Fixes are solved separately (:func:`solve_fixes`)."""
    stages = stage_estimates(shape, inputs)
    peak_task = max(s.bytes_per_task for s in stages)
    n = concurrent_tasks(shape, inputs)
    tasks_bytes = concurrent_bytes(shape, inputs, largest_tasks(shape, inputs, n))
    held = held_between_tasks(shape, inputs) + held_for_shards(shape, inputs)
    tasks_bytes += held
    files = open_files_bytes(shape, inputs)
    cache = gdal_cache_bytes(shape, inputs)
    baseline = baseline_bytes(inputs)
    io = remote_io_total(shape, inputs, n)
    peak_worker = tasks_bytes + files * n + cache + io + baseline
    client = client_peak_bytes(shape, inputs)
    allowed = int(inputs.max_fraction * inputs.memory_limit)
    refusals: list[str] = []
    warnings: list[str] = []
    if peak_worker > allowed:
        worst = max(stages, key=lambda s: s.bytes_per_task)
        text = over_budget(worst, inputs, tasks_bytes=tasks_bytes, n=n, files=files, cache=cache, io=io,
                           baseline=baseline, peak_worker=peak_worker, allowed=allowed)
        (warnings if on_exceed == "warn" else refusals).append(text)
    client_text = client_check(shape, inputs, client)
    if client_text:
        (warnings if on_exceed == "warn" else refusals).append(client_text)
    if shape.reduce_method in ORDER_STATISTICS and code_path(shape, inputs) == "tree":
        refusals.append(time_split(shape, inputs))
    tasks = estimate_task_count(inputs, len(shape.bands), shape.reduce_method, shape)
    total_bytes = inputs.plane_bytes * inputs.n_spatial_chunks * inputs.n_time_chunks * max(1, len(shape.assets_loaded))
    if tasks > MAX_TASKS:
        refusals.append(too_many_tasks(shape, inputs, tasks))
    elif (tasks < MIN_TASKS_FOR_LARGE_JOB and total_bytes > LARGE_JOB_BYTES
          and inputs.n_spatial_chunks < 2 * inputs.n_workers * inputs.threads_per_worker):
        # Few tasks only hurt when there are fewer chunks than threads to keep busy.
        warnings.append(under_used(shape, inputs, total_bytes))
    if inputs.plane_bytes < MIN_CHUNK_BYTES and inputs.n_spatial_chunks > 1 and total_bytes > SMALL_JOB_BYTES:
        warnings.append(small_chunks(inputs))
    misaligned = tile_misalignment(inputs)
    if misaligned:
        warnings.append(misaligned)
    if inputs.dtype == "float64":
        warnings.append(FLOAT64_WARNING)
    if inputs.time_source == "assumed":
        warnings.append(assumed_items(inputs))
    if shape.unused_bands:
        warnings.append(unused_bands(shape))
    return BudgetReport(
        inputs=inputs,
        stages=stages,
        peak_task_bytes=peak_task,
        peak_per_worker=peak_worker,
        allowed_bytes=allowed,
        fraction_of_limit=peak_worker / inputs.memory_limit,
        task_count=tasks,
        refusals=tuple(refusals),
        warnings=tuple(warnings),
        open_files_bytes=files,
        path=code_path(shape, inputs),
        baseline_bytes=baseline,
        concurrent_tasks=n,
        tasks_bytes=tasks_bytes,
        gdal_cache_bytes=cache,
        client_peak=client,
        assumptions=budget_assumptions(inputs),
        held_bytes=held,
        sub_block=sub_block(shape, inputs),
        io_bytes=io,
    )


def static_estimate(shape: PipelineShape, inputs: BudgetInputs, *, on_exceed: str = "error") -> BudgetReport:
    """The check ``validate`` runs, which cannot read the items: the estimate with loads in the working dtype (the
    widest an asset can load in), and the refusal only when the job is over budget even with the narrowest loads
    (:data:`NARROWEST_LOAD`), so ``validate`` never refuses what ``plan`` accepts; in between it warns and says
    that ``plan`` decides."""
    inputs = dataclasses.replace(inputs, load_assumed=True)
    report = estimate(shape, inputs, on_exceed=on_exceed)
    over = [r for r in report.refusals if r.startswith("over budget")]
    if not over:
        return report
    narrow = estimate(shape, dataclasses.replace(inputs, load_dtype=NARROWEST_LOAD, asset_dtypes=()), on_exceed=on_exceed)
    if any(r.startswith("over budget") for r in narrow.refusals):
        return report
    note = narrower_loads(inputs, report, narrow)
    return dataclasses.replace(report, refusals=tuple(r for r in report.refusals if r not in over),
                               warnings=(note,) + report.warnings)

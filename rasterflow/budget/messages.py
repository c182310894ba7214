"""The budget's words: the refusals, warnings, assumptions and the verdict line, and :func:`enforce`'s error."""

from __future__ import annotations

import math

from rasterflow.budget.constants import (
    CLIENT_BASELINE_BYTES,
    GRAPH_BYTES_PER_TASK,
    MAX_TASKS,
    NARROWEST_LOAD,
)
from rasterflow.budget.model import (
    BudgetInputs,
    BudgetReport,
    PipelineShape,
    StageEstimate,
)
from rasterflow.budget.paths import estimate_task_count
from rasterflow.errors import BudgetExceededError
from rasterflow.units import format_bytes


def client_check(shape: PipelineShape, inputs: BudgetInputs, client: int) -> str | None:
    """The client's peak against what the machine has left after the local workers' limits."""
    if inputs.machine_memory is None or shape.output_format != "cog":
        return None
    workers = inputs.n_workers * inputs.memory_limit if inputs.workers_local else 0
    left = inputs.machine_memory - workers
    if client <= left:
        return None
    return (
        f"the COG writer in this process needs ~{format_bytes(client)} ({format_bytes(CLIENT_BASELINE_BYTES)} baseline "
        f"+ finished blocks in flight + {format_bytes(min(inputs.client_cachemax, client))} GDAL cache at most), but the "
        f"machine's {format_bytes(inputs.machine_memory)} leave only {format_bytes(max(0, left))} after "
        f"{inputs.n_workers} worker(s) × {format_bytes(inputs.memory_limit)}; lower cluster.gdal_cachemax or "
        f"cluster.memory_limit, or write Zarr"
    )


def budget_assumptions(inputs: BudgetInputs) -> tuple[str, ...]:
    out = []
    if inputs.load_assumed:
        out.append(f"assets loaded as {inputs.load_dtype or inputs.dtype} (the items' data types are not read)")
    if inputs.time_source == "max_items":
        out.append(f"{inputs.n_time} items on the time axis, from source.stac.max_items")
    elif inputs.time_source == "assumed":
        out.append(f"{inputs.n_time} items on the time axis (assumed: source.stac.max_items is not set)")
    return tuple(out)


def verdict_line(report: BudgetReport) -> str:
    """``validate``'s words after "ok": the peak and what it assumed."""
    text = f"peak per worker {report.summary}"
    if report.assumptions:
        text += "; assumes " + " and ".join(report.assumptions)
    return text


def tile_misalignment(inputs: BudgetInputs) -> str | None:
    """A warning when spatial chunks cut through the source COG's internal tiles (each read decodes whole tiles)."""
    if inputs.source_tile is None:
        return None
    tile_y, tile_x = inputs.source_tile
    cy, cx = inputs.chunk_yx
    height, width = inputs.grid_shape
    off_y = cy % tile_y and cy != height
    off_x = cx % tile_x and cx != width
    if not (off_y or off_x):
        return None
    aligned_y = max(tile_y, round(cy / tile_y) * tile_y)
    aligned_x = max(tile_x, round(cx / tile_x) * tile_x)
    return (
        f"chunks {cy}×{cx} are not multiples of the source COG tiles ({tile_y}×{tile_x}): reads decode tiles that "
        f"belong to neighbouring chunks; use chunks.y: {aligned_y}, chunks.x: {aligned_x}"
    )


def plane_words(inputs: BudgetInputs) -> str:
    cy, cx = inputs.chunk_yx
    return f"{inputs.items_per_task}×{cy}×{cx} {inputs.dtype} ({format_bytes(inputs.plane_bytes)})"


def chunk_for_tasks(inputs: BudgetInputs, shape: PipelineShape, target: int) -> str:
    per_spatial = max(1, estimate_task_count(inputs, len(shape.bands), shape.reduce_method, shape) - 10) \
        / inputs.n_spatial_chunks
    pixels = inputs.grid_shape[0] * inputs.grid_shape[1]
    side = int(math.sqrt(pixels * per_spatial / target))
    side = max(256, (side // 256) * 256)
    return f"chunks.y = chunks.x = {side}"


def enforce(report: BudgetReport, where: str = "") -> None:
    """Raise :class:`BudgetExceededError` naming the worst stage, the formula and the fixes, when refused."""
    if report.ok:
        return
    prefix = f"{where}: " if where else ""
    lines = [f"{prefix}{reason}" for reason in report.refusals]
    lines.append(f"  per worker: {report.formula}")
    if report.assumptions:
        lines.append("  assumed: " + "; ".join(report.assumptions))
    if report.fixes:
        lines.append("  fixes (each passes the check; `rasterflow plan --fix` prints them ready to paste):")
        for fix in report.fixes:
            lines.append(f"    - {fix.description} -> {format_bytes(fix.peak_per_worker)} per worker "
                         f"({fix.fraction:.0%} of the limit)")
    else:
        lines.append("  no spec change fits this worker; give workers more memory (cluster.memory_limit)")
    raise BudgetExceededError("\n".join(lines))


def over_budget(worst: StageEstimate, inputs: BudgetInputs, *, tasks_bytes: int, n: int, files: int, cache: int,
                io: int, baseline: int, peak_worker: int, allowed: int) -> str:
    """The refusal of a worker over ``max_fraction × memory_limit``: the worst stage and the formula."""
    return (
        f"over budget: the {worst.stage} stage holds {worst.planes:g} planes of "
        f"{plane_words(inputs)} = {format_bytes(worst.bytes_per_task)} per task; "
        f"{format_bytes(tasks_bytes)} for {n} task(s) at once + {format_bytes(files)} open files × {n} + "
        f"{format_bytes(cache)} GDAL cache + "
        + (f"{format_bytes(io)} remote reads (source.io.buffer and the tiles the tasks hold) + " if io else "")
        + f"{format_bytes(baseline)} baseline = "
        f"{format_bytes(peak_worker)} per worker, more than {inputs.max_fraction:g} × "
        f"{format_bytes(inputs.memory_limit)} limit = {format_bytes(allowed)}"
    )


def time_split(shape: PipelineShape, inputs: BudgetInputs) -> str:
    """The refusal of an order statistic over a chunked time axis."""
    return (
        f"chunks.time={inputs.chunk_time} splits time into {inputs.n_time_chunks} chunks, but a {shape.reduce_method} "
        f"over time needs every date of a pixel in one task: Dask would shuffle the chunks between workers and "
        f"hold them while they move; set chunks.time: -1"
    )


def too_many_tasks(shape: PipelineShape, inputs: BudgetInputs, tasks: int) -> str:
    """The refusal of a job above :data:`MAX_TASKS` tasks."""
    # not the scheduler: it holds only the blocks in flight (bounded submission, write.submit), and the
    # graph's tasks are made per batch (layers.TaskLayer); the plan's per-chunk tables are what grows
    return (
        f"about {tasks:,} tasks: above ~{MAX_TASKS:,} what this process holds per chunk (the plan's chunk "
        f"index, the tiles' windows) would take ~{format_bytes(tasks * GRAPH_BYTES_PER_TASK)} "
        f"(~{format_bytes(GRAPH_BYTES_PER_TASK)} per task; the scheduler holds only the blocks in flight); "
        f"use larger chunks ({chunk_for_tasks(inputs, shape, 200_000)} keeps it near 200,000)"
    )


def under_used(shape: PipelineShape, inputs: BudgetInputs, total_bytes: int) -> str:
    """The warning of a large job in fewer spatial chunks than threads to keep busy."""
    return (
        f"only {inputs.n_spatial_chunks} spatial chunks for {inputs.n_workers * inputs.threads_per_worker} "
        f"threads and {format_bytes(total_bytes)} of input: the cluster will be under-used; smaller chunks "
        f"({chunk_for_tasks(inputs, shape, 2_000)}) give about 2,000 tasks"
    )


def small_chunks(inputs: BudgetInputs) -> str:
    return (
        f"chunks are small ({format_bytes(inputs.plane_bytes)} per asset); aim for 100-500 MB in the working dtype: "
        f"per-task overhead will dominate"
    )


FLOAT64_WARNING = "grid.dtype float64 doubles every array compared to float32; reflectance needs only float32"


def assumed_items(inputs: BudgetInputs) -> str:
    return (
        f"source.stac.max_items is not set, so the static check assumes {inputs.n_time} dates; "
        f"set max_items to bound the time axis (plan counts the real items)"
    )


def unused_bands(shape: PipelineShape) -> str:
    """The bands no output needs (a geomedian writes only its own bands): not computed."""
    names = ", ".join(shape.unused_bands)
    words = f"bands {names} are" if len(shape.unused_bands) > 1 else f"band {names} is"
    return (f"{words} not computed: the geomedian reads only reduce.bands (and the bands their expressions "
            f"use); remove them from bands, or add them to reduce.bands to have them in the geomedian")


def narrower_loads(inputs: BudgetInputs, report: BudgetReport, narrow: BudgetReport) -> str:
    """``validate``'s warning in place of a refusal that narrower loads would lift (:func:`static_estimate`)."""
    return (f"over budget if the assets load as {inputs.load_dtype or inputs.dtype} "
            f"({format_bytes(report.peak_per_worker)} per worker, {report.fraction_of_limit:.0%} of the limit); "
            f"within it if they load as {NARROWEST_LOAD} ({format_bytes(narrow.peak_per_worker)}): `rasterflow plan` "
            f"reads the items' data types and decides")

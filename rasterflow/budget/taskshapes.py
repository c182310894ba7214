"""The job's tasks as the budget counts them: which code path runs them (:func:`code_path`), their shapes largest
first (:func:`task_shapes`), how many a worker runs at once (:func:`concurrent_tasks`) and has in flight under the
writer's cap (:func:`units_in_flight`), the Zarr shards (:func:`shards_per_side`) and the periods of the result.

What both the budget (:mod:`rasterflow.budget.paths`) and each code path's cost (:mod:`rasterflow.paths`) read:
kept apart from both so that neither imports the other's module (``rasterflow.paths`` imports this module;
``rasterflow.budget.paths`` imports ``rasterflow.paths``).
"""

from __future__ import annotations

import math

from rasterflow.budget.cogclient import cog_files, cog_tile_layout
from rasterflow.budget.constants import (
    COG_BATCH_BYTES,
    COG_INFLIGHT_PER_THREAD,
    IN_FLIGHT_PER_THREAD,
    QUEUED_UNITS,
    TILES_INFLIGHT_PER_THREAD,
)
from rasterflow.budget.model import BudgetInputs, PipelineShape, TaskShape, axis_chunk_sizes
from rasterflow.units import dtype_itemsize
from rasterflow.writeplan import shard_side  # stdlib only


def code_path(shape: PipelineShape, inputs: BudgetInputs) -> str:
    """What ``graph.build_dataset`` runs: "fused", "tree" or "series" (see the module docstring)."""
    if shape.reduce_method is None:
        return "series"
    if shape.mosaics_passes or inputs.time_per_chunk >= inputs.n_time:
        return "fused"
    return "tree"


def task_shapes(shape: PipelineShape, inputs: BudgetInputs) -> tuple[TaskShape, ...]:
    """The root tasks of the graph by shape, largest first (edge chunks at their real size).

    With solar_day, or a reduction with time whole, a task reads every item whose files meet its chunk (the plan's
    chunk index: ``inputs.depth()``; without one every item), and the fused path's series holds only their dates;
    otherwise one task per time chunk, whose dates are its items (and which reads those meeting its chunk).
    """
    cy, cx = inputs.chunk_yx
    height, width = inputs.grid_shape
    depth = inputs.depth()
    fused = bool(shape.reduce_method) and code_path(shape, inputs) == "fused"
    if shape.mosaics_passes or fused:
        items = inputs.n_time if depth is None else depth.items
        dates = depth.dates if depth is not None and fused else inputs.dates
        times = [(items, dates, 1)]
    else:
        most = inputs.n_time if depth is None else depth.items
        times = [(min(size, most), size, n) for size, n in axis_chunk_sizes(inputs.n_time, inputs.time_per_chunk)]
    grow = 2 * shape.halo  # mask_cleanup reads a halo around every window (counted for the whole task)
    out = [TaskShape(rows + grow, cols + grow, items, dates, ny * nx * nt)
           for rows, ny in axis_chunk_sizes(height, cy) for cols, nx in axis_chunk_sizes(width, cx) for items, dates, nt in times]
    return tuple(sorted(out, key=lambda t: (t.pixels * t.items, t.pixels), reverse=True))


def concurrent_tasks(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Tasks a worker runs at once: its threads, but never more than the root tasks it gets (n_tasks / n_workers)."""
    n_tasks = sum(t.count for t in task_shapes(shape, inputs))
    return max(1, min(inputs.threads_per_worker, math.ceil(n_tasks / max(1, inputs.n_workers))))


def largest_tasks(shape: PipelineShape, inputs: BudgetInputs, n: int) -> list[TaskShape]:
    """The ``n`` largest root tasks (one entry per task)."""
    out: list[TaskShape] = []
    for task in task_shapes(shape, inputs):
        out.extend([task] * min(task.count, n - len(out)))
        if len(out) >= n:
            break
    return out


def units_in_flight(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Spatial chunks one worker has in flight at once under the writer's cap (``write.submit.run_units``): the cap
    counts blocks (:data:`IN_FLIGHT_PER_THREAD` per thread of the cluster for Zarr, whose unit is every band and
    entry of a chunk; :data:`TILES_INFLIGHT_PER_THREAD` or :data:`COG_INFLIGHT_PER_THREAD` for a COG, whose unit is
    up to :data:`COG_BATCH_BYTES` of a chunk's files), shared by the workers, at most the chunks a worker gets."""
    threads = max(1, inputs.n_workers * inputs.threads_per_worker)
    if shape.output_format == "cog":
        cap, group = cog_cap_and_batch(shape, inputs)
        keys = min(group, cog_files(shape, inputs))
    else:
        cap = zarr_cap(inputs)
        keys = zarr_chunk_blocks(shape, inputs)
    # on the fused path the Zarr writer keeps a chunk per thread and write.submit.QUEUED_UNITS more in flight (not
    # with shards): a thread that finishes a reduction may start the queued one before its result's writes arrive
    # (3 bands, 1536² chunks, 2 threads, 4 chunks in flight: 281-290 MB here, 362 MB on CI's machine, against 309 MB
    # projected without a waiting result)
    # on the tree path a chunk per thread, none queued, however many blocks (periods x bands) a chunk holds
    zarr_unsharded = shape.output_format != "cog" and shards_per_side(shape, inputs) <= 1
    path = code_path(shape, inputs)
    floor = threads + QUEUED_UNITS if zarr_unsharded and path == "fused" else \
        threads if zarr_unsharded and path == "tree" else 1
    units = max(1, cap // keys, floor)
    workers = max(1, inputs.n_workers)
    return max(1, min(math.ceil(inputs.n_spatial_chunks / workers), math.ceil(units / workers)))


def cog_cap_and_batch(shape: PipelineShape, inputs: BudgetInputs) -> tuple[int, int]:
    """The COG writer's cap on blocks in flight (:data:`TILES_INFLIGHT_PER_THREAD` per thread where the workers
    make the tiles, else :data:`COG_INFLIGHT_PER_THREAD`; at least 2) and its batch: the blocks of a chunk's files
    it submits together (one unit: within :data:`COG_BATCH_BYTES` and the cap)."""
    threads = max(1, inputs.n_workers * inputs.threads_per_worker)
    per_thread = TILES_INFLIGHT_PER_THREAD if cog_tile_layout(shape, inputs) is not None else COG_INFLIGHT_PER_THREAD
    cap = max(2, per_thread * threads)
    cy, cx = inputs.chunk_yx
    unit_bytes = dtype_itemsize(inputs.dtype) * max(1, len(shape.output_band_names)) * cy * cx
    return cap, max(1, min(cap, COG_BATCH_BYTES // max(1, unit_bytes)))


def zarr_cap(inputs: BudgetInputs) -> int:
    """The Zarr writer's cap on blocks in flight (``write.submit.in_flight_cap``): :data:`IN_FLIGHT_PER_THREAD` per
    thread of the cluster, at least 2."""
    return max(2, IN_FLIGHT_PER_THREAD * max(1, inputs.n_workers * inputs.threads_per_worker))


def zarr_chunk_blocks(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """The blocks of one chunk the Zarr writer submits together (one unit): every band, period and quantile."""
    return shape.result_bands * result_periods(shape, inputs) * max(1, shape.n_quantiles)


def shards_per_side(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Chunks per side of the Zarr v3 shards the writer makes (1: no shards, also for COG and Zarr format 2)."""
    if shape.output_format != "zarr" or shape.zarr_format != 3:
        return 1
    itemsize = dtype_itemsize(shape.stored_dtype or inputs.dtype)
    return shard_side(inputs.chunk_yx, itemsize, store_blocks(shape, inputs), shape.zarr_shards)


def store_blocks(shape: PipelineShape, inputs: BudgetInputs) -> tuple[int, int]:
    """Chunks per axis of one output store: the grid's, or a tile's with ``output.tiling``."""
    cy, cx = inputs.chunk_yx
    height, width = inputs.grid_shape
    if shape.tile_size:  # each tile is a store of its own
        height, width = min(height, shape.tile_size), min(width, shape.tile_size)
    return math.ceil(height / cy), math.ceil(width / cx)


def result_periods(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Periods in the result (1 without ``reduce.period``). Without the dates (the static check) one period of every
    date: the period's subset is then counted at its largest, the small per-period results at one."""
    if not shape.has_period:
        return 1
    return inputs.n_periods or result_periods_with_dates(inputs)


def result_periods_with_dates(inputs: BudgetInputs) -> int:
    """Periods that hold dates (an empty period has no partials): at most every date's own, at least the dates over
    the largest period's."""
    return math.ceil(inputs.dates / max(1, inputs.group_dates or inputs.dates))

"""The budget's side of the code paths: which path a job takes and its tasks' shapes (re-exported from
:mod:`rasterflow.budget.taskshapes`), the sub-blocks of the fused task (:func:`sub_block`), one task's stages on the
job's path (:func:`path_task_stages`) and what a worker holds between tasks (:func:`held_between_tasks`), both through
the one switch :data:`rasterflow.paths.PATHS`; what a worker holds for Zarr shards (:func:`held_for_shards`) and the
task counts (:func:`estimate_task_count`).

Each path's cost lives beside the tasks that run it, in :mod:`rasterflow.paths`: the fused task
(:func:`~rasterflow.paths.fused.fused_stages`, :func:`~rasterflow.paths.fused.fused_held`), the tree
(:func:`~rasterflow.paths.tree.tree_stages`, :func:`~rasterflow.paths.tree.tree_held`) and the series
(:func:`~rasterflow.paths.series.series_stages`, :func:`~rasterflow.paths.series.series_held`), after the stages
every path shares (:func:`~rasterflow.paths.common.item_stages`) and the write that follows each
(:func:`~rasterflow.paths.common.write_extra_bytes`). Every name is re-exported here, so
``from rasterflow.budget.paths import fused_stages`` works as before they moved.
"""

from __future__ import annotations

import math

from rasterflow.budget.constants import MIN_STRIP_ROWS
from rasterflow.budget.model import BudgetInputs, PipelineShape, TaskShape
from rasterflow.budget.taskshapes import (
    largest_tasks,
    result_periods,
    result_periods_with_dates,
    store_blocks,
    code_path,
    concurrent_tasks,
    shards_per_side,
    task_shapes,
    units_in_flight,
)
from rasterflow.paths.common import (
    ItemTerms,
    asset_dtype,
    band_temporary_planes,
    bands_out,
    held_blocks,
    mask_planes,
    working_asset_names,
    band_temporaries,
    item_stages,
    write_extra_bytes,
)
from rasterflow.paths.fused import fused_held, fused_stages, reduce_work
from rasterflow.paths.registry import PATHS
from rasterflow.paths.series import series_held, series_stages
from rasterflow.paths.tree import tree_partial, tree_partials_held, tree_held, tree_stages
from rasterflow.units import dtype_itemsize
from rasterflow.writeplan import SHARDS_IN_FLIGHT, shard_side  # noqa: F401  # stdlib only

# every name this module held before the paths' cost moved to rasterflow.paths: one definition each, imported
# from here as before
__all__ = [
    "code_path",
    "task_shapes",
    "strip_target",
    "sub_blocks_across",
    "sub_block",
    "fitting_rows",
    "block_peak",
    "path_task_stages",
    "ItemTerms",
    "item_stages",
    "fused_stages",
    "reduce_work",
    "bands_out",
    "tree_stages",
    "series_stages",
    "write_extra_bytes",
    "units_in_flight",
    "working_asset_names",
    "asset_dtype",
    "mask_planes",
    "band_temporaries",
    "band_temporary_planes",
    "tree_partial",
    "held_between_tasks",
    "fused_held",
    "held_blocks",
    "tree_partials_held",
    "tree_held",
    "series_held",
    "shards_per_side",
    "store_blocks",
    "held_for_shards",
    "result_periods",
    "result_periods_with_dates",
    "concurrent_tasks",
    "largest_tasks",
    "estimate_task_count",
]


def strip_target(inputs: BudgetInputs) -> int:
    """The per-task working set above which a fused task reduces its chunk in sub-blocks: :data:`STRIP_TARGET_BYTES`,
    or :data:`ONE_PROCESS_STRIP_TARGET_BYTES` when the run is one process. Read from the package, so that a value set
    there (``budget.STRIP_TARGET_BYTES = ...``, as the tests do) is the one used."""
    from rasterflow import budget

    return budget.ONE_PROCESS_STRIP_TARGET_BYTES if inputs.one_process else budget.STRIP_TARGET_BYTES


def sub_blocks_across(inputs: BudgetInputs) -> bool:
    """Whether a fused task takes its sub-blocks across each row of them rather than down each column
    (``tasks.chunk_reduce``): when the concurrent remote reader fetches its files. That reader asks for a row of the
    chunk's tiles of a file in one request and holds it until the row's last sub-block is decoded
    (:func:`remote_io_bytes`), so the sub-blocks of a row must follow each other; down each column, GDAL's block
    cache keeps a tile that strips cut for the next strip."""
    return inputs.remote_fetch


def sub_block(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape | None = None) -> tuple[int, int]:
    """``(rows, cols)`` of the sub-blocks the fused task reduces its chunk in (``tasks.chunk_reduce``); ``(0, 0)``
    = the whole chunk at once.

    A fused task holds its pixels' whole series, so its working set grows with the dates. Above
    :func:`strip_target` the chunk is reduced in sub-blocks whose working set, apart from the chunk's result
    they fill, fits it: when the source tiles
    are known, the widest block of whole tiles (whole columns of tiles of the chunk first) that fits with at least
    one tile's height, so that no tile is decoded for two sub-blocks; when not even one tile fits, strips of one
    tile's width (the sub-blocks of a tile follow each other, so its decoded blocks are still in GDAL's cache);
    without known tiles, full-width row strips. Strips are cut equal and never below :data:`MIN_STRIP_ROWS` rows.
    The job's largest task decides (``task``: for that task alone).
    """
    if code_path(shape, inputs) != "fused":
        return (0, 0)
    task = task or task_shapes(shape, inputs)[0]
    if block_peak(shape, inputs, task, (task.rows, task.cols)) <= strip_target(inputs):
        return (0, 0)
    tile_y, tile_x = inputs.source_tile or (0, 0)
    widths = [task.cols]
    if tile_x and tile_x < task.cols:
        widths += [k * tile_x for k in range(task.cols // tile_x, 0, -1) if k * tile_x < task.cols]
    for cols in widths:
        rows = fitting_rows(shape, inputs, task, cols)
        if tile_y and rows >= tile_y:
            rows = min(task.rows, rows // tile_y * tile_y)
            return (0, 0) if (rows, cols) == (task.rows, task.cols) else (rows, cols)
    cols = tile_x if tile_x and tile_x < task.cols else task.cols
    rows = fitting_rows(shape, inputs, task, cols)
    rows = max(MIN_STRIP_ROWS, math.ceil(task.rows / math.ceil(task.rows / rows)))  # equal strips
    if tile_y and rows < tile_y and inputs.one_process:
        # one process: strips no thinner than worker processes would cut (their target), up to a whole tile. Each
        # strip reads a window per item and asset and runs the kernels on it, under one GIL for both threads: a
        # 5490² x 36-date median ran 28-37 s in strips of 86 rows and 11-19 s in whole tiles, for 278 -> 323 MB
        # (benchmarks/README.md, remote_read.py's season); the task stays within the worker processes' target.
        from rasterflow import budget

        rows = max(rows, min(tile_y, fitting_rows(shape, inputs, task, cols, budget.STRIP_TARGET_BYTES)))
        rows = math.ceil(tile_y / math.ceil(tile_y / rows))  # equal strips of a tile
    elif tile_y and rows < tile_y:
        rows = math.ceil(tile_y / math.ceil(tile_y / rows))  # equal strips of a tile
    return (0, 0) if (rows, cols) == (task.rows, task.cols) or rows >= task.rows and cols >= task.cols \
        else (min(rows, task.rows), cols)


def fitting_rows(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape, cols: int,
                  target: int | None = None) -> int:
    """The most rows of a ``cols``-wide sub-block whose working set, apart from the whole chunk's result, fits
    ``target`` (default :func:`strip_target`; at least :data:`MIN_STRIP_ROWS`): the working set is affine in the
    rows."""
    target = strip_target(inputs) if target is None else target
    result = result_periods(shape, inputs) * max(1, shape.n_quantiles) * shape.result_bands * task.pixels \
        * dtype_itemsize(inputs.dtype)
    at_one = block_peak(shape, inputs, task, (1, cols)) - result
    per_row = max(1, block_peak(shape, inputs, task, (2, cols)) - result - at_one)
    return int(max(MIN_STRIP_ROWS, min(task.rows, (target - (at_one - per_row)) // per_row)))


def block_peak(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape, block: tuple[int, int]) -> int:
    """The reduction's peak with sub-blocks of ``block`` (the write that follows does not depend on them)."""
    return max(nbytes for _, nbytes, _ in path_task_stages(shape, inputs, task, block, writes=False))


def path_task_stages(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape,
                 block: tuple[int, int] | None = None, *, writes: bool = True) -> list[tuple[str, int, str]]:
    """(stage, bytes, detail) of one task of ``task``'s shape on the job's code path, by that path's ``task_stages``
    (:data:`rasterflow.paths.PATHS`): the stages every path shares (:func:`item_stages`), then the path's own
    (:func:`fused_stages`, :func:`tree_stages`, :func:`series_stages`).

    A fused task reduces its chunk in sub-blocks of ``block`` (default: the job's :func:`sub_block`); ``writes``:
    with the fused path's write stage (:func:`block_peak` leaves it out: it does not depend on the sub-blocks)."""
    path = code_path(shape, inputs)
    if block is None:
        block = sub_block(shape, inputs) if path == "fused" else (0, 0)
    return PATHS[path].task_stages(shape, inputs, task, block, writes=writes)


def held_between_tasks(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """What a worker holds besides its running tasks (measured, budget_accuracy.py and
    tests/test_budget_measured.py), on the job's code path: :func:`fused_held`, :func:`tree_held` or
    :func:`series_held` (its ``held``, :data:`rasterflow.paths.PATHS`)."""
    return PATHS[code_path(shape, inputs)].held(shape, inputs)


def held_for_shards(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """What a worker holds for Zarr v3 shards (``write.zarr``): a shard is written whole by one task, so every chunk
    result of the shard is held until its last chunk is done and then gathered on the writing worker, which encodes
    it into one stored-dtype array and zarr's encoded shard beside it. The writer keeps
    :data:`~rasterflow.writeplan.SHARDS_IN_FLIGHT` shard positions in flight: the writing worker holds one whole
    shard's results and its share of the next ones' (when the store has more shards). 0 without shards."""
    side = shards_per_side(shape, inputs)
    if side <= 1:
        return 0
    cy, cx = inputs.chunk_yx
    rows, cols = store_blocks(shape, inputs)
    blocks = min(side, rows) * min(side, cols)
    entries = result_periods(shape, inputs) * max(1, shape.n_quantiles)
    chunk_result = entries * shape.result_bands * cy * cx * dtype_itemsize(inputs.dtype)
    shard_results = blocks * chunk_result
    # the next shards' results, as far as there are next shards: a store of one shard has none (budget_accuracy.py
    # row 39, a 2048² store of 512² chunks in one 4x4 shard, 2 threads: 208-212 MB measured where counting a next
    # shard predicted 276 MB, 1.33; 2026-12-06)
    n_shards = math.ceil(rows / side) * math.ceil(cols / side)
    others = min(SHARDS_IN_FLIGHT - 1, n_shards - 1) * shard_results / max(1, inputs.n_workers)
    stored = blocks * cy * cx * dtype_itemsize(shape.stored_dtype or inputs.dtype)  # one band's shard, one entry
    return int(shard_results + others + 2 * stored)


def estimate_task_count(inputs: BudgetInputs, n_bands: int, reduce_method: str | None,
                        shape: PipelineShape | None = None) -> int:
    """Tasks in the graph ``graph.build_dataset`` builds and the writer runs, per spatial chunk: the fused path has
    the read+kernel task, a selection and a write per band; the tree path one band-block task per time chunk, a
    selection and a partial per band and time chunk, their combination and a write per band; the series path one
    band-block task per time chunk and a selection and a write per band and date."""
    if shape is None:
        shape = PipelineShape((), None, (), (("x", None),) * n_bands, reduce_method, 0)  # type: ignore[arg-type]
    spatial, time_chunks = inputs.n_spatial_chunks, inputs.n_time_chunks
    path = code_path(shape, inputs)
    if path == "fused":
        per_chunk = 1 + 2 * n_bands
    elif path == "tree":
        per_chunk = time_chunks * (1 + 2 * n_bands) + n_bands * (time_chunks + 1)
    else:
        per_chunk = (1 if shape.mosaics_passes else time_chunks) + 2 * n_bands * inputs.dates
    return spatial * per_chunk + 10

"""The worker-level terms: the tasks a worker runs at once and how their peaks add up, the files each thread keeps
open, GDAL's block cache, the remote reader's buffers and the process baseline."""

from __future__ import annotations

import math

from rasterflow.budget.constants import (
    CONCURRENT_RAMP,
    DASK_ARRAY_WORKER_BYTES,
    GDAL_LIBRARY_BYTES,
    LOCAL_FILE_BYTES,
    LOCAL_FILE_BYTES_BY_CODEC,
    MAX_OPEN_PER_THREAD,
    ONE_PROCESS_EXTRA_BYTES,
    OPEN_FILE_BYTES,
    REMOTE_CLIENT_BYTES,
    REMOTE_HEADER_BYTES,
    SUB_BLOCK_RAMP,
    TILE_DECODED_FILE_BYTES,
    VSI_CACHE_BYTES,
    WORKER_BASELINE_BYTES,
)
from rasterflow.budget.model import (
    BudgetInputs,
    PipelineShape,
    StageEstimate,
    TaskShape,
)
from rasterflow.budget.paths import (
    largest_tasks,
    path_task_stages,
    code_path,
    concurrent_tasks,
    shards_per_side,
    sub_block,
    sub_blocks_across,
    task_shapes,
)
from rasterflow.budget.cogclient import cog_files
from rasterflow.budget.taskshapes import cog_cap_and_batch


def baseline_bytes(inputs: BudgetInputs) -> int:
    """The process memory a worker holds apart from its tasks, open files and GDAL cache: the worker baseline, plus,
    when the run is one process, ``dask.array``, xarray and pandas (its client builds the Dataset) and the client's
    and the scheduler's own memory; without GDAL (:data:`GDAL_LIBRARY_BYTES`) in a worker process whose every read
    rasterflow decodes itself (:func:`without_gdal`)."""
    if inputs.one_process:
        return WORKER_BASELINE_BYTES + DASK_ARRAY_WORKER_BYTES + ONE_PROCESS_EXTRA_BYTES
    return WORKER_BASELINE_BYTES - (GDAL_LIBRARY_BYTES if without_gdal(inputs) else 0)


def without_gdal(inputs: BudgetInputs) -> bool:
    """Whether the worker processes never import rasterio: every read is decoded by rasterflow itself (local tiled
    COGs, remote COGs through the concurrent reader), none is warped, and no area of interest masks the windows (its
    mask is rasterio's ``geometry_mask``). A one-process run's worker is the client's process, which plans with
    rasterio."""
    return inputs.tile_decoder and not inputs.warped and not inputs.aoi_mask and not inputs.one_process


def open_file_bytes(inputs: BudgetInputs) -> int:
    """What one open source file keeps per worker thread (:data:`LOCAL_FILE_BYTES_BY_CODEC`, plus the VSI cache
    for remote files; :data:`REMOTE_HEADER_BYTES` for files the concurrent reader reads)."""
    if inputs.remote_fetch:
        return REMOTE_HEADER_BYTES
    local = LOCAL_FILE_BYTES_BY_CODEC.get((inputs.source_codec or "").upper(), LOCAL_FILE_BYTES)
    if inputs.local_files:
        return TILE_DECODED_FILE_BYTES if inputs.tile_decoder else local
    return OPEN_FILE_BYTES if inputs.source_codec is None else local + VSI_CACHE_BYTES


def remote_io_bytes(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Compressed tiles one task of the concurrent remote reader holds: ``source.io.buffer`` fetched ahead of its
    decoder, plus, for every file of the chunk, the row of the chunk's tiles its current sub-block needs: the reader
    fetches a row of tiles in one request (:func:`sub_blocks_across`), which arrives whole; each tile then goes when
    the last sub-block that needs it is decoded. 0 when the job's files are not read that way."""
    if not inputs.remote_fetch:
        return 0
    rows, cols = sub_block(shape, inputs)
    held = 0
    if (rows, cols) != (0, 0):
        tile_y, tile_x = inputs.source_tile or (rows, cols)
        depth = inputs.depth()
        files = depth.files if depth is not None else (inputs.files_per_chunk
                                                       or inputs.n_time * len(shape.assets_loaded))
        bpp = inputs.source_bytes_per_pixel
        if bpp is None:
            bpp = float(max(inputs.load_itemsizes(len(shape.assets_loaded)), default=2))
        chunk_cols = task_shapes(shape, inputs)[0].cols if sub_blocks_across(inputs) else cols
        tiles_down, tiles_across = -(-rows // tile_y), -(-chunk_cols // tile_x)
        held = int(files * tiles_down * tiles_across * tile_y * tile_x * bpp)
    return inputs.io_buffer + held


def started_ahead(shape: PipelineShape, inputs: BudgetInputs) -> bool:
    """Whether queued tasks' remote reads start before a thread runs them (``read.prefetch.ahead``), where the
    concurrent reader reads: where the writer queues tasks on a worker of its own process (the one-process
    layout), and with worker processes where it sends a chunk to a worker it picks and starts the chunk's reads
    there first (``write.submit``): on the fused path as one task, to Zarr without shards and to COG (for a COG whose
    chunk has more entries than one batch takes, the writer keeps a task per entry and does not place it: the
    buffer counted here is then not used, the projection errs high); on the tree path with all its tasks, to Zarr
    without shards (a chunk per thread whatever its blocks) and to COG when a chunk's entries make one batch and the
    writer's cap on blocks lets every worker have a chunk in flight (``write.submit.run_units``' ``place_reads``);
    on the series path each band task with its dates' writes as one task, to Zarr without shards."""
    if not inputs.remote_fetch:
        return False
    if inputs.one_process:
        return True
    path = code_path(shape, inputs)
    zarr_unsharded = shape.output_format == "zarr" and shards_per_side(shape, inputs) <= 1
    if path == "fused":
        return shape.output_format == "cog" or zarr_unsharded
    if path == "series":  # each band task's dates one task with their writes (``write_zarr``'s ``lead_groups``)
        return zarr_unsharded
    if path != "tree":
        return False
    workers = max(1, inputs.n_workers)
    if shape.output_format == "cog":
        cap, batch = cog_cap_and_batch(shape, inputs)
        files = cog_files(shape, inputs)
        return files <= batch and files * workers <= cap
    # to Zarr a chunk per thread is in flight whatever its blocks (the writer's floor): every worker has one
    return zarr_unsharded


def remote_io_total(shape: PipelineShape, inputs: BudgetInputs, tasks: int) -> int:
    """Compressed bytes the concurrent remote reader holds in a worker running ``tasks`` at once: each task's
    :func:`remote_io_bytes`, ``source.io.buffer`` for each task's successor when its reads are started ahead
    (:func:`started_ahead`: one queued task per running one), and the client's own (:data:`REMOTE_CLIENT_BYTES`)."""
    if not inputs.remote_fetch:
        return 0
    queued = inputs.io_buffer if started_ahead(shape, inputs) else 0
    return (remote_io_bytes(shape, inputs) + queued) * tasks + REMOTE_CLIENT_BYTES


def stage_estimates(shape: PipelineShape, inputs: BudgetInputs) -> tuple[StageEstimate, ...]:
    """Per-stage peak of the largest task (planes: ``t × y × x`` of the full chunk in the working dtype)."""
    largest = task_shapes(shape, inputs)[0]
    unit = max(1, inputs.plane_bytes)
    return tuple(StageEstimate(stage, round(nbytes / unit, 3), nbytes, detail)
                 for stage, nbytes, detail in path_task_stages(shape, inputs, largest))


def task_peak(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape) -> int:
    return max(nbytes for _, nbytes, _ in path_task_stages(shape, inputs, task))


def concurrent_bytes(shape: PipelineShape, inputs: BudgetInputs, tasks: list[TaskShape]) -> int:
    """The working sets of tasks running at once: the largest at its peak, each other one with its block and
    :data:`CONCURRENT_RAMP` of the rest (a task's series fill date by date, so concurrent peaks do not coincide);
    with sub-blocks, every one at its peak (:data:`SUB_BLOCK_RAMP`)."""
    ramp = SUB_BLOCK_RAMP if sub_block(shape, inputs) != (0, 0) else CONCURRENT_RAMP
    total = 0
    for index, task in enumerate(tasks):
        stages = path_task_stages(shape, inputs, task)
        peak = max(nbytes for _, nbytes, _ in stages)
        if index == 0:
            total += peak
        else:
            block = stages[0][1]
            total += int(block + ramp * (peak - block))
    return total


def open_files_bytes(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Source files one thread keeps open, :data:`OPEN_FILE_BYTES` each (:data:`LOCAL_FILE_BYTES` when every file is
    local): those of the spatial chunks it reads (all the files, or ``files_per_chunk`` per chunk), at most the
    reader's LRU bound."""
    files = inputs.n_time * len(shape.assets_loaded)
    depth = inputs.depth()
    per_chunk = depth.files if depth is not None else inputs.files_per_chunk
    if per_chunk is not None:
        threads = max(1, inputs.n_workers * concurrent_tasks(shape, inputs))
        chunks_per_thread = math.ceil(inputs.n_spatial_chunks / threads)
        files = min(files, chunks_per_thread * per_chunk)
    return min(MAX_OPEN_PER_THREAD, files) * open_file_bytes(inputs)


def gdal_cache_bytes(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """GDAL's block cache in one worker: ``gdal_cachemax``, but never more than the source blocks it decodes (its
    share of the tasks, each window rounded out to whole source tiles); nothing when every read decodes its tiles
    itself (``tile_decoder``: GDAL only opens the files, its cache stays empty); all of ``gdal_cachemax`` for warped
    reads, whose cache holds the warped blocks as well as the source blocks (a 2048² float64 grid warped from 256²
    sources at 8x, 384² chunks, 256 MB cache: a worker measured 454 MB where the decoded-bytes cap predicted 379 MB,
    tests/test_budget_paths.py, 2026-12-05)."""
    if inputs.tile_decoder:
        return 0
    if inputs.warped:
        return inputs.gdal_cachemax
    n_tasks = sum(t.count for t in task_shapes(shape, inputs))
    share = math.ceil(n_tasks / max(1, inputs.n_workers))
    file_px = sum(inputs.load_itemsizes(len(shape.assets_loaded)))
    decoded = 0
    for task in largest_tasks(shape, inputs, share):
        rows, cols = task.rows, task.cols
        if inputs.source_tile:
            tile_y, tile_x = inputs.source_tile
            rows, cols = math.ceil(rows / tile_y) * tile_y, math.ceil(cols / tile_x) * tile_x
        decoded += task.items * rows * cols * file_px
        if decoded >= inputs.gdal_cachemax:
            return inputs.gdal_cachemax
    return min(inputs.gdal_cachemax, decoded)

"""The static memory model: what every task a worker runs at once holds, plus what the worker keeps. Pure arithmetic.

DOMAIN.md: ``peak per worker ≈ chunk_bytes × live_arrays × threads_per_worker + GDAL block cache + interpreter``.

The model follows the code path :mod:`rasterflow.graph` builds from the same resolved plan (issue 10); each path's
cost lives beside the tasks that run it, in :mod:`rasterflow.paths` (issue 28):

- **fused** (a reduction with time whole, or ``group_by: solar_day``): one task per spatial chunk reads every item
  whose files meet the chunk (the plan's chunk index, :attr:`BudgetInputs.chunk_depth`: its most items of one chunk),
  one item at a time (``read.item_stream``: that item's raw planes in each asset's load dtype, plus a boolean
  coverage plane for integer assets without one nodata value), masks and evaluates the bands one date at a time into
  one output series per band (``kernels._band_series``: one per date with an item there, passes with solar_day) and
  reduces each series (``kernels.reduce_block``), on a period's subset copy when there are periods. A chunk whose
  series would be over :data:`STRIP_TARGET_BYTES` is reduced in sub-blocks (:func:`sub_block`,
  ``tasks.chunk_reduce``): the task then holds one sub-block's series and the chunk's result.
- **tree** (a streaming reduction with time chunked): one task per (time chunk, spatial chunk) evaluates the bands
  into a ``(date, band, y, x)`` block (``kernels.band_block``), which stays in the worker until one reduction task
  per band has turned it into partials (``paths.tree._tree_reduce``: ``tasks.tree_partials``, NumPy's nan-reductions;
  std's streaming partials).
- **series** (no reduction): the same band block, held until every date of it is written.

Each path's last stage is the write of what it made, on the same worker (:func:`write_extra_bytes`): a Zarr chunk's
buffers, or, for a COG, the bands stacked into one block and, when the workers compress the tiles, the tiles and the
first overview's halving; a finished result waits for its write while the thread runs its next task
(:func:`held_between_tasks`).

A task's memory is counted in *planes*: one plane is one asset's chunk over the task's items, ``t × y × x`` in the
working dtype (``t``: :attr:`BudgetInputs.items_per_task`). A worker runs as many tasks at
once as it has threads *and* tasks: a worker that gets one chunk holds one working set whatever its threads. Edge
chunks are counted at their real size. GDAL's block cache holds at most what the worker decodes; each thread keeps
the files it opened (a bounded LRU, ``read.datasets``). With COG output the client process assembles the files
(finished blocks in flight plus its own GDAL cache): that is checked against the machine's memory.
Nothing here imports Dask or touches the network: ``validate`` runs this in milliseconds.

The package, by what each module holds:

- :mod:`~rasterflow.budget.constants`: the measured constants, each with its provenance;
- :mod:`~rasterflow.budget.model`: the dataclasses (:class:`PipelineShape`, :class:`BudgetInputs`, :class:`TaskShape`,
  :class:`StageEstimate`, :class:`Fix`, :class:`BudgetReport`);
- :mod:`~rasterflow.budget.taskshapes`: which code path a job takes and its tasks' shapes, how many run at once;
- :mod:`~rasterflow.budget.paths`: the sub-blocks, one task's stages and what a worker holds between its tasks on
  the job's path, through the one switch :data:`rasterflow.paths.PATHS` (each path's functions live in
  :mod:`rasterflow.paths.fused`, :mod:`~rasterflow.paths.tree`, :mod:`~rasterflow.paths.series`, re-exported here);
- :mod:`~rasterflow.budget.workers`: the worker-level terms (tasks at once, open files, GDAL's cache, baseline);
- :mod:`~rasterflow.budget.cogclient`: the COG tile layout and the client that assembles the files;
- :mod:`~rasterflow.budget.verdict`: :func:`estimate` and :func:`static_estimate`;
- :mod:`~rasterflow.budget.solver`: the fix solver;
- :mod:`~rasterflow.budget.messages`: the words.

Every name is re-exported here: ``from rasterflow.budget import X`` and ``budget.X`` work as before the split. A
constant set on this package (``budget.STRIP_TARGET_BYTES = ...``, as tests do) is what :func:`strip_target` reads.
"""

from __future__ import annotations

from rasterflow.budget.cogclient import (  # noqa: F401
    axis_chunks,
    client_peak_bytes,
    cog_copy_bytes,
    cog_files,
    cog_tile_layout,
)
from rasterflow.budget.constants import (  # noqa: F401
    ALIGNED_GDAL_CACHEMAX,
    ASSEMBLY_LEVEL_COPIES,
    CACHE_CANDIDATES,
    CLIENT_BASELINE_BYTES,
    CLIENT_RESULT_COPIES,
    CLIENT_RESULTS_RECEIVED,
    COG_BATCH_BYTES,
    COG_COPY_ROWS,
    COG_COPY_ROWS_PER_THREAD,
    COG_INFLIGHT_PER_THREAD,
    COG_TILE_BYTES_RATIO,
    COG_WRITER_BYTES,
    CONCURRENT_RAMP,
    DASK_ARRAY_WORKER_BYTES,
    DEFAULT_ASSUMED_ITEMS,
    DEFAULT_GDAL_CACHEMAX,
    ENCODE_PLANES,
    GRAPH_BYTES_PER_TASK,
    HALVE_BYTES_PER_PIXEL,
    IN_FLIGHT_PER_THREAD,
    LARGE_JOB_BYTES,
    LOAD_COPIES,
    LOCAL_FILE_BYTES,
    LOCAL_FILE_BYTES_BY_CODEC,
    MAX_OPEN_PER_THREAD,
    MAX_TASKS,
    MIN_CHUNK_BYTES,
    MIN_STRIP_ROWS,
    MIN_TASKS_FOR_LARGE_JOB,
    NARROWEST_LOAD,
    ONE_PROCESS_EXTRA_BYTES,
    ONE_PROCESS_STRIP_TARGET_BYTES,
    OPEN_FILE_BYTES,
    ORDER_STATISTICS,
    REDUCTION_EXTRA_PLANES,
    REMOTE_CLIENT_BYTES,
    REMOTE_HEADER_BYTES,
    SMALL_JOB_BYTES,
    STD_PARTIAL_PLANES,
    STRIP_TARGET_BYTES,
    SUB_BLOCK_RAMP,
    TABLE_DTYPES,
    TILE_DECODED_FILE_BYTES,
    TILES_INFLIGHT_PER_THREAD,
    TREE_CHUNK_EXTRA_PLANES,
    TREE_PARTIAL_PLANES,
    TREE_SPLIT_EVERY,
    VSI_CACHE_BYTES,
    WORKER_BASELINE_BYTES,
    GDAL_LIBRARY_BYTES,
    ZARR_WRITE_PLANES,
    spec_gdal_cachemax,
)
from rasterflow.budget.messages import (  # noqa: F401
    budget_assumptions,
    chunk_for_tasks,
    client_check,
    plane_words,
    tile_misalignment,
    enforce,
    verdict_line,
)
from rasterflow.budget.model import (  # noqa: F401
    BudgetInputs,
    BudgetReport,
    ChunkDepth,
    Fix,
    PipelineShape,
    StageEstimate,
    TaskShape,
    axis_chunk_sizes,
    pipeline_shape,
)
from rasterflow.budget.paths import (  # noqa: F401
    asset_dtype,
    band_temporary_planes,
    block_peak,
    fitting_rows,
    largest_tasks,
    mask_planes,
    result_periods,
    store_blocks,
    path_task_stages,
    tree_partial,
    working_asset_names,
    band_temporaries,
    code_path,
    concurrent_tasks,
    estimate_task_count,
    held_between_tasks,
    held_for_shards,
    shards_per_side,
    strip_target,
    sub_block,
    sub_blocks_across,
    task_shapes,
    units_in_flight,
    write_extra_bytes,
)
from rasterflow.budget.solver import (  # noqa: F401
    largest_passing,
    largest_square_chunk,
    merge_nested,
    with_items,
    complete_patch,
    dataclasses_replace,
    fix_text,
    solve_fixes,
    with_fixes,
)
from rasterflow.budget.verdict import (  # noqa: F401
    estimate,
    static_estimate,
)
from rasterflow.budget.workers import (  # noqa: F401
    concurrent_bytes,
    task_peak,
    baseline_bytes,
    without_gdal,
    gdal_cache_bytes,
    open_file_bytes,
    open_files_bytes,
    remote_io_bytes,
    remote_io_total,
    stage_estimates,
    started_ahead,
)

__all__ = [
    "PipelineShape",
    "BudgetInputs",
    "StageEstimate",
    "TaskShape",
    "Fix",
    "BudgetReport",
    "pipeline_shape",
    "code_path",
    "task_shapes",
    "sub_block",
    "sub_blocks_across",
    "stage_estimates",
    "remote_io_total",
    "started_ahead",
    "estimate",
    "static_estimate",
    "solve_fixes",
    "with_fixes",
    "complete_patch",
    "fix_text",
    "enforce",
    "REDUCTION_EXTRA_PLANES",
    "TREE_CHUNK_EXTRA_PLANES",
    "WORKER_BASELINE_BYTES",
    "GDAL_LIBRARY_BYTES",
    "DASK_ARRAY_WORKER_BYTES",
    "ONE_PROCESS_EXTRA_BYTES",
    "LOCAL_FILE_BYTES_BY_CODEC",
    "TILE_DECODED_FILE_BYTES",
    "open_file_bytes",
    "baseline_bytes",
    "without_gdal",
    "CLIENT_BASELINE_BYTES",
    "DEFAULT_ASSUMED_ITEMS",
    "STRIP_TARGET_BYTES",
    "ONE_PROCESS_STRIP_TARGET_BYTES",
    "verdict_line",
    "spec_gdal_cachemax",
    "ChunkDepth",
    "dataclasses_replace",
    "ALIGNED_GDAL_CACHEMAX",
    "TREE_SPLIT_EVERY",
    "strip_target",
]

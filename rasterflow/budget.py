"""The static memory model: what every task a worker runs at once holds, plus what the worker keeps. Pure arithmetic.

DOMAIN.md: ``peak per worker ≈ chunk_bytes × live_arrays × threads_per_worker + GDAL block cache + interpreter``.

The model follows the code path :mod:`rasterflow.graph` builds from the same resolved plan (issue 10):

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
  per band has turned it into partials (``graph._tree_reduce``: ``tasks.tree_partials``, NumPy's nan-reductions;
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
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from rasterflow.errors import BudgetExceededError
from rasterflow.expr import Expression, parse_expression
from rasterflow.gdalenv import VSI_CACHE_SIZE  # stdlib only: validate stays light
from rasterflow.units import dtype_itemsize, format_bytes, parse_bytes
from rasterflow.write.shards import SHARDS_IN_FLIGHT, shard_side  # stdlib only

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
    "stage_estimates",
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
    "DASK_ARRAY_WORKER_BYTES",
    "ONE_PROCESS_EXTRA_BYTES",
    "LOCAL_FILE_BYTES_BY_CODEC",
    "TILE_DECODED_FILE_BYTES",
    "open_file_bytes",
    "baseline_bytes",
    "CLIENT_BASELINE_BYTES",
    "DEFAULT_ASSUMED_ITEMS",
]

# Working copies a reduction over time makes, in planes of its input (t × y × x, working dtype), on top of the planes
# the fused task holds. Measured with benchmarks/budget_accuracy.py (the reduction table it prints first) on 2026-12-02:
# kernels.reduce_time on a 16 × 1024 × 1024 series with 30 % NaN, RSS high-water mark above the input, bottleneck
# 1.6.1, NumPy 2.4:
# - median, mean, std, min, max: 0.063 planes for float32 and float64, i.e. only the (y, x) result (1/t of a plane):
#   bottleneck reduces along the time axis without copying the series (NumPy's nanmedian/nanmean would copy it).
#   0.1 covers the result for t >= 10.
# - sum: 0.39 (float32) / 0.26 (float64): the boolean valid mask (1/4 resp. 1/8 plane) and its any() over time.
# - count: 0.37 / 0.19: ~isnan's two boolean temporaries. Both rounded up to 0.5.
# - quantile: 2.08 / 2.31 (float32, 1 / 3 quantiles), 1.76 / 1.95 (float64): np.sort's sorted copy plus its
#   buffer along the non-contiguous time axis, and the valid count; rounded up to 2.5 (a few more quantiles fit).
# Re-measured 2026-12-03 after median and quantile moved to rasterflow.fastreduce (pixel-major blocks of <= 8192
# pixels x t, sorted in a reused buffer; issue 13): median 0.071 / 0.072 (the result + the ~1.5 MB buffer: 0.1
# still covers it), quantile 0.083 / 0.076 (1 q) and 0.209 / 0.201 (3 q): the result only, no sorted copy; 0.5
# covers q <= 6 at t = 16. (With the old 2.5, budget_accuracy.py rows 8 / 9, fused quantile, predicted 1.35 / 1.30x
# the measured peak.)
REDUCTION_EXTRA_PLANES: Mapping[str, float] = {
    "median": 0.1,
    "quantile": 0.5,
    "mean": 0.1,
    "sum": 0.5,
    "std": 0.1,
    "count": 0.5,
    "min": 0.1,
    "max": 0.1,
}

TREE_CHUNK_EXTRA_PLANES: Mapping[str, Any] = {
    "mean": lambda w: 1 + 3 / w,  # nansum's NaN-free copy and its mask, the valid count's two masks
    "sum": lambda w: 1 + 3 / w,
    "count": lambda w: 2 / w,  # the valid count's two masks
    "min": lambda w: 0.1,
    "max": lambda w: 0.1,
    "std": lambda w: 0.0,
}
"""Working copies of the per-band reduction task of the tree path, in planes of one band's time-chunk series of
itemsize ``w``, on top of the band block it reads (``tasks.tree_partials``): NumPy's nansum copies the series with
NaN replaced by 0 and keeps a boolean mask (1 + 1/w plane), the valid count adds two boolean planes (mean, sum);
count is those two boolean planes; min/max reduce without a copy (``np.fmin.reduce``). Measured for float32 (1.75,
0.5) when these were Dask's nan-reductions, whose copies are the same NumPy calls, and checked again with
budget_accuracy.py's tree rows on 2026-12-05; with the masks counted as a fixed 3/4 plane, the float64 sum row came
out 1.35x its measured peak (now 1.27x). std runs ``kernels.std_partials`` whose (y, x) temporaries are
:data:`STD_PARTIAL_PLANES` one-date planes."""

TREE_PARTIAL_PLANES: Mapping[str, Any] = {
    # count, mean, M2 in the working dtype (kernels.std_partials), + 1 measured when Dask's reduction concatenated
    # (1, 3, y, x) blocks (142 MB above the baseline, cache and files at 4 time chunks of 1024² float32 where 3 gave
    # 113 MB); kept, as budget_accuracy.py's std rows still measure 0.95-1.08 of it
    "std": lambda w: 4,
    "mean": lambda w: 2,  # tasks.tree_partials: the total and the valid count in the working dtype
    "sum": lambda w: 2,  # the same two
    "count": lambda w: 1,  # the valid count in the working dtype
    "min": lambda w: 1,
    "max": lambda w: 1,
}
"""One band's partial result of one time chunk, in one-date ``(y, x)`` planes of the working dtype (itemsize ``w``)."""

TREE_SPLIT_EVERY = 4
"""Dask's default fan-in of a tree reduction (``split_every``): partials concatenated per combine."""

STD_PARTIAL_PLANES = 8
"""One-date ``(y, x)`` planes of ``kernels.std_partials``: count, mean, M2, delta, the update, the boolean mask and
the time chunk's strided date view's temporaries (rounded up)."""

WORKER_BASELINE_BYTES = 135 * 10**6
"""RSS of a Dask worker running rasterflow's tasks, apart from their arrays, the GDAL cache and the open files. The
fused and series tasks import NumPy, rasterio/GDAL, zarr, bottleneck and rasterflow's kernels, reader and region
writer (``rasterflow.tasks``, ``rasterflow.write.regions``), not ``dask.array`` or xarray. Idle after those imports a
worker is 150 MB measured with the benchmark venv (benchmarks/budget_accuracy.py, 2026-12-05; its rasterio imports
boto3, which moto brings) and ~120 MB after a whole job in rasterflow's own install; the fused and series rows of
budget_accuracy.py measured 60-70 MB less than with the earlier worker that imported xarray (200 MB then), the same
arrays. 135 MB."""

DASK_ARRAY_WORKER_BYTES = 65 * 10**6
"""What a process holds more when it imports ``dask.array`` and, through it, xarray and pandas (``dask.array``
imports xarray whenever it is installed): a one-process run's client builds the xarray Dataset, so its process holds
them. Worker processes do not: every task function lives in :mod:`rasterflow.tasks` (or is NumPy's or the
stdlib's), the tree path's partials and combines too. Measured 2026-12-05: the fused and series rows of
budget_accuracy.py dropped by 60-70 MB when their tasks left the heavy modules, the tree rows did not until theirs
did."""

ONE_PROCESS_EXTRA_BYTES = 20 * 10**6
"""What a run in one process (``cluster.processes: false``) holds beside a worker's baseline and the libraries of
:data:`DASK_ARRAY_WORKER_BYTES`: the client, the scheduler and the writers live in the same interpreter as the tasks.
Measured by ``rasterflow run`` from rasterflow's own install on the 4096² x 8 benchmark sample (masked NDVI median,
1024² chunks, 2 threads, sub-blocks of :data:`ONE_PROCESS_STRIP_TARGET_BYTES`, 2026-12-05), after the grid mapping
stopped loading rioxarray and pyproj before the compute (``rasterflow.georef``): 223-224 MB (Zarr) and 240 MB (COG),
from 242-246 MB (Zarr) the same morning; 245 MB predicted with 20 MB here: measured / predicted 0.91 and 0.98.
Earlier (40 MB, 2026-12-05, before that change): 227 / 228 / 231 MB at 2048² / 4096² / 8192² x 8 dates (Zarr), 244
MB at 4096² x 8 (COG), 247 MB at 4096² x 36 (Zarr), 0.86-0.93 of the prediction."""


def baseline_bytes(inputs: BudgetInputs) -> int:
    """The process memory a worker holds apart from its tasks, open files and GDAL cache: the worker baseline, plus,
    when the run is one process, ``dask.array``, xarray and pandas (its client builds the Dataset) and the client's
    and the scheduler's own memory."""
    return WORKER_BASELINE_BYTES + ((DASK_ARRAY_WORKER_BYTES + ONE_PROCESS_EXTRA_BYTES) if inputs.one_process else 0)


CONCURRENT_RAMP = 0.6
"""Share of a task's working set beyond its loaded block counted for each task that runs beside the largest one.
The block is allocated when the read starts; the series and the temporaries fill during the task, so tasks on
several threads do not peak at the same moment. With full peaks summed, the two-thread rows of budget_accuracy.py
came out 1.07-1.32x their measured peak while the single-thread rows were 1.01-1.17x (2026-12-03); 0.6 brings the
two-thread rows into the same range (1.05-1.23x)."""

SUB_BLOCK_RAMP = 1.0
""":data:`CONCURRENT_RAMP` of fused tasks that reduce their chunk in sub-blocks: each sub-block fills its series and
is reduced, then the next one, so a task stays near its peak for most of its time and the peaks of tasks on
several threads coincide. Measured 2026-12-06 (tests/test_budget_measured.py): a 3-band median of 1536² chunks in
sub-blocks on 2 threads measured 289-297 MB where 0.6 predicted 276 MB (0.93-0.96), a one-process run of the same
in float64 384 MB where 364 MB (0.95); both tasks at their peak: 1.04 each."""

CLIENT_BASELINE_BYTES = 225 * 10**6
"""RSS of the client process that runs a LocalCluster (the scheduler lives in it) and the writers, before it holds
any block: 217-219 MB measured on Zarr runs by benchmarks/budget_accuracy.py on 2026-12-03 (a fresh process each)."""

COG_WRITER_BYTES = 10 * 10**6
"""What the COG writer adds to the client besides the blocks, its GDAL cache and the COG copy's row buffers
(:data:`COG_COPY_ROWS`): the GTiff and COG drivers, the received blocks' frames."""

ASSEMBLY_LEVEL_COPIES = 2
"""Copies of the client's overview levels (``write.cogassembly``) alive while it makes the next one: the level, and
``cogtiles.halve``'s masked copy and sums."""

COG_COPY_ROWS = 4800
"""Output rows (each ``width × bands × stored itemsize`` bytes) that GDAL's COG driver holds, besides its block
cache, while it tiles the finished file and builds its overviews on one thread (``write.cog``, after the last
block). Measured 2026-12-04 (rasterio 1.4 / GDAL 3.10, float32, 1 band, 512² COG tiles, ``OVERVIEWS=AUTO``): at 4096
px wide ~80 MB, at 10980 px ~200 MB above the cache, whatever the cache size (16, 64, 256 MB). It is what the budget
missed on the 10980² x 36 season's COG client (predicted 538 MB, measured 757 MB)."""

COG_COPY_ROWS_PER_THREAD = 2200
"""Rows each further copy thread adds (``NUM_THREADS`` = the client's cores): +30-40 MB at 4096 px, +95-110 MB at
10980 px per thread, measured as :data:`COG_COPY_ROWS`."""

DEFAULT_GDAL_CACHEMAX = 256 * 10**6
"""``cluster.gdal_cachemax: auto`` where a cache helps: warped reads (a WarpedVRT reads source blocks again for
neighbouring output rows) and source tiles cut by chunk or sub-block edges (decoded once per side); and the COG
writer's cache in the client (overviews read the full-resolution tiles back)."""

def spec_gdal_cachemax(value: str | int) -> int:
    """``cluster.gdal_cachemax`` in bytes before the plan has looked at the files: ``auto`` is
    :data:`DEFAULT_GDAL_CACHEMAX` (``plan`` lowers it to :data:`ALIGNED_GDAL_CACHEMAX` when it can)."""
    return DEFAULT_GDAL_CACHEMAX if value == "auto" else parse_bytes(value)


ALIGNED_GDAL_CACHEMAX = 16 * 10**6
"""``cluster.gdal_cachemax: auto`` when every source file is on the output grid and its tiles fall on the chunks'
edges: each block is decoded exactly once, so the cache only fills (measured, 4096² x 8 one-process job,
2026-12-04: 4 MB vs 64 MB, the same wall, 60 MB less peak). GDAL still passes each block through the cache: a few
tiles per thread and open file fit in this."""

COG_INFLIGHT_PER_THREAD = 2
"""``write.cog``: at most 2 × threads finished blocks are in flight to the client at once (GDAL's copy)."""

TILES_INFLIGHT_PER_THREAD = 4
"""``write.cog``: 4 × threads blocks' compressed tiles when the workers make them (``cog_tile_layout``)."""

IN_FLIGHT_PER_THREAD = 4
"""``write.submit.IN_FLIGHT_PER_THREAD``: the Zarr writer's cap on blocks in flight per thread of the cluster."""

COG_BATCH_BYTES = 128 * 2**20
"""``write.cog.BATCH_BYTES``: a COG writer's unit is at most this much of one chunk's files (entries)."""

ZARR_WRITE_PLANES = 1.6
"""What a Zarr write task (``write.regions.write_region``) holds beside the block it writes, in one-band planes of
the stored dtype: zarr's chunk buffer and the compressed chunk. Measured 2026-12-06 with a one-off probe (the real
fused task of one 3072² chunk of tests/test_budget_measured.py's 3072² x 6 scenes, then ``write_region`` of its
result, in one process, the high-water mark above the block): 1.53-1.63 planes for float32 and 1.25-1.32 for float64,
Blosc-LZ4 with shuffle and Zstd 3 alike; a chunk half outside the items' footprint, whose NaN compress away, 0.87.
Without this the write after a large chunk's reduction was not counted: a 3072² float64 median to Zarr, one thread,
measured 293 MB where 265 MB was predicted (0.91)."""

ENCODE_PLANES = 1.0
"""More one-band planes of the stored dtype when the writer encodes (``output.encoding``: a stored dtype other than
the working one): ``encode_block``'s cast copy; its NaN mask is counted as 1 byte a pixel beside it."""

COG_TILE_BYTES_RATIO = 1.0
"""A worker's compressed COG tiles of one block (``write.cogtiles.block_tiles``), as a share of the block's stored
bytes: 0.89-0.93 measured for the sample's float32 NDVI/EVI/NDWI with ZSTD and the floating-point predictor
(2026-12-06), 0.50 for float64; 1.0 = incompressible noise, the most they can be."""

HALVE_BYTES_PER_PIXEL = 4.25
"""``write.cogtiles.halve``'s temporaries per pixel of the level it halves, beside its result (``itemsize / 4``):
the float64 sums and mean (2 + 2 bytes: a quarter of the pixels each) and the uint8 count (0.25). Measured with the
tiles (2026-12-06): ``block_tiles`` peaks at 2.14-2.33 float32 blocks above its input (tiles 0.89-0.93 + these
1.31), 0.97 float64 blocks (tiles 0.50 + 0.47)."""

CLIENT_RESULTS_RECEIVED = 2
"""Finished blocks of worker tiles (``cogtiles.BlockTiles``) the COG client holds at once: the one its writer
spools while the next one arrives. Each at :data:`CLIENT_RESULT_COPIES` copies."""

CLIENT_RESULT_COPIES = 2
"""A received block of tiles is in the client twice while it is unpacked: the message's frames and the tiles'
``bytes``. Measured 2026-12-06: a 3-band 3072² float32 block (105 MB of tiles) raised the client 214 MB above its
baseline (predicted 365 MB, measured 439 MB, 0.83, when the model counted the 4-per-thread blocks in flight once:
those are computed on the workers and fetched one by one, so with 2 threads and 1536² chunks the same model was
1.17-1.37x the measured client)."""

LOAD_COPIES = 1
"""Copies of one item's loaded planes alive in a task: the read output itself; the kernel takes it without a copy."""

STRIP_TARGET_BYTES = 64 * 2**20
"""The working set above which a fused task reduces its chunk in sub-blocks (:func:`sub_block`): about what a
1024² chunk of 8 dates holds, so that a season or a year at the same chunks needs no more memory per task than a
short series (issue 13: "memory must not grow with the job"). ``plan`` prints the sub-block."""

ONE_PROCESS_STRIP_TARGET_BYTES = 8 * 2**20
""":data:`STRIP_TARGET_BYTES` of a run in one process (``cluster.processes: false``, the small-job mode): there the
client's libraries (~170 MB: NumPy, rasterio, ``dask.array`` with xarray and pandas, distributed) share the process
with the tasks, so smaller sub-blocks keep the whole run near a streaming tool's footprint (issue 13, step 0:
GDAL's 0.22 GB). Measured with compare_peers.py at 4096² x 8 dates, 2 threads: see benchmarks/README.md."""

MIN_STRIP_ROWS = 16
"""Strips are never lower than this (per-strip overhead: one window read per item and asset)."""

OPEN_FILE_BYTES = 2 * 10**6
"""Memory each open remote source file keeps per worker thread for the whole job: a GDAL dataset with its header,
its decoder's buffers and a 1 MB file cache (read.datasets.VSI_CACHE_SIZE). Measured with
benchmarks/budget_accuracy.py on 2026-12-02: ~2 MB per file and thread."""

LOCAL_FILE_BYTES = 1 * 10**6
"""The same for a local file, which is read without GDAL's per-file cache (``read.datasets.open_source``): the
dataset and libtiff's buffers (the compressed tile and the ZSTD window). Measured on the 5490² x 36 season
(benchmarks/README.md, 2026-12-03): 1.67 MB per file with the cache, 0.94 MB without."""

LOCAL_FILE_BYTES_BY_CODEC: Mapping[str, int] = {
    "ZSTD": LOCAL_FILE_BYTES,
    "DEFLATE": 400 * 10**3,
    "LZW": 500 * 10**3,
    "NONE": 150 * 10**3,
}
"""What an open local file keeps, by its codec (the first loaded asset's header, read at plan time): the dataset
(~0.11 MB) and the decoder state libtiff keeps until the file is closed: after one 512² uint16 tile, 0.84 MB for
ZSTD, 0.27 MB for DEFLATE, 0.36 MB for LZW, 0.04 MB uncompressed (108 files in one process, 2026-12-04,
benchmarks/README.md "What still grows with the dates"). Another or an unknown codec: :data:`LOCAL_FILE_BYTES`.
A remote file adds its 1 MB VSI cache to the same (:data:`OPEN_FILE_BYTES` when the codec is unknown)."""

TILE_DECODED_FILE_BYTES = 100 * 10**3
"""What an open local file keeps when :mod:`rasterflow.read.tiles` decodes its tiles (GDAL never decodes, so libtiff
allocates no decoder): the dataset and the tile index, 0.07 MB measured with 108 ZSTD files (2026-12-04,
benchmarks/README.md). A read's compressed and decoded tile live only for that read (< 1 MB at 512² uint16)."""

VSI_CACHE_BYTES = VSI_CACHE_SIZE
"""The per-file cache a remote file is opened with (:data:`rasterflow.gdalenv.VSI_CACHE_SIZE`)."""


def open_file_bytes(inputs: BudgetInputs) -> int:
    """What one open source file keeps per worker thread (:data:`LOCAL_FILE_BYTES_BY_CODEC`, plus the VSI cache
    for remote files; :data:`REMOTE_HEADER_BYTES` for files the concurrent reader reads)."""
    if inputs.remote_fetch:
        return REMOTE_HEADER_BYTES
    local = LOCAL_FILE_BYTES_BY_CODEC.get((inputs.source_codec or "").upper(), LOCAL_FILE_BYTES)
    if inputs.local_files:
        return TILE_DECODED_FILE_BYTES if inputs.tile_decoder else local
    return OPEN_FILE_BYTES if inputs.source_codec is None else local + VSI_CACHE_BYTES


REMOTE_HEADER_BYTES = 20 * 10**3
"""A remote file's parsed header in the concurrent reader's per-process cache (tile offsets and byte counts, 16
bytes a tile: 8 kB for a 10980² COG in 512² tiles, plus tifffile's objects)."""

REMOTE_CLIENT_BYTES = 25 * 10**6
"""The concurrent reader's client in a process: aiohttp and obstore imported (10.5 MB), the event loop's thread,
its connections and their buffers (13 MB with 64 range requests of 64 kB answered), measured 2026-12-05."""


def remote_io_bytes(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Compressed tiles one task of the concurrent remote reader holds: ``source.io.buffer`` fetched ahead of its
    decoder, plus the tiles its current window shares with later windows (sub-blocks that cut the source tiles: a
    tile is fetched once per task and kept until its last window is decoded), for every file of the chunk. 0 when
    the job's files are not read that way."""
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
        tiles_down, tiles_across = -(-rows // tile_y), -(-cols // tile_x)
        held = int(files * tiles_down * tiles_across * tile_y * tile_x * bpp)
    return inputs.io_buffer + held


MAX_OPEN_PER_THREAD = 512
"""``read.datasets.MAX_OPEN_PER_THREAD`` (not imported: that module imports rasterio lazily but lives with the
reader): a thread keeps at most this many datasets open."""

DEFAULT_ASSUMED_ITEMS = 100
"""Time-axis length assumed by the static check when ``max_items`` is not set (a warning says so)."""

NARROWEST_LOAD = "uint8"
"""The narrowest dtype an asset can load in: ``validate`` refuses only what is over budget even then."""

MIN_CHUNK_BYTES = 16 * 10**6
MIN_TASKS_FOR_LARGE_JOB = 1_000
MAX_TASKS = 6_000_000
"""Tasks above which a job is refused for what the client holds per chunk. The writers submit in bounded batches
(``write.submit``: the scheduler holds the tasks of a few blocks per worker thread) and the graph's layers make a
task only when a batch asks for it (``layers.TaskLayer``), but the client still holds, per chunk, the plan's chunk
index (the items of every chunk) and, with ``output.tiling``, every tile's window of the Dataset:
:data:`GRAPH_BYTES_PER_TASK` each, so ~1.8 GB here."""
GRAPH_BYTES_PER_TASK = 300
"""Client memory per counted task (:func:`estimate_task_count`), measured 2026-12-03 with ``tracemalloc``
(benchmarks/bounded_submit.py ``--graph``): the graph itself is O(1) per chunk since the lazy layers (1.3 B per
added chunk, was 8.2 KB at 292 items per task); what remains is the chunk index, ~5 B per (item, chunk) pair (~110 B
per task at 292 items per chunk), and the tiles' windows, ~440 B per chunk and band (~150 B per task); rounded
up."""
LARGE_JOB_BYTES = 10 * 10**9
SMALL_JOB_BYTES = 10**9
"""Below this much input, small chunks cost little; the small-chunk warning would only be noise."""
ORDER_STATISTICS = ("median", "quantile")
CACHE_CANDIDATES = (64 * 10**6, 32 * 10**6, 16 * 10**6)
"""``gdal_cachemax`` values the fix solver tries (GDAL's cache cannot help a job that reads every block once)."""


@dataclass(frozen=True)
class PipelineShape:
    """What the expressions imply for memory, independent of sizes."""

    assets_loaded: tuple[str, ...]
    """Assets read by the mask or the bands (unused assets are not loaded)."""
    mask: Expression | None
    masked_assets: tuple[str, ...]
    """Assets the bands read, which get a NaN-masked copy."""
    bands: tuple[tuple[str, Expression], ...]
    reduce_method: str | None
    n_quantiles: int
    has_period: bool = False
    mosaics_passes: bool = False
    """``source.group_by: solar_day``: a second item's assets are alive while a pass is mosaicked."""
    output_format: str = "zarr"
    zarr_format: int = 2
    zarr_shards: int | None = None
    """``output.zarr_shards`` (None: :func:`rasterflow.write.shards.shard_side`'s default)."""
    stored_dtype: str | None = None
    """``output.encoding.dtype`` (None: the working dtype)."""
    tile_size: int | None = None
    """``output.tiling.size``: each tile is its own store, sharded on its own grid."""
    cog_blocksize: int = 512
    """``output.cog.blocksize``."""
    cog_resampling: str = "average"
    """``output.cog.overview_resampling``: with ``average`` the workers can compress the COG's tiles
    (:mod:`rasterflow.write.cogtiles`)."""
    compression: str = "zstd"
    """``output.compression``."""


def pipeline_shape(spec: Any) -> PipelineShape:
    """Analyse a validated spec's expressions (names read, live arrays)."""
    assets = list(spec.source.assets)
    mask = parse_expression(spec.mask, assets, what="mask") if spec.mask else None
    known = list(assets)
    bands = []
    for name, text in spec.bands.items():
        bands.append((name, parse_expression(text, known, what=f"band {name!r}")))
        known.append(name)
    read_by_bands = set().union(*(expr.names for _, expr in bands)) & set(assets)
    read = read_by_bands | (mask.names if mask else set())
    return PipelineShape(
        assets_loaded=tuple(a for a in assets if a in read),
        mask=mask,
        masked_assets=tuple(a for a in assets if a in read_by_bands) if mask else (),
        bands=tuple(bands),
        reduce_method=spec.reduce.method if spec.reduce else None,
        n_quantiles=len(spec.reduce.quantiles) if spec.reduce else 0,
        has_period=bool(spec.reduce and spec.reduce.period),
        mosaics_passes=spec.source.group_by == "solar_day",
        output_format=getattr(spec.output, "resolved_format", "zarr"),
        zarr_format=spec.output.zarr_format,
        zarr_shards=spec.output.zarr_shards,
        stored_dtype=spec.output.encoding.dtype,
        tile_size=spec.output.tiling.size if spec.output.tiling else None,
        cog_blocksize=spec.output.cog.blocksize,
        cog_resampling=spec.output.cog.overview_resampling,
        compression=spec.output.compression,
    )


@dataclass(frozen=True)
class ChunkDepth:
    """What the tasks of one spatial chunk size hold at most (``plan.ChunkIndex.depth``): the items whose files
    meet one chunk, the output dates they make, and the files it reads."""

    items: int
    dates: int
    files: int


@dataclass(frozen=True)
class BudgetInputs:
    """Sizes the model needs, resolved from the spec (statically) or from a search and the real cluster."""

    grid_shape: tuple[int, int]
    """(height, width) of the output grid in pixels."""
    n_time: int
    """Items on the time axis (every item a task reads)."""
    time_source: str
    """Where n_time came from: "max_items", "assumed" or "search"."""
    chunk_time: int
    chunk_y: int
    chunk_x: int
    dtype: str
    threads_per_worker: int
    n_workers: int
    memory_limit: int
    limit_source: str
    """Where the limit came from: "spec", "auto (local machine)" or the scheduler address."""
    gdal_cachemax: int
    max_fraction: float
    source_tile: tuple[int, int] | None = None
    """Internal tile (block) shape of the source COGs, when known (``plan`` reads one file's header)."""
    load_dtype: str | None = None
    """dtype every asset is loaded in when ``asset_dtypes`` is not given; None = the working dtype (the static
    check's assumption: it cannot know the items)."""
    asset_dtypes: tuple[str, ...] = ()
    """Per loaded asset, the dtype ``read.read_planes`` loads it in (from the items); empty = ``load_dtype``."""
    coverage_assets: int = 0
    """Loaded integer assets without one nodata value: each also gets a boolean coverage plane per item."""
    n_dates: int | None = None
    """Output dates (passes with ``group_by: solar_day``); None = one per item."""
    group_dates: int | None = None
    """Dates in the largest period (``reduce.period``); None = every date."""
    machine_memory: int | None = None
    """RAM of the machine this process (the client) runs on; None = not checked."""
    workers_local: bool = True
    """The workers run on this machine (a LocalCluster): their limits come out of the same RAM as the client."""
    load_assumed: bool = False
    """True for the static check: the load dtype is an assumption (the items are not read)."""
    source_codec: str | None = None
    """The sources' codec (the first loaded asset's header: ``ZSTD``, ``DEFLATE``...); None = unknown."""
    one_process: bool = False
    """The run is one process (``cluster.processes: false``): the worker is the client's own process."""
    client_cores: int = 1
    """Cores of the machine the client runs on: the COG copy's threads (``write.cog.copy_threads``)."""
    writer_cachemax: int | None = None
    """GDAL's cache of the COG writer in the client; None = ``gdal_cachemax`` (``cluster.gdal_cachemax: auto``
    gives the writer :data:`DEFAULT_GDAL_CACHEMAX` whatever the workers get)."""

    @property
    def client_cachemax(self) -> int:
        return self.gdal_cachemax if self.writer_cachemax is None else self.writer_cachemax
    files_per_chunk: int | None = None
    """Most source files (item × asset) whose footprint meets one spatial chunk; None = every file (the reader opens
    only the files that cover the chunk: with tiles side by side, a chunk meets one tile's items)."""
    local_files: bool = False
    """Every source file is local (:data:`LOCAL_FILE_BYTES` per open file, else :data:`OPEN_FILE_BYTES`)."""
    tile_decoder: bool = False
    """Local files of the sources' codec and tiling are decoded by :mod:`rasterflow.read.tiles`, not GDAL
    (:data:`TILE_DECODED_FILE_BYTES` per open local file)."""
    warped: bool = False
    """Some source is read through a warp (another CRS or resolution than the grid): GDAL's cache then holds the
    warped blocks beside the source blocks they come from, and fills to ``gdal_cachemax``."""
    remote_fetch: bool = False
    """Every source file is remote and read by the concurrent reader (:mod:`rasterflow.read.prefetch`): no GDAL
    dataset is opened, the task holds compressed tiles instead (:func:`remote_io_bytes`)."""
    io_buffer: int = 32 * 1024 * 1024
    """``source.io.buffer``: compressed bytes one task fetches ahead of its decoder."""
    source_bytes_per_pixel: float | None = None
    """Compressed bytes per source pixel (the probed file's tiles); None = the load dtype's size (no compression)."""
    chunk_depth: Callable[[int, int], ChunkDepth] | None = field(default=None, compare=False, repr=False)
    """``(chunk_y, chunk_x) -> ChunkDepth`` from the plan's chunk index: a task holds only the items whose files
    meet its chunk; None = every item meets every chunk (the static check)."""

    def depth(self) -> ChunkDepth | None:
        """The chunk index's :class:`ChunkDepth` at these chunks, at most ``n_time`` items and ``dates`` dates."""
        if self.chunk_depth is None:
            return None
        found = self.chunk_depth(*self.chunk_yx)
        return ChunkDepth(max(1, min(found.items, self.n_time)), max(1, min(found.dates, self.dates)), found.files)

    @property
    def items_per_task(self) -> int:
        """Items on a task's time axis: its time slice, at most the most items meeting one chunk."""
        depth = self.depth()
        return self.time_per_chunk if depth is None else min(self.time_per_chunk, depth.items)

    @property
    def time_per_chunk(self) -> int:
        return self.n_time if self.chunk_time == -1 else min(self.chunk_time, self.n_time)

    @property
    def chunk_yx(self) -> tuple[int, int]:
        height, width = self.grid_shape
        return (height if self.chunk_y == -1 else min(self.chunk_y, height),
                width if self.chunk_x == -1 else min(self.chunk_x, width))

    @property
    def plane_bytes(self) -> int:
        """One asset's full chunk over a task's items (:attr:`items_per_task`) in the working dtype: the model's
        unit."""
        cy, cx = self.chunk_yx
        return self.items_per_task * cy * cx * dtype_itemsize(self.dtype)

    @property
    def n_spatial_chunks(self) -> int:
        cy, cx = self.chunk_yx
        return math.ceil(self.grid_shape[0] / cy) * math.ceil(self.grid_shape[1] / cx)

    @property
    def n_time_chunks(self) -> int:
        return math.ceil(self.n_time / self.time_per_chunk)

    @property
    def dates(self) -> int:
        return self.n_dates if self.n_dates is not None else self.n_time

    def load_itemsizes(self, n_loaded: int) -> tuple[int, ...]:
        if self.asset_dtypes:
            return tuple(dtype_itemsize(d) for d in self.asset_dtypes)
        return (dtype_itemsize(self.load_dtype or self.dtype),) * n_loaded

    def load_words(self, n_loaded: int) -> str:
        if self.asset_dtypes:
            return ", ".join(self.asset_dtypes)
        return self.load_dtype or self.dtype


@dataclass(frozen=True)
class TaskShape:
    """One kind of root task: its window and how many items and output dates it holds; ``count`` of them."""

    rows: int
    cols: int
    items: int
    dates: int
    count: int

    @property
    def pixels(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class StageEstimate:
    """Peak memory of one (the largest) task while a stage runs."""

    stage: str
    planes: float
    bytes_per_task: int
    detail: str


@dataclass(frozen=True)
class Fix:
    """A change to the spec that makes the job fit, with the peak it gives (verified by re-estimating)."""

    description: str
    patch: dict
    peak_per_worker: int
    fraction: float


@dataclass(frozen=True)
class BudgetReport:
    """The verdict of the check."""

    inputs: BudgetInputs
    stages: tuple[StageEstimate, ...]
    peak_task_bytes: int
    peak_per_worker: int
    allowed_bytes: int
    fraction_of_limit: float
    task_count: int
    refusals: tuple[str, ...]
    warnings: tuple[str, ...]
    open_files_bytes: int = 0
    """Per thread: the source files it keeps open for the job."""
    fixes: tuple[Fix, ...] = field(default=())
    path: str = "fused"
    """The code path the graph runs: "fused", "tree" or "series"."""
    concurrent_tasks: int = 1
    """Tasks one worker runs at once: its threads, capped by the tasks it gets."""
    tasks_bytes: int = 0
    """The working sets of the ``concurrent_tasks`` largest tasks, summed (what the threads hold at once)."""
    gdal_cache_bytes: int = 0
    """GDAL's block cache as it fills: ``gdal_cachemax`` capped by the bytes a worker decodes."""
    client_peak: int = 0
    """The client process: baseline, finished blocks in flight and its GDAL cache (COG output)."""
    assumptions: tuple[str, ...] = ()
    """What the static check assumed (load dtype, time length), for the verdict line."""
    held_bytes: int = 0
    """Included in ``tasks_bytes``: blocks and partials a worker holds between tasks (tree and series paths)."""
    io_bytes: int = 0
    """The concurrent remote reader in one worker: its client and, per running task, the compressed tiles fetched
    ahead and held (:func:`remote_io_bytes`)."""
    sub_block: tuple[int, int] = (0, 0)
    """``(rows, cols)`` of the sub-blocks a fused task reduces its chunk in (:func:`sub_block`); ``(0, 0)`` = the
    whole chunk at once."""
    baseline_bytes: int = 0
    """The worker's memory apart from tasks, files and cache (:func:`baseline_bytes`)."""

    @property
    def ok(self) -> bool:
        return not self.refusals

    @property
    def worst_stage(self) -> StageEstimate:
        return max(self.stages, key=lambda s: s.bytes_per_task)

    @property
    def formula(self) -> str:
        n = self.concurrent_tasks
        threads = self.inputs.threads_per_worker
        capped = "" if n == threads else f" (of {threads} threads: the worker gets {n} task{'s' if n != 1 else ''})"
        return (
            f"{format_bytes(self.tasks_bytes)} for {n} task{'s' if n != 1 else ''} at once{capped} "
            f"(largest {format_bytes(self.peak_task_bytes)}, {self.worst_stage.stage}"
            + (f"; {format_bytes(self.held_bytes)} held between tasks" if self.held_bytes else "") + ") + "
            f"{format_bytes(self.open_files_bytes)} open files × {n} + {format_bytes(self.gdal_cache_bytes)} GDAL cache"
            + (f" + {format_bytes(self.io_bytes)} remote reads (client, tiles fetched ahead and held)"
               if self.io_bytes else "")
            + f" + {format_bytes(self.baseline_bytes)} baseline = {format_bytes(self.peak_per_worker)}"
        )

    @property
    def summary(self) -> str:
        limit = self.inputs.memory_limit
        return (
            f"{format_bytes(self.peak_per_worker)} of {format_bytes(limit)}, {self.fraction_of_limit:.0%}; "
            f"{self.task_count:,} tasks"
        )

    def to_dict(self) -> dict:
        """A JSON-ready view; its keys are a stable contract for ``plan --json``."""
        inputs = self.inputs
        cy, cx = inputs.chunk_yx
        return {
            "ok": self.ok,
            "grid_shape": list(inputs.grid_shape),
            "n_time": inputs.n_time,
            "time_source": inputs.time_source,
            "chunk_shape": {"time": inputs.time_per_chunk, "y": cy, "x": cx},
            "dtype": inputs.dtype,
            "plane_bytes": inputs.plane_bytes,
            "task_count": self.task_count,
            "stages": [
                {"stage": s.stage, "live_planes": s.planes, "bytes_per_task": s.bytes_per_task, "detail": s.detail}
                for s in self.stages
            ],
            "worst_stage": self.worst_stage.stage,
            "peak_task_bytes": self.peak_task_bytes,
            "open_files_bytes": self.open_files_bytes,
            "threads_per_worker": inputs.threads_per_worker,
            "n_workers": inputs.n_workers,
            "gdal_cachemax": inputs.gdal_cachemax,
            "baseline_bytes": self.baseline_bytes,
            "peak_per_worker": self.peak_per_worker,
            "memory_limit": inputs.memory_limit,
            "limit_source": inputs.limit_source,
            "max_fraction": inputs.max_fraction,
            "fraction_of_limit": round(self.fraction_of_limit, 4),
            "refusals": list(self.refusals),
            "warnings": list(self.warnings),
            "fixes": [
                {"description": f.description, "patch": f.patch, "peak_per_worker": f.peak_per_worker,
                 "fraction_of_limit": round(f.fraction, 4)}
                for f in self.fixes
            ],
            "path": self.path,
            "concurrent_tasks": self.concurrent_tasks,
            "tasks_bytes": self.tasks_bytes,
            "gdal_cache_bytes": self.gdal_cache_bytes,
            "client_peak": self.client_peak,
            "assumptions": list(self.assumptions),
            "held_bytes": self.held_bytes,
            "sub_block": list(self.sub_block),
        }


# --------------------------------------------------------------------------------------------------------------------
# the code path and its tasks


def code_path(shape: PipelineShape, inputs: BudgetInputs) -> str:
    """What ``graph.build_dataset`` runs: "fused", "tree" or "series" (see the module docstring)."""
    if shape.reduce_method is None:
        return "series"
    if shape.mosaics_passes or inputs.time_per_chunk >= inputs.n_time:
        return "fused"
    return "tree"


def _sizes(total: int, chunk: int) -> list[tuple[int, int]]:
    """(size, how many) of the chunks along an axis of ``total`` cut every ``chunk``."""
    full, rest = divmod(total, chunk)
    out = [(chunk, full)] if full else []
    if rest:
        out.append((rest, 1))
    return out


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
        times = [(min(size, most), size, n) for size, n in _sizes(inputs.n_time, inputs.time_per_chunk)]
    out = [TaskShape(rows, cols, items, dates, ny * nx * nt)
           for rows, ny in _sizes(height, cy) for cols, nx in _sizes(width, cx) for items, dates, nt in times]
    return tuple(sorted(out, key=lambda t: (t.pixels * t.items, t.pixels), reverse=True))


def strip_target(inputs: BudgetInputs) -> int:
    """The per-task working set above which a fused task reduces its chunk in sub-blocks: :data:`STRIP_TARGET_BYTES`,
    or :data:`ONE_PROCESS_STRIP_TARGET_BYTES` when the run is one process."""
    return ONE_PROCESS_STRIP_TARGET_BYTES if inputs.one_process else STRIP_TARGET_BYTES


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
    if _block_peak(shape, inputs, task, (task.rows, task.cols)) <= strip_target(inputs):
        return (0, 0)
    tile_y, tile_x = inputs.source_tile or (0, 0)
    widths = [task.cols]
    if tile_x and tile_x < task.cols:
        widths += [k * tile_x for k in range(task.cols // tile_x, 0, -1) if k * tile_x < task.cols]
    for cols in widths:
        rows = _fitting_rows(shape, inputs, task, cols)
        if tile_y and rows >= tile_y:
            rows = min(task.rows, rows // tile_y * tile_y)
            return (0, 0) if (rows, cols) == (task.rows, task.cols) else (rows, cols)
    cols = tile_x if tile_x and tile_x < task.cols else task.cols
    rows = _fitting_rows(shape, inputs, task, cols)
    rows = max(MIN_STRIP_ROWS, math.ceil(task.rows / math.ceil(task.rows / rows)))  # equal strips
    if tile_y and rows < tile_y:
        rows = math.ceil(tile_y / math.ceil(tile_y / rows))  # equal strips of a tile
    return (0, 0) if (rows, cols) == (task.rows, task.cols) or rows >= task.rows and cols >= task.cols \
        else (min(rows, task.rows), cols)


def _fitting_rows(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape, cols: int) -> int:
    """The most rows of a ``cols``-wide sub-block whose working set, apart from the whole chunk's result, fits
    :func:`strip_target` (at least :data:`MIN_STRIP_ROWS`): the working set is affine in the rows."""
    result = _n_groups(shape, inputs) * max(1, shape.n_quantiles) * len(shape.bands) * task.pixels \
        * dtype_itemsize(inputs.dtype)
    at_one = _block_peak(shape, inputs, task, (1, cols)) - result
    per_row = max(1, _block_peak(shape, inputs, task, (2, cols)) - result - at_one)
    return int(max(MIN_STRIP_ROWS, min(task.rows, (strip_target(inputs) - (at_one - per_row)) // per_row)))


def _block_peak(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape, block: tuple[int, int]) -> int:
    """The reduction's peak with sub-blocks of ``block`` (the write that follows does not depend on them)."""
    return max(nbytes for _, nbytes, _ in _task_stages(shape, inputs, task, block, writes=False))


def _task_stages(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape,
                 block: tuple[int, int] | None = None, *, writes: bool = True) -> list[tuple[str, int, str]]:
    """(stage, bytes, detail) of one task of ``task``'s shape, following :mod:`rasterflow.kernels`.

    The reader hands the kernel one item at a time (``read.item_stream``): the loaded block is one item's raw values,
    the series the only date-deep arrays. A fused task reduces its chunk in sub-blocks of ``block`` (default: the
    job's :func:`sub_block`); then the whole chunk's result is alive beside the sub-block's working set. The fused
    path's last stage (``writes``) is the write of the chunk's result that follows on the same worker
    (:func:`write_extra_bytes`)."""
    path = code_path(shape, inputs)
    if block is None:
        block = sub_block(shape, inputs) if path == "fused" else (0, 0)
    rows, cols = min(block[0], task.rows), min(block[1], task.cols)
    striped = path == "fused" and rows > 0 and (rows, cols) != (task.rows, task.cols)
    part = dataclasses.replace(task, rows=rows, cols=cols) if striped else task
    w = dtype_itemsize(inputs.dtype)
    n_loaded, n_bands = len(shape.assets_loaded), len(shape.bands)
    one = part.pixels * w  # one date of one band in the working dtype, over the strip
    series = part.dates * one  # one band's output series
    load_px = sum(inputs.load_itemsizes(n_loaded)) + inputs.coverage_assets  # bytes per item and pixel
    item = LOAD_COPIES * part.pixels * load_px  # one item's raw planes
    n_groups = _n_groups(shape, inputs)  # every period of the output, whatever dates the chunk has
    result = n_groups * max(1, shape.n_quantiles) * n_bands * w
    chunk_result = result * task.pixels if striped else 0  # filled strip by strip
    held = item + n_bands * series + chunk_result
    strip_words = f" (a {rows}×{cols} sub-block of the {task.rows}×{task.cols} chunk)" if striped else ""
    stages: list[tuple[str, int, str]] = []
    cover = f" + {inputs.coverage_assets} coverage plane(s)" if inputs.coverage_assets else ""
    stages.append(("load", item, f"{n_loaded} asset(s) of one item loaded as "
                                  f"{inputs.load_words(n_loaded)}{cover}{strip_words}; {task.items} items one by one"))
    # kernels._band_series, one date at a time: the mask evaluated on the raw values (kernels._drop_addend), the
    # assets the bands read as working planes (kernels.working_assets: an asset only the mask reads stays raw), then
    # each band written into its series. Counted as the kernel allocates (2026-12-06): a 3072² series task of 3
    # dates measured 313 MB above its start, the model then said 387 MB (6 one-date planes for the mask where the
    # kernel has 4: red, nir and NDVI's two temporaries); a float64 one-date series 1.41x its measured worker peak.
    n_work = len(_working_assets(shape))
    # with solar_day the next tile's raw planes, its working planes and the filled/take masks
    mosaic = n_work + 0.5 if shape.mosaics_passes else 0
    next_tile = item if shape.mosaics_passes else 0
    cover_plane = 1 if inputs.coverage_assets else 0  # a coverage plane's NaN addend while it is added
    base = f"one item + {n_bands} band series of {part.dates} dates" + (" + the chunk's result" if striped else "")
    if shape.mask is not None:
        temps = mosaic + _mask_planes(shape, inputs, n_work) + cover_plane
        stages.append(("mask", int(held + next_tile + temps * one),
                       f"{base} + {temps:g} one-date planes (the mask and the {n_work} working asset(s))"))
    for name, expr in shape.bands:
        own = band_temporaries(expr)
        temps = n_work + mosaic + own
        stages.append((f"band {name}", int(held + next_tile + temps * one),
                       f"{base} + {temps:g} one-date planes ({n_work} working asset(s), {own} temporaries of "
                       f"{expr.live_arrays} live)"))
    if path == "fused":
        method = shape.reduce_method or ""
        group = min(inputs.group_dates or part.dates, part.dates) * one
        extra = REDUCTION_EXTRA_PLANES[method] * group + (group if shape.has_period else 0)
        out = result * part.pixels
        stages.append((f"reduce {method}", int(held + extra + out),
                       f"{base} + {REDUCTION_EXTRA_PLANES[method]:g} working copies"
                       + (" of a period's subset + the subset" if shape.has_period else "")
                       + f" + the {n_groups}×{max(1, shape.n_quantiles)}×{n_bands} result{strip_words}"))
        if writes:
            # the write task of one of the chunk's entries, its whole result alive (graph._reduced_band selects views)
            extra_write, words = write_extra_bytes(shape, inputs, task.pixels)
            stages.append(("write", int(result * task.pixels + extra_write),
                           f"the chunk's {n_groups}×{max(1, shape.n_quantiles)}×{n_bands} result + {words}"))
        return stages
    # tree and series: band_block copies the series into one (date, band, y, x) block, one band at a time
    stages.append(("bands out", int(held + series), f"{base} + the first band of the (date, band) block"))
    block_out = n_bands * series
    if path == "tree":
        method = shape.reduce_method or ""
        partial = _tree_partial(shape, inputs, task)
        subset = series if shape.has_period else 0  # the period's dates are taken (copied) from the block
        copies = TREE_CHUNK_EXTRA_PLANES[method](w) if method in TREE_CHUNK_EXTRA_PLANES else \
            REDUCTION_EXTRA_PLANES.get(method, 1.0)
        extra = copies * series + (STD_PARTIAL_PLANES * one if method == "std" else 0)
        stages.append((f"reduce {method} (tree)", int(block_out + subset + extra + partial),
                       f"the {n_bands}-band block + {copies:g} working copies of a band"
                       + (" + the period's subset" if shape.has_period else "") + " + its partial"))
        fan_in = min(inputs.n_time_chunks, TREE_SPLIT_EVERY)
        stages.append((f"combine {method} (tree)", int(fan_in * partial + 2 * one),
                       f"{fan_in} partials concatenated + the result"))
    else:
        extra_write, words = write_extra_bytes(shape, inputs, task.pixels)
        if shape.output_format == "cog" and extra_write > 2 * one:
            stages.append(("write dates", int(block_out + extra_write), f"the {n_bands}-band block + {words}"))
        else:
            stages.append(("write dates", int(block_out + 2 * one),
                           f"the {n_bands}-band block while its dates are encoded and written"))
    return stages


def write_extra_bytes(shape: PipelineShape, inputs: BudgetInputs, pixels: int) -> tuple[int, str]:
    """What the worker task that writes one entry (a period, quantile or date: every band) of a finished block of
    ``pixels`` holds beside that block, and its words: for Zarr, per band, zarr's chunk buffer and the compressed
    chunk (:data:`ZARR_WRITE_PLANES`; plus the cast copy and NaN mask when the writer encodes); for a COG the bands
    stacked into one block (``write.cog._cube``), and, when the workers make the tiles (:func:`cog_tile_layout`), the
    compressed tiles (:data:`COG_TILE_BYTES_RATIO`) and the first overview's halving (:data:`HALVE_BYTES_PER_PIXEL`).
    0 for Zarr v3 shards (:func:`held_for_shards` counts the shard's write)."""
    w = dtype_itemsize(inputs.dtype)
    stored_w = dtype_itemsize(shape.stored_dtype or inputs.dtype)
    n_bands = len(shape.bands)
    if shape.output_format == "cog":
        stacked = n_bands * pixels * w
        layout = cog_tile_layout(shape, inputs)
        if layout is None:
            return stacked, "the bands stacked into the block the client writes"
        tiles = COG_TILE_BYTES_RATIO * n_bands * pixels * stored_w
        halve = n_bands * pixels * (HALVE_BYTES_PER_PIXEL + w / 4) if len(layout.levels) > 1 else 0
        return int(stacked + tiles + halve), "the bands stacked, their COG tiles and the first overview's halving"
    if shards_per_side(shape, inputs) > 1:
        return 0, "its shard (held for shards)"
    encoded = shape.stored_dtype is not None and shape.stored_dtype != inputs.dtype
    encode = (ENCODE_PLANES * stored_w + 1) * pixels if encoded else 0
    return int(ZARR_WRITE_PLANES * pixels * stored_w + encode), \
        f"{ZARR_WRITE_PLANES:g} one-band planes (zarr's chunk buffer, the compressed chunk)" \
        + (" + the encoded copy and its mask" if encoded else "")


def units_in_flight(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Spatial chunks one worker has in flight at once under the writer's cap (``write.submit.run_units``): the cap
    counts blocks (:data:`IN_FLIGHT_PER_THREAD` per thread of the cluster for Zarr, whose unit is every band and
    entry of a chunk; :data:`TILES_INFLIGHT_PER_THREAD` or :data:`COG_INFLIGHT_PER_THREAD` for a COG, whose unit is
    up to :data:`COG_BATCH_BYTES` of a chunk's files), shared by the workers, at most the chunks a worker gets."""
    threads = max(1, inputs.n_workers * inputs.threads_per_worker)
    n_bands = max(1, len(shape.bands))
    if shape.output_format == "cog":
        per_thread = TILES_INFLIGHT_PER_THREAD if cog_tile_layout(shape, inputs) is not None \
            else COG_INFLIGHT_PER_THREAD
        cap = max(2, per_thread * threads)
        cy, cx = inputs.chunk_yx
        unit_bytes = dtype_itemsize(inputs.dtype) * n_bands * cy * cx
        keys = min(max(1, min(cap, COG_BATCH_BYTES // max(1, unit_bytes))), _cog_files(shape, inputs))
    else:
        cap = max(2, IN_FLIGHT_PER_THREAD * threads)
        keys = n_bands * _n_groups(shape, inputs) * max(1, shape.n_quantiles)
    units = max(1, cap // keys)
    workers = max(1, inputs.n_workers)
    return max(1, min(math.ceil(inputs.n_spatial_chunks / workers), math.ceil(units / workers)))


TABLE_DTYPES = frozenset({"uint8", "int8", "uint16", "int16"})
"""``lookup.TABLE_DTYPES`` (not imported: ``rasterflow.lookup`` loads NumPy): raw dtypes the kernel converts and masks
with a per-value table."""


def _working_assets(shape: PipelineShape) -> tuple[str, ...]:
    """``kernels.working_assets``: the loaded assets the bands read (each becomes a working-dtype plane per date)."""
    read = set().union(*(expr.names for _, expr in shape.bands)) if shape.bands else set()
    return tuple(a for a in shape.assets_loaded if a in read) or shape.assets_loaded


def _asset_dtype(shape: PipelineShape, inputs: BudgetInputs, asset: str) -> str:
    if inputs.asset_dtypes and asset in shape.assets_loaded:
        return inputs.asset_dtypes[shape.assets_loaded.index(asset)]
    return inputs.load_dtype or inputs.dtype


def _mask_planes(shape: PipelineShape, inputs: BudgetInputs, n_work: int) -> float:
    """One-date planes alive while the mask is applied (``kernels._drop_addend`` and ``_masked_assets``): a mask of
    one small-integer asset is a per-value table gathered with each working asset (no plane of its own); any other
    is evaluated on the raw values (its temporaries, counted as working planes) into one NaN-addend plane that stays
    while the working assets are made."""
    mask = shape.mask
    assert mask is not None
    if len(mask.names) == 1 and _asset_dtype(shape, inputs, next(iter(mask.names))) in TABLE_DTYPES:
        return n_work
    return max(mask.live_arrays - len(mask.names) + 1, n_work + 1)


def band_temporaries(expr: Expression) -> int:
    """One-date planes a band's evaluation allocates at its peak, its inputs not counted (``kernels._band_series``).

    ``live_arrays`` counts the result as a new array; the kernel has an outermost ``+ - * /`` write into the band's
    series (``Expression.evaluate(out=)``), so then the peak is the larger of the operands' own peaks (the left
    result alive while the right is evaluated) and the two results, not the whole count. Measured 2026-12-06
    (a one-off probe: one 1536² item of tests/test_budget_measured.py's scenes): NDVI 2.0 planes (live 5 - 2 inputs - 1 into the
    series), EVI 4.0 (its peak is inside the denominator: live 7 - 3 inputs, none saved); a whole 3072² series
    task of 3 dates 313 MB above its start, 311 MB predicted."""
    return _band_temporaries(expr.text, tuple(sorted(expr.names)), expr.live_arrays)


@functools.lru_cache(maxsize=256)
def _band_temporaries(text: str, names: tuple[str, ...], live: int) -> int:
    import ast

    whole = max(0, live - len(names))
    try:
        body = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:  # pragma: no cover - a parsed Expression's text parses
        return whole
    if not (isinstance(body, ast.BinOp) and isinstance(body.op, (ast.Add, ast.Sub, ast.Mult, ast.Div))):
        return whole

    def operand(node: ast.expr) -> tuple[int, int]:
        """(own peak, 1 when its result is a new array) of an operand."""
        if isinstance(node, ast.Name) or not any(isinstance(n, ast.Name) for n in ast.walk(node)):
            return 0, 0  # an input the caller holds, or a constant (a scalar)
        sub = parse_expression(ast.unparse(node), list(names), what="band")
        return max(0, sub.live_arrays - len(sub.names)), 1

    (left_peak, left), (right_peak, right) = operand(body.left), operand(body.right)
    return min(whole, max(left_peak, left + right_peak, left + right))


def _tree_partial(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape) -> float:
    """One band's partial of one time chunk (median/quantile are refused here: counted as a copy of the series)."""
    w = dtype_itemsize(inputs.dtype)
    one = task.pixels * w
    method = shape.reduce_method or ""
    return TREE_PARTIAL_PLANES[method](w) * one if method in TREE_PARTIAL_PLANES else task.dates * one


def held_between_tasks(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """What a worker holds besides its running tasks (measured, budget_accuracy.py): on the tree and series paths a
    finished ``(date, band)`` block still being reduced or written while the next task runs (one per thread), and on the
    tree path the partials of a spatial chunk waiting for its last time chunk (every time chunk, every band); on the
    fused path the copy that splits a result with periods or quantiles into its chunks."""
    path = code_path(shape, inputs)
    task = task_shapes(shape, inputs)[0]
    one = task.pixels * dtype_itemsize(inputs.dtype)
    n_groups = _n_groups(shape, inputs)
    if path == "fused":
        # a finished chunk's result waits for its write tasks while the thread that made it runs its next reduction:
        # the worker starts the next task it has before the scheduler has sent the writes. With a COG whose tiles
        # the workers make, a 3-band 1536² median on 2 threads held 4 results (managed 113 MB) while two tile tasks
        # ran, 414 MB measured where 283 MB was predicted without them (2026-12-06); so one waiting result per
        # running task, as far as the writer's cap leaves other chunks in flight (Zarr with 3 bands on 2 threads:
        # 2 chunks in flight, none waiting). A result with periods or quantiles stays whole while its entries are
        # written (graph._reduced_band selects views of it): at least one is held.
        entries = n_groups * max(1, shape.n_quantiles)
        running = concurrent_tasks(shape, inputs)
        waiting = min(running, max(0, units_in_flight(shape, inputs) - running))
        if entries > 1 and math.ceil(inputs.n_spatial_chunks / max(1, inputs.n_workers)) > running:
            waiting = max(waiting, 1)
        return waiting * entries * len(shape.bands) * one
    # each thread's finished block waits while the thread runs its next task: its reduction or write is queued
    # behind the next band tasks (counting it for one thread only left the two-thread tree rows of
    # budget_accuracy.py at 0.81-0.88 of their measured peak with either decoder, 2026-12-04). The running tasks are
    # counted elsewhere as the largest; a held block is another task's, so the blocks are those of the tasks ranked
    # after them: on a grid of equal chunks the same size, on a grid of a few uneven ones smaller (a 1400² grid of
    # 1024² chunks on two threads was predicted 1.60x its measured peak counting the largest block twice more).
    running = concurrent_tasks(shape, inputs)
    itemsize = dtype_itemsize(inputs.dtype)
    one_chunk_each = math.ceil(inputs.n_spatial_chunks / max(1, inputs.n_workers)) <= running
    if path == "tree" and one_chunk_each:
        # each thread reduces the time chunks of its own spatial chunk: beside the running task only the partials of
        # that chunk's other time chunks (its own partial is counted in its stage), no block of another chunk.
        # Measured 2026-12-06 (tests/test_budget_measured.py, one 3072² chunk, one thread): mean over 2 and 3 time
        # chunks 509 MB and 545 MB where a block and every partial held predicted 788 MB and 741 MB (1.55, 1.36);
        # std over 2 time chunks 893 MB (predicted 1118 MB, now 854 MB)
        partials = inputs.n_time_chunks - 1
        if shape.has_period:
            group = min(inputs.group_dates or task.dates, inputs.n_time)
            partials = n_groups * min(inputs.n_time_chunks, math.ceil(group / inputs.time_per_chunk) + 1) - 1
        return int(max(0, partials) * len(shape.bands) * _tree_partial(shape, inputs, task))
    # On the series path the writer's unit is a spatial chunk (every date of it): the blocks of all its time chunks
    # wait for their writes, queued behind its band tasks (2 threads, 4 time chunks of 1024²: 271 MB measured where
    # one held block per thread predicted 242 MB, 0.89, budget_accuracy.py row 19, 2026-12-06); at most two per
    # thread (what was measured: deeper units, more time chunks than that, were not)
    n_held = max(running, min(inputs.n_time_chunks, 2 * running)) if path == "series" else running
    held = sum(len(shape.bands) * other.dates * other.pixels * itemsize
               for other in _largest(shape, inputs, running + n_held)[running:])
    if path == "tree":
        # the partials of every time chunk; with periods a time chunk holds a partial per period it touches
        # (tasks.tree_partials; the period's dates are copied out of the block inside the task, counted there)
        partials = inputs.n_time_chunks
        if shape.has_period:
            group = min(inputs.group_dates or task.dates, inputs.n_time)
            partials = n_groups * min(inputs.n_time_chunks, math.ceil(group / inputs.time_per_chunk) + 1)
        held += int(partials * len(shape.bands) * _tree_partial(shape, inputs, task))
    return held


def shards_per_side(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Chunks per side of the Zarr v3 shards the writer makes (1: no shards, also for COG and Zarr format 2)."""
    if shape.output_format != "zarr" or shape.zarr_format != 3:
        return 1
    itemsize = dtype_itemsize(shape.stored_dtype or inputs.dtype)
    return shard_side(inputs.chunk_yx, itemsize, _store_blocks(shape, inputs), shape.zarr_shards)


def _store_blocks(shape: PipelineShape, inputs: BudgetInputs) -> tuple[int, int]:
    """Chunks per axis of one output store: the grid's, or a tile's with ``output.tiling``."""
    cy, cx = inputs.chunk_yx
    height, width = inputs.grid_shape
    if shape.tile_size:  # each tile is a store of its own
        height, width = min(height, shape.tile_size), min(width, shape.tile_size)
    return math.ceil(height / cy), math.ceil(width / cx)


def held_for_shards(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """What a worker holds for Zarr v3 shards (``write.zarr``): a shard is written whole by one task, so every chunk
    result of the shard is held until its last chunk is done and then gathered on the writing worker, which encodes
    it into one stored-dtype array and zarr's encoded shard beside it. The writer keeps
    :data:`~rasterflow.write.shards.SHARDS_IN_FLIGHT` shard positions in flight: the writing worker holds one whole
    shard's results and its share of the next ones'. 0 without shards."""
    side = shards_per_side(shape, inputs)
    if side <= 1:
        return 0
    cy, cx = inputs.chunk_yx
    rows, cols = _store_blocks(shape, inputs)
    blocks = min(side, rows) * min(side, cols)
    entries = _n_groups(shape, inputs) * max(1, shape.n_quantiles)
    chunk_result = entries * len(shape.bands) * cy * cx * dtype_itemsize(inputs.dtype)
    shard_results = blocks * chunk_result
    others = (SHARDS_IN_FLIGHT - 1) * shard_results / max(1, inputs.n_workers)
    stored = blocks * cy * cx * dtype_itemsize(shape.stored_dtype or inputs.dtype)  # one band's shard, one entry
    return int(shard_results + others + 2 * stored)


def _n_groups(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Periods in the result (1 without ``reduce.period``). Without the dates (the static check) one period of every
    date: the period's subset is then counted at its largest, the small per-period results at one."""
    if not shape.has_period:
        return 1
    return math.ceil(inputs.dates / max(1, inputs.group_dates or inputs.dates))


def stage_estimates(shape: PipelineShape, inputs: BudgetInputs) -> tuple[StageEstimate, ...]:
    """Per-stage peak of the largest task (planes: ``t × y × x`` of the full chunk in the working dtype)."""
    largest = task_shapes(shape, inputs)[0]
    unit = max(1, inputs.plane_bytes)
    return tuple(StageEstimate(stage, round(nbytes / unit, 3), nbytes, detail)
                 for stage, nbytes, detail in _task_stages(shape, inputs, largest))


def concurrent_tasks(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Tasks a worker runs at once: its threads, but never more than the root tasks it gets (n_tasks / n_workers)."""
    n_tasks = sum(t.count for t in task_shapes(shape, inputs))
    return max(1, min(inputs.threads_per_worker, math.ceil(n_tasks / max(1, inputs.n_workers))))


def _largest(shape: PipelineShape, inputs: BudgetInputs, n: int) -> list[TaskShape]:
    """The ``n`` largest root tasks (one entry per task)."""
    out: list[TaskShape] = []
    for task in task_shapes(shape, inputs):
        out.extend([task] * min(task.count, n - len(out)))
        if len(out) >= n:
            break
    return out


def _task_peak(shape: PipelineShape, inputs: BudgetInputs, task: TaskShape) -> int:
    return max(nbytes for _, nbytes, _ in _task_stages(shape, inputs, task))


def _concurrent_bytes(shape: PipelineShape, inputs: BudgetInputs, tasks: list[TaskShape]) -> int:
    """The working sets of tasks running at once: the largest at its peak, each other one with its block and
    :data:`CONCURRENT_RAMP` of the rest (a task's series fill date by date, so concurrent peaks do not coincide);
    with sub-blocks, every one at its peak (:data:`SUB_BLOCK_RAMP`)."""
    ramp = SUB_BLOCK_RAMP if sub_block(shape, inputs) != (0, 0) else CONCURRENT_RAMP
    total = 0
    for index, task in enumerate(tasks):
        stages = _task_stages(shape, inputs, task)
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
    for task in _largest(shape, inputs, share):
        rows, cols = task.rows, task.cols
        if inputs.source_tile:
            tile_y, tile_x = inputs.source_tile
            rows, cols = math.ceil(rows / tile_y) * tile_y, math.ceil(cols / tile_x) * tile_x
        decoded += task.items * rows * cols * file_px
        if decoded >= inputs.gdal_cachemax:
            return inputs.gdal_cachemax
    return min(inputs.gdal_cachemax, decoded)


def _cog_files(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """COG files one write makes: one per period and quantile, or per date without a reduction."""
    if not shape.reduce_method:
        return inputs.dates
    files = max(1, shape.n_quantiles if shape.reduce_method == "quantile" else 1)
    if shape.has_period:
        files *= math.ceil(inputs.dates / max(1, inputs.group_dates or inputs.dates))
    return files


def _axis_chunks(size: int, chunk: int) -> tuple[int, ...]:
    return tuple(length for length, count in _sizes(size, chunk) for _ in range(count))


def cog_tile_layout(shape: PipelineShape, inputs: BudgetInputs) -> Any:
    """The :class:`~rasterflow.write.cogtiles.TileLayout` of a COG whose tiles the workers compress, or None when
    GDAL's COG driver copies the finished file instead (``write.cog`` makes the same choice)."""
    if shape.output_format != "cog":
        return None
    from rasterflow.write import cogtiles
    from rasterflow.write.common import Encoding, compression_name

    if not cogtiles.assembly_enabled():
        return None
    height, width = inputs.grid_shape
    if shape.tile_size:
        height, width = min(height, shape.tile_size), min(width, shape.tile_size)
    cy, cx = inputs.chunk_yx
    try:
        stored = Encoding(dtype=shape.stored_dtype).resolved(inputs.dtype)
    except ValueError:
        return None
    codec = compression_name(shape.compression, "cog")  # the writer's own choice of codec
    return cogtiles.fast_layout(
        height=height, width=width, chunks=(_axis_chunks(height, cy), _axis_chunks(width, cx)),
        blocksize=shape.cog_blocksize, resampling=shape.cog_resampling, computed_dtype=inputs.dtype, stored=stored,
        band_names=tuple(name for name, _ in shape.bands), compression=codec, predictor="auto",
        files=_cog_files(shape, inputs))


def client_peak_bytes(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """The client process: its baseline; with COG output, when the workers compress the tiles
    (:func:`cog_tile_layout`), the finished blocks of tiles it receives (:data:`CLIENT_RESULTS_RECEIVED`, each
    :data:`CLIENT_RESULT_COPIES` times), the small overview levels it keeps per file, GDAL's cache while it makes the
    header and the last levels' halving; else the finished blocks in flight (``write.cog``: 2 per thread of the
    cluster, each all bands of one chunk), then its GDAL cache while GDAL's COG driver copies each file, capped by
    the output's size, and that copy's row buffers."""
    if shape.output_format != "cog":
        return CLIENT_BASELINE_BYTES
    w = dtype_itemsize(inputs.dtype)
    cy, cx = inputs.chunk_yx
    n_bands = len(shape.bands)
    n_files = _cog_files(shape, inputs)
    units = n_files * inputs.n_spatial_chunks
    layout = cog_tile_layout(shape, inputs)
    if layout is not None:
        from rasterflow.write.cogassembly import TEMPLATE_CACHEMAX
        from rasterflow.write.cogtiles import client_levels_bytes

        # the blocks in flight are computed on the workers; the client fetches the finished ones one by one and
        # spools each at once: it holds CLIENT_RESULTS_RECEIVED of them, each twice while unpacked (compressed tiles
        # are no larger than the block)
        received = min(units, CLIENT_RESULTS_RECEIVED) * CLIENT_RESULT_COPIES * n_bands * cy * cx \
            * dtype_itemsize(shape.stored_dtype or inputs.dtype)
        levels = client_levels_bytes(layout, w)
        return (CLIENT_BASELINE_BYTES + COG_WRITER_BYTES + received + (n_files + ASSEMBLY_LEVEL_COPIES) * levels
                + TEMPLATE_CACHEMAX)
    inflight = min(units, max(2, COG_INFLIGHT_PER_THREAD * inputs.n_workers * inputs.threads_per_worker))
    streaming = inflight * n_bands * cy * cx * w
    output = n_files * n_bands * inputs.grid_shape[0] * inputs.grid_shape[1] * w
    # first the blocks stream in, then (the blocks gone) each file is copied into a COG: the larger of the two
    return (CLIENT_BASELINE_BYTES + COG_WRITER_BYTES + max(streaming, cog_copy_bytes(shape, inputs))
            + min(inputs.client_cachemax, output))


def cog_copy_bytes(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """What GDAL's COG driver holds besides its cache while it copies one output file into a COG with overviews:
    :data:`COG_COPY_ROWS` rows, and :data:`COG_COPY_ROWS_PER_THREAD` more per further thread, of the file's width
    (a tile's with ``output.tiling``) × bands × stored itemsize."""
    width = inputs.grid_shape[1] if not shape.tile_size else min(inputs.grid_shape[1], shape.tile_size)
    row = width * len(shape.bands) * dtype_itemsize(shape.stored_dtype or inputs.dtype)
    return int(row * (COG_COPY_ROWS + COG_COPY_ROWS_PER_THREAD * (max(1, inputs.client_cores) - 1)))


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


# --------------------------------------------------------------------------------------------------------------------
# the verdict


def estimate(shape: PipelineShape, inputs: BudgetInputs, *, on_exceed: str = "error") -> BudgetReport:
    """Estimate the peak per worker (and of the client) and decide. Fixes are solved separately (:func:`solve_fixes`)."""
    stages = stage_estimates(shape, inputs)
    peak_task = max(s.bytes_per_task for s in stages)
    n = concurrent_tasks(shape, inputs)
    tasks_bytes = _concurrent_bytes(shape, inputs, _largest(shape, inputs, n))
    held = held_between_tasks(shape, inputs) + held_for_shards(shape, inputs)
    tasks_bytes += held
    files = open_files_bytes(shape, inputs)
    cache = gdal_cache_bytes(shape, inputs)
    baseline = baseline_bytes(inputs)
    io = remote_io_bytes(shape, inputs) * n + (REMOTE_CLIENT_BYTES if inputs.remote_fetch else 0)
    peak_worker = tasks_bytes + files * n + cache + io + baseline
    client = client_peak_bytes(shape, inputs)
    allowed = int(inputs.max_fraction * inputs.memory_limit)
    refusals: list[str] = []
    warnings: list[str] = []
    if peak_worker > allowed:
        worst = max(stages, key=lambda s: s.bytes_per_task)
        text = (
            f"over budget: the {worst.stage} stage holds {worst.planes:g} planes of "
            f"{_plane_words(inputs)} = {format_bytes(worst.bytes_per_task)} per task; "
            f"{format_bytes(tasks_bytes)} for {n} task(s) at once + {format_bytes(files)} open files × {n} + "
            f"{format_bytes(cache)} GDAL cache + "
            + (f"{format_bytes(io)} remote reads (source.io.buffer and the tiles the tasks hold) + " if io else "")
            + f"{format_bytes(baseline)} baseline = "
            f"{format_bytes(peak_worker)} per worker, more than {inputs.max_fraction:g} × "
            f"{format_bytes(inputs.memory_limit)} limit = {format_bytes(allowed)}"
        )
        (warnings if on_exceed == "warn" else refusals).append(text)
    client_text = _client_check(shape, inputs, client)
    if client_text:
        (warnings if on_exceed == "warn" else refusals).append(client_text)
    if shape.reduce_method in ORDER_STATISTICS and code_path(shape, inputs) == "tree":
        refusals.append(
            f"chunks.time={inputs.chunk_time} splits time into {inputs.n_time_chunks} chunks, but a {shape.reduce_method} "
            f"over time needs every date of a pixel in one task: Dask would shuffle the chunks between workers and "
            f"hold them while they move; set chunks.time: -1"
        )
    tasks = estimate_task_count(inputs, len(shape.bands), shape.reduce_method, shape)
    total_bytes = inputs.plane_bytes * inputs.n_spatial_chunks * inputs.n_time_chunks * max(1, len(shape.assets_loaded))
    if tasks > MAX_TASKS:
        refusals.append(
            # not the scheduler: it holds only the blocks in flight (bounded submission, write.submit), and the
            # graph's tasks are made per batch (layers.TaskLayer); the plan's per-chunk tables are what grows
            f"about {tasks:,} tasks: above ~{MAX_TASKS:,} what this process holds per chunk (the plan's chunk "
            f"index, the tiles' windows) would take ~{format_bytes(tasks * GRAPH_BYTES_PER_TASK)} "
            f"(~{format_bytes(GRAPH_BYTES_PER_TASK)} per task; the scheduler holds only the blocks in flight); "
            f"use larger chunks ({_chunk_for_tasks(inputs, shape, 200_000)} keeps it near 200,000)"
        )
    elif (tasks < MIN_TASKS_FOR_LARGE_JOB and total_bytes > LARGE_JOB_BYTES
          and inputs.n_spatial_chunks < 2 * inputs.n_workers * inputs.threads_per_worker):
        # Few tasks only hurt when there are fewer chunks than threads to keep busy.
        warnings.append(
            f"only {inputs.n_spatial_chunks} spatial chunks for {inputs.n_workers * inputs.threads_per_worker} "
            f"threads and {format_bytes(total_bytes)} of input: the cluster will be under-used; smaller chunks "
            f"({_chunk_for_tasks(inputs, shape, 2_000)}) give about 2,000 tasks"
        )
    if inputs.plane_bytes < MIN_CHUNK_BYTES and inputs.n_spatial_chunks > 1 and total_bytes > SMALL_JOB_BYTES:
        warnings.append(
            f"chunks are small ({format_bytes(inputs.plane_bytes)} per asset); aim for 100-500 MB in the working dtype: "
            f"per-task overhead will dominate"
        )
    misaligned = _tile_misalignment(inputs)
    if misaligned:
        warnings.append(misaligned)
    if inputs.dtype == "float64":
        warnings.append("grid.dtype float64 doubles every array compared to float32; reflectance needs only float32")
    if inputs.time_source == "assumed":
        warnings.append(
            f"source.stac.max_items is not set, so the static check assumes {inputs.n_time} dates; "
            f"set max_items to bound the time axis (plan counts the real items)"
        )
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
        assumptions=_assumptions(inputs),
        held_bytes=held,
        sub_block=sub_block(shape, inputs),
        io_bytes=io,
    )


def _client_check(shape: PipelineShape, inputs: BudgetInputs, client: int) -> str | None:
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


def _assumptions(inputs: BudgetInputs) -> tuple[str, ...]:
    out = []
    if inputs.load_assumed:
        out.append(f"assets loaded as {inputs.load_dtype or inputs.dtype} (the items' data types are not read)")
    if inputs.time_source == "max_items":
        out.append(f"{inputs.n_time} items on the time axis, from source.stac.max_items")
    elif inputs.time_source == "assumed":
        out.append(f"{inputs.n_time} items on the time axis (assumed: source.stac.max_items is not set)")
    return tuple(out)


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
    note = (f"over budget if the assets load as {inputs.load_dtype or inputs.dtype} "
            f"({format_bytes(report.peak_per_worker)} per worker, {report.fraction_of_limit:.0%} of the limit); "
            f"within it if they load as {NARROWEST_LOAD} ({format_bytes(narrow.peak_per_worker)}): `rasterflow plan` "
            f"reads the items' data types and decides")
    return dataclasses.replace(report, refusals=tuple(r for r in report.refusals if r not in over),
                               warnings=(note,) + report.warnings)


def verdict_line(report: BudgetReport) -> str:
    """``validate``'s words after "ok": the peak and what it assumed."""
    text = f"peak per worker {report.summary}"
    if report.assumptions:
        text += "; assumes " + " and ".join(report.assumptions)
    return text


def _tile_misalignment(inputs: BudgetInputs) -> str | None:
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


def _plane_words(inputs: BudgetInputs) -> str:
    cy, cx = inputs.chunk_yx
    return f"{inputs.items_per_task}×{cy}×{cx} {inputs.dtype} ({format_bytes(inputs.plane_bytes)})"


def _chunk_for_tasks(inputs: BudgetInputs, shape: PipelineShape, target: int) -> str:
    per_spatial = max(1, estimate_task_count(inputs, len(shape.bands), shape.reduce_method, shape) - 10) \
        / inputs.n_spatial_chunks
    pixels = inputs.grid_shape[0] * inputs.grid_shape[1]
    side = int(math.sqrt(pixels * per_spatial / target))
    side = max(256, (side // 256) * 256)
    return f"chunks.y = chunks.x = {side}"


# --------------------------------------------------------------------------------------------------------------------
# fixes


def solve_fixes(shape: PipelineShape, inputs: BudgetInputs) -> tuple[Fix, ...]:
    """Solve for changes that make a refused job pass, and verify each one by estimating again.

    Candidates: time whole (for order statistics), the largest square spatial chunk that fits (a multiple of the
    source COG tiles when known, else of 256), a smaller GDAL cache, fewer threads per worker (with the checked
    worker count and limit pinned), float32, and a lower ``max_items``. Patches name only what changes; print them
    with :func:`fix_text`, which merges the spec's own values in.
    """
    fixes: list[Fix] = []
    base = inputs
    base_patch: dict = {}
    if shape.reduce_method in ORDER_STATISTICS and code_path(shape, inputs) == "tree":
        base = dataclasses.replace(inputs, chunk_time=-1)
        base_patch = {"chunks": {"time": -1}}

    def passes(candidate: BudgetInputs) -> BudgetReport | None:
        report = estimate(shape, candidate)
        return report if report.ok else None

    def add(description: str, candidate: BudgetInputs, patch: dict) -> bool:
        report = passes(candidate)
        if report is not None:
            fixes.append(Fix(description, patch, report.peak_per_worker, report.fraction_of_limit))
        return report is not None

    if base is not inputs:
        add("keep time whole: chunks.time: -1", base, base_patch)
    side = _largest_square_chunk(shape, base)
    if side is not None:
        cy, cx = base.chunk_yx
        if side < max(cy, cx):
            candidate = dataclasses.replace(base, chunk_y=side, chunk_x=side)
            patch = _merge(base_patch, {"chunks": {"y": side, "x": side}})
            aligned = f", a multiple of the {base.source_tile[0]}-px source tiles" if base.source_tile else ""
            add(f"chunks.y = chunks.x = {side} (the largest square chunk that fits{aligned})", candidate, patch)
    cache = gdal_cache_bytes(shape, base)
    for value in CACHE_CANDIDATES:
        if value < cache:
            candidate = dataclasses.replace(base, gdal_cachemax=value)
            if add(f"cluster.gdal_cachemax: {value // 10**6}MB (every block is read once: a cache cannot help)",
                   candidate, _merge(base_patch, {"cluster": {"gdal_cachemax": f"{value // 10**6}MB"}})):
                break
    for threads in range(base.threads_per_worker - 1, 0, -1):
        candidate = dataclasses.replace(base, threads_per_worker=threads)
        if passes(candidate):
            # the layout it was checked on: with n_workers or memory_limit "auto", fewer threads would start
            # more workers with less memory each
            add(f"cluster.threads_per_worker: {threads} (each thread holds a working set; {base.n_workers} "
                f"worker(s) × {format_bytes(base.memory_limit)} kept)", candidate,
                _merge(base_patch, {"cluster": {"threads_per_worker": threads, "n_workers": base.n_workers,
                                                "memory_limit": base.memory_limit}}))
            break
    if base.dtype == "float64":
        add("grid.dtype: float32 (halves every array)", dataclasses.replace(base, dtype="float32"),
            _merge(base_patch, {"grid": {"dtype": "float32"}}))
    if not fixes:
        # no single change fits: a smaller GDAL cache together with a smaller chunk or fewer threads
        cached = next((dataclasses.replace(base, gdal_cachemax=v) for v in CACHE_CANDIDATES if v < cache), None)
        if cached is not None:
            cache_patch = _merge(base_patch, {"cluster": {"gdal_cachemax": f"{cached.gdal_cachemax // 10**6}MB"}})
            side = _largest_square_chunk(shape, cached)
            if side is not None and side < max(cached.chunk_yx):
                add(f"cluster.gdal_cachemax: {cached.gdal_cachemax // 10**6}MB and chunks.y = chunks.x = {side}",
                    dataclasses.replace(cached, chunk_y=side, chunk_x=side),
                    _merge(cache_patch, {"chunks": {"y": side, "x": side}}))
            for threads in range(cached.threads_per_worker - 1, 0, -1):
                if add(f"cluster.gdal_cachemax: {cached.gdal_cachemax // 10**6}MB and threads_per_worker: {threads} "
                       f"({base.n_workers} worker(s) × {format_bytes(base.memory_limit)} kept)",
                       dataclasses.replace(cached, threads_per_worker=threads),
                       _merge(cache_patch, {"cluster": {"threads_per_worker": threads, "n_workers": base.n_workers,
                                                        "memory_limit": base.memory_limit}})):
                    break
    if not fixes and base.n_time > 1:
        items = _largest_passing(lambda n: passes(_with_items(base, n)) is not None, base.n_time - 1)
        if items:
            add(f"source.stac.max_items: {items} (a shorter time axis: the result then covers {items} items, not "
                f"{base.n_time})", _with_items(base, items),
                _merge(base_patch, {"source": {"stac": {"max_items": items}}}))
    return tuple(fixes)


def _with_items(inputs: BudgetInputs, n: int) -> BudgetInputs:
    dates = None if inputs.n_dates is None else max(1, min(inputs.n_dates, n))
    group = None if inputs.group_dates is None else max(1, min(inputs.group_dates, n))
    return dataclasses.replace(inputs, n_time=n, n_dates=dates, group_dates=group,
                               time_source="max_items" if inputs.time_source != "search" else "search")


def _largest_passing(fits: Any, upper: int) -> int | None:
    """The largest n in 1..upper with fits(n) (fits is monotone: fewer items never need more memory)."""
    if upper < 1 or not fits(1):
        return None
    low, high = 1, upper
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _largest_square_chunk(shape: PipelineShape, inputs: BudgetInputs) -> int | None:
    """The largest square spatial chunk whose estimate passes: a multiple of the source tiles when known (reads then
    decode no neighbour's tiles), else of 256 (64 below 256)."""
    height, width = inputs.grid_shape
    tile = max(inputs.source_tile) if inputs.source_tile else None
    cy, cx = inputs.chunk_yx
    if tile:
        steps = [tile]
    else:
        steps = [256, 64]
    for step in steps:
        side = (max(cy, cx) // step) * step
        if side >= max(cy, cx):
            side -= step
        while side >= step:
            candidate = dataclasses.replace(inputs, chunk_y=side, chunk_x=side)
            if estimate(shape, candidate).ok:
                return side
            side -= step
    return None


def _merge(a: dict, b: dict) -> dict:
    out = {k: _merge(v, {}) if isinstance(v, dict) else v for k, v in a.items()}
    for key, value in b.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = _merge(value, {}) if isinstance(value, dict) else value
    return out


def complete_patch(spec: Any, patch: dict) -> dict:
    """The sections a fix touches, complete: the spec's own values (as written, defaults left to the defaults) with
    the fix merged in, so that pasting a section over the old one changes nothing else."""
    data = spec.model_dump(mode="json", exclude_unset=True, by_alias=True)
    return {section: _merge(data.get(section) or {}, values) for section, values in patch.items()}


def fix_text(spec: Any, fix: Fix) -> str:
    """A fix as YAML ready to paste: complete sections (see :func:`complete_patch`)."""
    import yaml

    return yaml.safe_dump(complete_patch(spec, fix.patch), sort_keys=False, default_flow_style=None).rstrip()


def with_fixes(report: BudgetReport, shape: PipelineShape) -> BudgetReport:
    """The report with its fixes solved (only when it refuses)."""
    if report.ok:
        return report
    return dataclasses_replace(report, fixes=solve_fixes(shape, report.inputs))


def dataclasses_replace(obj, **changes):
    return dataclasses.replace(obj, **changes)


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

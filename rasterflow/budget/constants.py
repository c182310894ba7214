"""The budget's measured constants, each with where and how it was measured (its docstring or the comment above it).

A constant here is a number read off a real run or a probe (``benchmarks/budget_accuracy.py``,
``tests/test_budget_measured.py``, the benchmarks in ``benchmarks/README.md``), or a mirror of a number another module
owns (its name says which); the arithmetic that uses them is in :mod:`rasterflow.paths` (each code path's
cost), :mod:`rasterflow.budget.paths` and :mod:`rasterflow.budget.workers`. Importing this module imports nothing heavy (``validate`` stays light).
"""

from __future__ import annotations

from typing import Any, Mapping

from rasterflow.gdalenv import VSI_CACHE_SIZE  # stdlib only: validate stays light
from rasterflow.units import parse_bytes

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
    # geomad's work arrays per slab of 256² pixels (rasterflow.geomedian.geomedian_work_bytes: 4TBP + 5TP + ...)
    # are at most the stack of a slab: counted as half of one band's series of a 1024² chunk (B <= 8 bands)
    "geomedian": 0.5,
    # the date index and one gathered plane per band (rasterflow.bestpixel.best_work_bytes: ~21 B per pixel)
    "best": 0.1,
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


GDAL_LIBRARY_BYTES = 46 * 10**6
"""What rasterio (GDAL, PROJ and its Python modules) adds to a worker process once imported and used: 40 MB measured
2026-12-06 in an idle process (rasterio 1.4.4 / GDAL 3.10, with rasterflow's reader, NumPy and zarr imported: +33 MB
for the import, +7 MB for the first Env); when the workers stopped loading it, the measured peaks of
``budget_accuracy.py``'s 39 rows fell by a median of **46 MB** (25-75 MB, one row 151 MB; its opened datasets and
their state come on top of the import), so 46 MB. :data:`WORKER_BASELINE_BYTES` includes it; a worker whose every
read rasterflow decodes itself (local tiled COGs and remote COGs on the output grid, ``BudgetInputs.tile_decoder``
without a warp) and which masks no area of interest never imports rasterio, and its baseline is this much lower
(:func:`rasterflow.budget.baseline_bytes`; measured drops of the per-worker peak 35-99 MB on
tests/test_budget_measured.py's rows, 50 MB on the 4096² x 24 geomedian). A task that still needs GDAL (a sparse
tile) brings it back."""


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


QUEUED_UNITS = 1
"""``write.submit.QUEUED_UNITS``: chunks the Zarr writer keeps in flight beyond one per thread of the cluster on the
fused path, whatever the cap on blocks says (not with shards)."""


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


REMOTE_HEADER_BYTES = 20 * 10**3
"""A remote file's parsed header in the concurrent reader's per-process cache (tile offsets and byte counts, 16
bytes a tile: 8 kB for a 10980² COG in 512² tiles, plus tifffile's objects)."""


REMOTE_CLIENT_BYTES = 25 * 10**6
"""The concurrent reader's client in a process: aiohttp and obstore imported (10.5 MB), the event loop's thread,
its connections and their buffers (13 MB with 64 range requests of 64 kB answered), measured 2026-12-05."""


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


TABLE_DTYPES = frozenset({"uint8", "int8", "uint16", "int16"})
"""``lookup.TABLE_DTYPES`` (not imported: ``rasterflow.lookup`` loads NumPy): raw dtypes the kernel converts and masks
with a per-value table."""


COG_RESULT_WAITING = 0.5
"""The share of the finished chunk results that :func:`rasterflow.budget.fused_held` counts waiting for their COG
tile tasks at the next tasks' peak: whether a result still waits when the next reduction peaks is timing (the
client sends its tile tasks as soon as it learns the result is done). Measured 2026-12-06 on
tests/test_budget_measured.py's "cog client" case (3 bands of 1536² on 2 threads, workers without GDAL): 302 MB
in both runs of one clean-clone CI, where every waiting result counted predicted 395 MB (1.31); other runs of the
same day measured 304 MB and more (earlier CI runs in the band) and ~330 MB (1.21 with a 6 MB higher baseline).
Counting none predicts 338 MB, half 367 MB: within 0.90-1.30 for any peak from 283 to 408 MB."""

"""A resolved job as frozen values: the grid, the chunks, the worker layout, the items and the budget verdict.

Planning is pure: no network and no Dask here. The catalog search and the cluster query happen in
``rasterflow.commands``, which hands their results (item dicts, a :class:`~rasterflow.sizing.WorkerLayout`) to
:func:`make_plan`. The :class:`JobPlan` holds every decision a run executes (the code path and its sub-blocks, the
read policy, the output and the cluster): nothing after :func:`make_plan` reads the spec.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Container, Mapping, Sequence

from rasterflow import budget
from rasterflow.errors import SpecError, SpecIssue
from rasterflow.kernels import Composite, Program, absent_is_nan, solar_day_steps
from rasterflow.read import tiles
from rasterflow.read.policy import ReadPolicy, io_concurrency, policy_from_spec
from rasterflow.read.remote import is_remote
from rasterflow.sources import FileHeader, MissingAsset, SourceTable, gc_paused, missing_assets, resolve_sources
from rasterflow.sizing import WorkerLayout, local_machine, size_local_run
from rasterflow.units import format_bytes

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.spec import LoadedSpec, Spec
    from rasterflow.statcost import StatisticsCost

__all__ = [
    "ChunkIndex", "ClusterPlan", "EncodingPlan", "GridPlan", "OutputPlan", "cluster_plan", "output_plan", "JobCost", "JobPlan", "build_chunk_index", "tiles_on_chunk_edges", "job_cost", "resolve_grid", "local_layout", "budget_inputs", "make_plan", "static_check",
    "check_items", "output_dates",
]


@dataclass(frozen=True)
class GridPlan:
    """The output grid: CRS, pixel-aligned bounds and shape."""

    crs: str
    resolution: float
    bounds: tuple[float, float, float, float]
    """minx, miny, maxx, maxy in ``crs``; a multiple of the resolution from the origin when derived from the bbox."""
    shape: tuple[int, int]
    """(height, width) in pixels."""

    @property
    def epsg(self) -> int:
        return int(self.crs.split(":")[1])

    @property
    def transform(self) -> tuple[float, float, float, float, float, float]:
        """GDAL-style affine (a, b, c, d, e, f) of the north-up grid, as ``affine.Affine`` takes it."""
        minx, _, _, maxy = self.bounds
        return (self.resolution, 0.0, minx, 0.0, -self.resolution, maxy)


DECODED_PX_PER_SECOND_PER_THREAD = 59e6
"""End-to-end rate of one worker thread in decoded source pixels per second (read + decode + mask + bands + median
+ Zarr write), from benchmarks/scaling.py (2026-12-03, 2 workers × 1 thread, masked NDVI median over 8 dates of
3 assets): each added 2048² × 8 dates × 3 assets (101 M decoded pixels) added 0.85 s of compute+write on 2
threads. The marginal rate: the fixed part (imports, first file opens, the Zarr template) is
:data:`STARTUP_SECONDS`."""

STARTUP_SECONDS = 3.0
"""Interpreter, imports, cluster start and the first tasks' imports and opens (scaling.py: 2.2 s of process around
the compute stage and ~0.7 s fixed inside it)."""

SCHEDULER_SECONDS_PER_TASK = 1e-3
"""The Dask scheduler's cost per task (the budget's ~1 ms): serial, so a floor on the wall time of many tasks."""


@dataclass(frozen=True)
class EncodingPlan:
    """``output.encoding`` as given (None = the writer's default for the data type)."""

    dtype: str | None = None
    scale: float = 1.0
    offset: float = 0.0
    nodata: float | None = None


@dataclass(frozen=True)
class OutputPlan:
    """What the writers, the STAC documents and the run's description need of ``output`` (and of the search window,
    the period and the mask, which describe the output)."""

    format: str = "zarr"
    """``zarr`` or ``cog`` (given, or from the path's extension)."""
    path: str = ""
    """``output.path`` as written (dated paths are rendered by the run, which knows the time it ends at)."""
    policy: str = "error"
    """The effective ``if_exists``."""
    compression: str = "zstd"
    encoding: EncodingPlan = field(default_factory=EncodingPlan)
    zarr_format: int = 2
    zarr_shards: int | None = None
    cog_blocksize: int = 512
    cog_overview_resampling: str = "average"
    cog_predictor: str = "auto"
    tiling_size: int | None = None
    """``output.tiling.size`` (None: one output)."""
    datetime: str = ""
    """``source.stac.datetime`` as written: the run resolves a relative window against its own clock."""
    period: str | None = None
    """``reduce.period``."""
    mask: str | None = None
    """The mask expression's text."""
    catalog: str = ""
    """``source.stac.catalog`` (a local path made absolute against the spec's folder by the caller)."""
    aoi: str = ""
    """``source.stac.intersects`` as WGS84 GeoJSON text (the STAC Items' geometry is the footprint within it);
    empty without one."""


@dataclass(frozen=True)
class MemoryPlan:
    """Dask's worker memory thresholds (fractions of the memory limit)."""

    target: float = 0.6
    spill: float = 0.7
    pause: float = 0.8
    terminate: float = 0.95


@dataclass(frozen=True)
class ClusterPlan:
    """``cluster`` as plain values, with the attribute names :meth:`rasterflow.cluster.ClusterSettings.from_spec`
    reads (``gdal_cachemax`` here is the spec's; the run uses :attr:`JobPlan.gdal_cachemax`, ``auto`` resolved)."""

    address: str | None = None
    n_workers: int | str = "auto"
    threads_per_worker: int = 1
    memory_limit: int | str = "auto"
    gdal_cachemax: int | str = "auto"
    processes: bool | str = "auto"
    memory: MemoryPlan = field(default_factory=MemoryPlan)


def plan_periods(spec: Spec, times: Sequence[str]) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...],
                                                            tuple[tuple[str, str], ...]]:
    """Every period of the search window (``reduce.period``; an open end taken from the first / last date):
    labels, the output dates in each (empty for a period without one) and each period's ``[start, end)``."""
    from rasterflow.periods import group_by_period, window_periods
    from rasterflow.spec.timeparse import parse_datetime_window

    start, end = parse_datetime_window(spec.source.stac.datetime).resolve()
    first = start if start is not None else (min(times) if times else None)
    last = end if end is not None else (max(times) if times else None)
    periods = window_periods(first, last, spec.reduce_period)

    def naive(value: dt.datetime) -> str:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None).isoformat()

    return (tuple(p.label for p in periods), group_by_period(times, periods),
            tuple((naive(p.start), naive(p.end)) for p in periods))


#: Resampling methods that make values no source pixel has (a class 7 between classes 3 and 10).
INTERPOLATING = ("bilinear", "cubic", "cubic_spline", "lanczos", "average", "q1", "q3", "med")


def _declares_classes(items: Sequence[dict[str, Any]], key: str) -> bool:
    """The asset declares classification:classes (on the asset or its raster:bands / bands), in the first item that
    has it."""
    for item in items:
        asset = (item.get("assets") or {}).get(key)
        if not isinstance(asset, Mapping):
            continue
        entries = [asset, *(asset.get("raster:bands") or []), *(asset.get("bands") or [])]
        return any(isinstance(e, Mapping) and e.get("classification:classes") for e in entries)
    return False


def with_resampling(sources: SourceTable, spec: Spec, items: Sequence[dict[str, Any]],
                    mask_names: Container[str]) -> SourceTable:
    """Each asset's resampling onto the grid: ``source.overrides.<asset>.resampling``; else ``nearest`` for a
    categorical asset (the mask reads it, or it declares ``classification:classes``), whatever
    ``grid.resampling`` says; else ``grid.resampling``. An interpolating method forced on a categorical asset is
    warned about, naming the asset."""
    from dataclasses import replace

    assets, warnings = [], list(sources.warnings)
    for asset in sources.assets:
        override = spec.source.overrides.get(asset.name)
        forced = override.resampling if override is not None else None
        categorical = asset.name in mask_names or _declares_classes(items, asset.key)
        why = "the mask reads it" if asset.name in mask_names else "it declares classification:classes"
        if forced is not None:
            method, note = forced, f"resampling {forced} (source.overrides)"
            if categorical and forced in INTERPOLATING:
                warnings.append(f"asset {asset.name!r} is categorical ({why}) but source.overrides.{asset.name}."
                                f"resampling is {forced}: warped pixels will hold values that are no class "
                                f"(e.g. between two class numbers); use nearest or mode")
        elif categorical:
            method = "nearest"
            note = f"resampling nearest (categorical: {why})" + (
                f", not grid.resampling {spec.grid.resampling}" if spec.grid.resampling != "nearest" else "")
        else:
            method, note = spec.grid.resampling, f"resampling {spec.grid.resampling} (grid.resampling)"
        assets.append(replace(asset, resampling=method, applied=asset.applied + (note,)))
    return replace(sources, assets=tuple(assets), warnings=tuple(warnings))


def plan_aoi(geometry: Mapping[str, Any], grid: GridPlan,
             chunk_yx: tuple[int, int]) -> tuple[str, frozenset[tuple[int, int]]]:
    """The area of interest in the grid's CRS (GeoJSON text, for the tasks to clip with) and the chunks entirely
    outside it (shapely's vectorised intersects over every chunk's box)."""
    import json

    import numpy as np
    import shapely

    from rasterflow.aoi import project

    projected = project(geometry, grid.crs)
    area = shapely.geometry.shape(projected)
    shapely.prepare(area)
    height, width = grid.shape
    cy, cx = chunk_yx
    minx, _, _, maxy = grid.bounds
    res = grid.resolution
    rows = np.arange(0, height, cy)
    cols = np.arange(0, width, cx)
    top, left = np.meshgrid(rows, cols, indexing="ij")
    boxes = shapely.box(minx + left * res, maxy - np.minimum(top + cy, height) * res,
                        minx + np.minimum(left + cx, width) * res, maxy - top * res)
    meets = shapely.intersects(area, boxes)
    outside = frozenset((int(i), int(j)) for i, j in zip(*np.nonzero(~meets)))
    return json.dumps(projected), outside


def composite_of(spec: Spec) -> Composite | None:
    """A geomedian's or best-pixel composite's plan (None for any other reduction): its names from
    :attr:`Spec.composite <rasterflow.spec.models.Spec.composite>`, as the budget reads them."""
    names = spec.composite
    reduce = spec.reduce if not isinstance(spec.reduce, list) else None
    if names is None or reduce is None:
        return None
    if names.method == "geomedian":
        if not names.inputs:
            raise ValueError("a geomedian names its bands (the spec's validation checks it)")
        return Composite("geomedian", names.inputs, names.outputs, mads=reduce.mads, maxiters=reduce.maxiters,
                         eps=float(reduce.eps))
    if reduce.by is None:
        raise ValueError("a best-pixel composite names its band `by` (the spec's validation checks it)")
    return Composite("best", names.inputs, names.outputs, by=reduce.by, order=reduce.order)


def reduce_method(spec: Spec) -> str | None:
    """The method of a single ``reduce``; for a list, its statistics' names joined by ``+``
    (``median+q10+q90+count``: what the output's metadata says was computed); None without a reduction."""
    if spec.reduce is None:
        return None
    if isinstance(spec.reduce, list):
        return "+".join(name for name, _, _ in spec.statistics)
    return spec.reduce.method


def output_plan(spec: Spec) -> OutputPlan:
    """The :class:`OutputPlan` of a validated spec."""
    out = spec.output
    enc = out.encoding
    return OutputPlan(
        format=out.resolved_format, path=out.path, policy=out.policy, compression=out.compression,
        encoding=EncodingPlan(dtype=enc.dtype, scale=float(enc.scale), offset=float(enc.offset),
                              nodata=None if enc.nodata is None else float(enc.nodata)),
        zarr_format=int(out.zarr_format), zarr_shards=out.zarr_shards, cog_blocksize=int(out.cog.blocksize),
        cog_overview_resampling=out.cog.overview_resampling, cog_predictor=out.cog.predictor,
        tiling_size=None if out.tiling is None else int(out.tiling.size),
        datetime=str(spec.source.stac.datetime), period=spec.reduce_period,
        mask=spec.mask, catalog=str(spec.source.stac.catalog),
        aoi=json.dumps(spec.source.stac.intersects) if isinstance(spec.source.stac.intersects, dict) else "")


def cluster_plan(spec: Spec) -> ClusterPlan:
    """The :class:`ClusterPlan` of a validated spec."""
    c = spec.cluster
    m = c.memory
    return ClusterPlan(address=c.address, n_workers=c.n_workers, threads_per_worker=int(c.threads_per_worker),
                       memory_limit=c.memory_limit, gdal_cachemax=c.gdal_cachemax, processes=c.processes,
                       memory=MemoryPlan(target=float(m.target), spill=float(m.spill), pause=float(m.pause),
                                         terminate=float(m.terminate)))


@dataclass(frozen=True)
class RemoteProbe:
    """What ``plan`` measured of a remote source through the concurrent reader (one header request)."""

    round_trip: float
    """Seconds one request of 64 kB took (the first byte's latency, and the connection's set-up)."""
    bytes_per_pixel: float | None
    """The probed file's compressed tiles per pixel."""
    decodable: bool
    """The file is one the concurrent reader decodes itself (else GDAL reads it)."""


@dataclass(frozen=True)
class RemoteCost:
    """The remote reads of a job: requests, compressed bytes, and the time spent waiting on the network."""

    files: int
    requests: int
    """Header reads (one per file and worker process) plus one range request per file, chunk and column of
    sub-blocks and run of adjacent tiles (an estimate from the chunk index and the tiling)."""
    bytes: int
    """Compressed bytes of the tiles the chunks need (the probed file's ratio; uncompressed when unknown)."""
    round_trip: float | None
    concurrency: int
    processes: int
    network_seconds: float
    """``requests x round trip / (concurrency x processes)``: the waiting that overlaps with compute."""

    def summary(self) -> str:
        rtt = f"{self.round_trip * 1000:.0f} ms measured" if self.round_trip else "round trip not measured"
        return (f"~{self.requests:,} requests for {format_bytes(self.bytes)} from {self.files:,} files ({rtt}, "
                f"{self.concurrency} in flight per process x {self.processes}): ~{_duration(self.network_seconds)} "
                "of waiting, overlapped with compute")


@dataclass(frozen=True)
class JobCost:
    """What the tasks read and about how long they take, from the items' declared grids (no file is opened)."""

    files: int
    """Source files (item × asset) whose footprint meets the output grid."""
    pixels_read: int
    """Source pixels inside the grid, summed over those files (what the reads decode, before tile rounding)."""
    bytes_read: int
    """``pixels_read`` in each file's data type (its declared one, else what the asset loads in)."""
    undeclared_files: int
    """Files without ``proj:`` metadata, counted as covering the whole grid at its resolution."""
    spatial_chunks: int
    tasks: int
    threads: int
    """Worker threads of the layout (all read in parallel)."""
    seconds_per_chunk: float
    """The average spatial chunk's decoded pixels at :data:`DECODED_PX_PER_SECOND_PER_THREAD`, on one thread."""
    wall_seconds: float
    """``max(chunks × seconds_per_chunk / threads, tasks × scheduler cost, network) + startup``: an estimate, not a
    promise (other kernels and busy machines are slower)."""
    remote: RemoteCost | None = None
    """The network side, when the files are remote and read by the concurrent reader."""

    def summary(self) -> str:
        return (f"~{_duration(self.wall_seconds)}: {self.spatial_chunks:,} chunks × {self.seconds_per_chunk:.2g} s "
                f"per chunk on {self.threads} thread{'s' if self.threads != 1 else ''} (at "
                f"{DECODED_PX_PER_SECOND_PER_THREAD / 1e6:.0f} Mpx/s decoded per thread, measured) + "
                f"{STARTUP_SECONDS:g} s start-up")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def job_cost(sources: SourceTable, grid: GridPlan, report: budget.BudgetReport, layout: WorkerLayout,
             index: ChunkIndex | None = None, probe: RemoteProbe | None = None,
             concurrency: int = 32) -> JobCost:
    """Bytes the tasks read and the estimated wall time: each file's footprint on the grid (without the resampling
    margin) in its own pixels and data type; the time from the measured per-thread rate; for remote files read by
    the concurrent reader, the requests and the waiting (:class:`RemoteCost`)."""
    from rasterflow.units import dtype_itemsize

    height, width = grid.shape
    load = {a.name: dtype_itemsize(a.load_dtype) for a in sources.assets}
    grid_px_area = grid.resolution * grid.resolution
    files = pixels = nbytes = undeclared = 0
    for item_reads in sources.reads:
        for read in item_reads:
            itemsize = dtype_itemsize(read.data_type) if read.data_type else load[read.name]
            if read.footprint is None or read.transform is None:
                undeclared += 1
                files += 1
                pixels += height * width
                nbytes += height * width * itemsize
                continue
            r0, r1, c0, c1 = read.footprint
            if r0 >= r1 or c0 >= c1:
                continue
            # footprints carry a pixel of margin on each side (footprint_on_grid) unless clipped at the grid's
            # edge: take it off where it was added (a file ending one pixel short of the edge keeps one column)
            rows = r1 - r0 - (r0 > 0) - (r1 < height)
            cols = c1 - c0 - (c0 > 0) - (c1 < width)
            if rows <= 0 or cols <= 0:
                continue
            a, b, _, d, e, _ = read.transform
            src_area = abs(a * e - b * d) or grid_px_area
            # a file's pixels inside the grid, at most its own shape
            n = min(int(round(rows * cols * grid_px_area / src_area)),
                    read.shape[0] * read.shape[1] if read.shape else rows * cols)
            files += 1
            pixels += n
            nbytes += n * itemsize
    inputs = report.inputs
    chunks = inputs.n_spatial_chunks
    threads = max(1, layout.n_workers * layout.threads_per_worker)
    per_chunk = pixels / chunks / DECODED_PX_PER_SECOND_PER_THREAD if chunks else 0.0
    compute = chunks * per_chunk / threads
    remote = remote_cost(sources, report, layout, index, probe, files, pixels, nbytes, concurrency) \
        if inputs.remote_fetch else None
    network = remote.network_seconds if remote is not None else 0.0
    wall = max(compute, report.task_count * SCHEDULER_SECONDS_PER_TASK, network) + STARTUP_SECONDS
    return JobCost(files=files, pixels_read=pixels, bytes_read=nbytes, undeclared_files=undeclared,
                   spatial_chunks=chunks, tasks=report.task_count, threads=threads, seconds_per_chunk=per_chunk,
                   wall_seconds=wall, remote=remote)


def remote_cost(sources: SourceTable, report: budget.BudgetReport, layout: WorkerLayout, index: ChunkIndex | None,
                probe: RemoteProbe | None, files: int, pixels: int, nbytes: int, concurrency: int) -> RemoteCost:
    """The requests of the concurrent reader: a header per file and worker process, then per file and chunk one
    request per row of tiles the chunk spans and per column of sub-blocks (a sub-block column one tile wide fetches
    its tiles apart from its neighbour's); the waiting if ``concurrency`` requests are in flight per process."""
    inputs = report.inputs
    processes = max(1, layout.n_workers if layout.processes else 1)
    tile_y, tile_x = inputs.source_tile or (inputs.chunk_yx[0], inputs.chunk_yx[1])
    chunk_y, chunk_x = inputs.chunk_yx
    rows, cols = report.sub_block
    columns = -(-chunk_x // cols) if cols else 1
    per_file_chunk = (-(-chunk_y // tile_y)) * max(1, min(columns, -(-chunk_x // tile_x)))
    n_assets = max(1, len(sources.assets))
    if index is not None:
        file_chunks = int(index.offsets[-1]) * n_assets
    else:
        file_chunks = files * inputs.n_spatial_chunks
    requests = min(files, files * processes) + file_chunks * per_file_chunk
    compressed = int(pixels * probe.bytes_per_pixel) if probe is not None and probe.bytes_per_pixel else nbytes
    rtt = probe.round_trip if probe is not None else None
    network = requests * (rtt or 0.0) / (max(1, concurrency) * processes)
    return RemoteCost(files=files, requests=requests, bytes=compressed, round_trip=rtt, concurrency=concurrency,
                      processes=processes, network_seconds=network)


MAX_RECOUNT_CHUNKS = 4_000_000
"""Above this many chunks of a candidate size (the budget's fix solver tries smaller chunks), :meth:`ChunkIndex.depth`
bounds the items per chunk from the planned chunks instead of counting them (the count is an array per chunk)."""


@dataclass(frozen=True, eq=False)
class ChunkIndex:
    """Per spatial chunk of the plan, the items (time indices) with a file whose footprint meets it: what its task
    reads (:func:`rasterflow.graph.build_dataset` gives each task only these; the others would only be NaN there).

    Built once per plan from the declared footprints (:attr:`rasterflow.sources.AssetRead.footprint`; a file
    without one meets every chunk) in O(files + chunks touched × items per footprint), a footprint placed once per
    distinct box, one chunk row at a time; no file is opened. Chunk ``(i, j)`` is ``i * n_x + j``; its items are
    ``items[offsets[c]:offsets[c + 1]]``, ascending.
    """

    grid_shape: tuple[int, int]
    chunk_yx: tuple[int, int]
    n_items: int
    n_dates: int
    """Output dates of the plan (passes with ``group_by: solar_day``)."""
    offsets: Any
    """``(n_chunks + 1,)`` int64: where each chunk's items start in :attr:`items`."""
    items: Any
    """int32 item indices, ascending within each chunk."""
    most_items: int
    """The most items meeting one chunk (a task's time depth on the fused path)."""
    most_dates: int
    """The most output dates with an item meeting one chunk (a fused task's series; every date when
    ``dates_kept``)."""
    most_files: int
    """The most files (item × asset) meeting one chunk, a footprint's pixel of margin off (what a task reads, not
    only opens; ``budget.BudgetInputs.files_per_chunk``)."""
    dates_kept: bool
    """True when the band math gives a value other than NaN where no item is (``where(isnan(red), 0, red)``): a
    fused task's periods then take every date, the absent ones at that value (:func:`rasterflow.kernels.reduce_block`),
    so the budget counts every date."""
    item_boxes: Any
    """``(k, 4)`` distinct bounding boxes of the items' files on the grid and ``item_box_counts`` items each: the
    recount at other chunk sizes (an upper bound for an item whose files lie apart)."""
    item_box_counts: Any
    file_boxes: Any
    """``(k, 4)`` distinct file footprints without their margin, and ``file_box_counts`` files each."""
    file_box_counts: Any
    _depths: dict[tuple[int, int], budget.ChunkDepth] = field(default_factory=dict, repr=False)

    @property
    def n_chunks(self) -> tuple[int, int]:
        return _n_chunks(self.grid_shape, self.chunk_yx)

    def items_of(self, i: int, j: int) -> Any:
        """The item indices (ascending int32 array) with a file meeting chunk ``(i, j)``."""
        c = i * self.n_chunks[1] + j
        return self.items[self.offsets[c]:self.offsets[c + 1]]

    def counts(self) -> Any:
        """``(n_y, n_x)`` items meeting each chunk."""
        import numpy as np

        return np.diff(self.offsets).reshape(self.n_chunks)

    def depth(self, chunk_y: int, chunk_x: int) -> budget.ChunkDepth:
        """The most items, dates and files of one chunk at chunk size ``chunk_y`` × ``chunk_x``: exact at the plan's
        size; at another (the budget's fix candidates) counted from the distinct boxes, or bounded from the planned
        chunks when there would be more than :data:`MAX_RECOUNT_CHUNKS`. Dates there are at most the items."""
        key = (chunk_y, chunk_x)
        if key == self.chunk_yx:
            return budget.ChunkDepth(self.most_items, self.most_dates, self.most_files)
        if key not in self._depths:
            ny, nx = _n_chunks(self.grid_shape, key)
            if ny * nx <= MAX_RECOUNT_CHUNKS:
                items = _most_boxes(self.item_boxes, self.item_box_counts, self.grid_shape, key)
                files = _most_boxes(self.file_boxes, self.file_box_counts, self.grid_shape, key)
            else:  # a window of the candidate size spans at most this many planned chunks per axis
                span = (chunk_y + self.chunk_yx[0] - 1) // self.chunk_yx[0] + 1
                span *= (chunk_x + self.chunk_yx[1] - 1) // self.chunk_yx[1] + 1
                items, files = span * self.most_items, span * self.most_files
            items = min(items, self.n_items)
            dates = self.n_dates if self.dates_kept else min(items, self.n_dates)
            self._depths[key] = budget.ChunkDepth(items, dates, files)
        return self._depths[key]


def _n_chunks(grid_shape: tuple[int, int], chunk_yx: tuple[int, int]) -> tuple[int, int]:
    return -(-grid_shape[0] // chunk_yx[0]), -(-grid_shape[1] // chunk_yx[1])


def _most_boxes(boxes: Any, weights: Any, grid_shape: tuple[int, int], chunk_yx: tuple[int, int]) -> int:
    """The largest sum of ``weights`` of the boxes ``(row0, row1, col0, col1)`` meeting one chunk (a difference
    array over the chunks: O(boxes + chunks))."""
    import numpy as np

    ny, nx = _n_chunks(grid_shape, chunk_yx)
    if not len(boxes):
        return 0
    cy, cx = chunk_yx
    a, b = boxes[:, 0] // cy, (boxes[:, 1] - 1) // cy + 1
    c, d = boxes[:, 2] // cx, (boxes[:, 3] - 1) // cx + 1
    diff = np.zeros((ny + 1, nx + 1), dtype=np.int64)
    np.add.at(diff, (a, c), weights)
    np.add.at(diff, (a, d), -weights)
    np.add.at(diff, (b, c), -weights)
    np.add.at(diff, (b, d), weights)
    return int(diff.cumsum(axis=0).cumsum(axis=1)[:ny, :nx].max())


def build_chunk_index(sources: SourceTable, grid_shape: tuple[int, int], chunk_yx: tuple[int, int], *,
                      steps: Sequence[Sequence[int]] = (), dates_kept: bool = False) -> ChunkIndex:
    """The :class:`ChunkIndex` of ``sources`` on a grid of ``grid_shape`` cut in ``chunk_yx`` chunks.

    ``steps``: the items of each output date (``source.group_by: solar_day``), to count the dates of a chunk;
    empty = every item its own date.
    """
    import numpy as np

    height, width = grid_shape
    cy, cx = chunk_yx
    ny, nx = _n_chunks(grid_shape, chunk_yx)
    n_items = len(sources.reads)
    # every file as (item, row0, row1, col0, col1): the footprint test of AssetRead.intersects, None = the grid
    item_of: list[int] = []
    boxes: list[tuple[int, int, int, int]] = []
    for t, item_reads in enumerate(sources.reads):
        for read in item_reads:
            if read is None:
                continue
            item_of.append(t)
            boxes.append((0, height, 0, width) if read.footprint is None else read.footprint)
    files = np.array(boxes, dtype=np.int64).reshape(-1, 4)
    file_items = np.array(item_of, dtype=np.int64)
    meets = (files[:, 0] < files[:, 1]) & (files[:, 2] < files[:, 3])

    # the files a task reads: footprints are rounded out by a pixel, and a file that meets a chunk only with that
    # pixel has just its header read, which costs little next to a file that is read (budget.OPEN_FILE_BYTES)
    shrunk = files[meets].copy()
    tall, wide = shrunk[:, 1] - shrunk[:, 0] > 2, shrunk[:, 3] - shrunk[:, 2] > 2
    shrunk[tall, 0] += 1
    shrunk[tall, 1] -= 1
    shrunk[wide, 2] += 1
    shrunk[wide, 3] -= 1
    file_boxes, file_box_counts = np.unique(shrunk, axis=0, return_counts=True) if len(shrunk) else (shrunk, shrunk[:, 0])

    # (item, box) pairs over the distinct boxes: a tile's files share one box across dates and assets
    files, file_items = files[meets], file_items[meets]
    if len(files):
        box_list, box_of = np.unique(files, axis=0, return_inverse=True)
        box_of = box_of.reshape(-1)
        pairs = _sorted_unique(file_items * len(box_list) + box_of)
        pair_item, pair_box = pairs // len(box_list), pairs % len(box_list)
    else:
        box_list = files
        pair_item = pair_box = np.zeros(0, dtype=np.int64)
    # each item's bounding box (for the recount at other chunk sizes)
    item_bounds = np.tile(np.array([height, -1, width, -1], dtype=np.int64), (n_items, 1))
    placed_boxes = box_list[pair_box]
    for k, extreme in enumerate((np.minimum, np.maximum, np.minimum, np.maximum)):
        extreme.at(item_bounds[:, k], pair_item, placed_boxes[:, k])
    placed = item_bounds[:, 1] > 0
    item_boxes, item_box_counts = (np.unique(item_bounds[placed], axis=0, return_counts=True) if placed.any()
                                   else (item_bounds[:0], item_bounds[:0, 0]))

    step_of = None
    n_dates = n_items
    if steps:
        step_of = np.empty(n_items, dtype=np.int64)
        for d, indices in enumerate(steps):
            step_of[list(indices)] = d
        n_dates = len(steps)

    # per chunk row: the (col, item) pairs of the boxes that meet it, deduplicated and sorted
    row0, row1 = box_list[:, 0] // cy, (box_list[:, 1] - 1) // cy + 1
    col0, col1 = box_list[:, 2] // cx, (box_list[:, 3] - 1) // cx + 1
    order = np.argsort(pair_box, kind="stable")  # the items of each box, ascending, contiguous
    box_items = pair_item[order]
    box_start = np.searchsorted(pair_box[order], np.arange(len(box_list) + 1))
    per_row_items: list[Any] = []
    counts = np.zeros((ny, nx), dtype=np.int64)
    most_dates = 0
    for i in range(ny):
        here = np.flatnonzero((row0 <= i) & (i < row1))
        if not len(here):
            per_row_items.append(np.zeros(0, dtype=np.int32))
            continue
        n_of = box_start[here + 1] - box_start[here]  # items per box
        width_of = col1[here] - col0[here]  # chunks per box in this row
        # every (box, col) of the row, then every item of that box
        box_rep = np.repeat(here, width_of)
        col = np.repeat(col0[here], width_of) + _ramp(width_of)
        reps = np.repeat(n_of, width_of)
        item = box_items[np.repeat(box_start[box_rep], reps) + _ramp(reps)]
        keys = _sorted_unique(np.repeat(col, reps) * n_items + item)
        cols_of = keys // n_items
        counts[i] = np.bincount(cols_of, minlength=nx)
        per_row_items.append((keys % n_items).astype(np.int32))
        if step_of is not None:
            dated = _sorted_unique(cols_of * n_dates + step_of[keys % n_items])
            most_dates = max(most_dates, int(np.bincount(dated // n_dates, minlength=nx).max()))
    offsets = np.zeros(ny * nx + 1, dtype=np.int64)
    np.cumsum(counts.reshape(-1), out=offsets[1:])
    items = np.concatenate(per_row_items) if per_row_items else np.zeros(0, dtype=np.int32)
    most_items = int(counts.max()) if counts.size else 0
    if step_of is None:
        most_dates = most_items
    if dates_kept:
        most_dates = n_dates
    most_files = _most_boxes(file_boxes, file_box_counts, grid_shape, chunk_yx)
    return ChunkIndex(grid_shape=grid_shape, chunk_yx=chunk_yx, n_items=n_items, n_dates=n_dates, offsets=offsets,
                      items=items, most_items=most_items, most_dates=most_dates, most_files=most_files,
                      dates_kept=dates_kept, item_boxes=item_boxes, item_box_counts=item_box_counts,
                      file_boxes=file_boxes, file_box_counts=file_box_counts)


def _sorted_unique(values: Any) -> Any:
    """``np.unique`` of a 1-D integer array by a sort (NumPy 2's hash-based ``np.unique`` is ~8x slower here)."""
    import numpy as np

    values = np.sort(values)
    if len(values) < 2:
        return values
    keep = np.empty(len(values), dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def _ramp(lengths: Any) -> Any:
    """``[0, 1, .., n0 - 1, 0, 1, .., n1 - 1, ...]`` for ``lengths`` ``[n0, n1, ...]``."""
    import numpy as np

    total = int(lengths.sum())
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.arange(total, dtype=np.int64) - starts


@dataclass(frozen=True)
class JobPlan:
    """Everything a run needs, decided before any pixel is read."""

    grid: GridPlan
    layout: WorkerLayout
    shape: budget.PipelineShape
    report: budget.BudgetReport
    items: tuple[dict[str, Any], ...] = ()
    """Item dicts from the search (empty for a static plan)."""
    sources: SourceTable | None = None
    """Per item and asset: href, declared grid, dtype, nodata, scale/offset (None for a static plan)."""
    program: Program | None = None
    """What every task computes (None for a static plan)."""
    times: tuple[str, ...] = ()
    """The output dates (ISO 8601, UTC, no zone): one per item, or one per pass with ``group_by: solar_day``."""
    period_labels: tuple[str, ...] = ()
    """The output periods ("2024-06", "2024-JJA", "2024"), empty without ``reduce.period``."""
    outside_chunks: frozenset[tuple[int, int]] = frozenset()
    """``(chunk row, chunk column)`` of the chunks entirely outside ``source.stac.intersects``: their tasks read
    nothing (their blocks are nodata)."""
    period_bounds: tuple[tuple[str, str], ...] = ()
    """Per period, ``(start, end)`` as ISO 8601 UTC without a zone, the end exclusive: every period of the window,
    those without an item too (:func:`rasterflow.periods.window_periods`)."""
    quantile_dim: bool = False
    """True when the output has a quantile dimension (``reduce.q`` is a list)."""
    name: str = ""
    resampling: str = "nearest"
    expressions: tuple[tuple[str, str], ...] = ()
    """Band name -> expression text, for the outputs' metadata."""
    cost: JobCost | None = None
    """Bytes read and the estimated wall time (None for a static plan)."""
    chunk_index: ChunkIndex | None = None
    """Per spatial chunk, the items whose files meet it (None for a static plan)."""
    round_trip: float | None = None
    """Seconds of the remote header probe (``source.io.concurrency: auto`` follows it); None when not measured."""
    read_policy: ReadPolicy | None = None
    """How every read of the run behaves (retries, failure policy, signing, I/O), with the run's id: carried by each
    task (:attr:`rasterflow.read.ReadJob.policy`), not set per worker process (None for a static plan)."""
    output: OutputPlan = field(default_factory=OutputPlan)
    """Where and how the result is written."""
    cluster: ClusterPlan = field(default_factory=ClusterPlan)
    """What the run computes on (the worker layout itself is :attr:`layout`)."""
    statistics_cost: StatisticsCost | None = None
    """Per statistic of a list ``reduce`` (or of a geomedian or best-pixel composite), its terms in the budget's
    reduce stage for the largest task (:func:`rasterflow.statcost.statistics_cost`): the per-statistic lines of
    ``plan`` and ``profile``; None for a single statistic or without a reduction."""

    @property
    def code_path(self) -> str:
        """The code path the budget chose and the tasks run: ``fused``, ``tree`` or ``series``."""
        return self.report.path

    @property
    def sub_block(self) -> tuple[int, int]:
        """``(rows, cols)`` a fused task reduces its chunk in; ``(0, 0)`` = the whole chunk."""
        return self.report.sub_block

    @property
    def gdal_cachemax(self) -> int:
        """GDAL's block cache per worker (``cluster.gdal_cachemax``, ``auto`` resolved: see
        :func:`tiles_on_chunk_edges`): what the budget counted, so what the workers get."""
        return self.report.inputs.gdal_cachemax

    @property
    def writer_cachemax(self) -> int:
        """GDAL's block cache of the COG writer in the client."""
        return self.report.inputs.client_cachemax

    @property
    def chunks(self) -> dict[str, int]:
        inputs = self.report.inputs
        cy, cx = inputs.chunk_yx
        return {"time": inputs.time_per_chunk, "y": cy, "x": cx}


def resolve_grid(spec: Spec) -> GridPlan:
    """The output grid: ``grid.bounds`` as given, or ``source.stac.bbox`` projected and snapped to the resolution."""
    resolution = float(spec.grid.resolution)
    if spec.grid.bounds is not None:
        minx, miny, maxx, maxy = (float(v) for v in spec.grid.bounds)
    else:
        from pyproj import Transformer

        transformer = Transformer.from_crs("EPSG:4326", spec.grid.crs, always_xy=True)
        west, south, east, north = spec.source.stac.search_bbox
        minx, miny, maxx, maxy = transformer.transform_bounds(west, south, east, north, densify_pts=21)
        minx = math.floor(minx / resolution) * resolution
        miny = math.floor(miny / resolution) * resolution
        maxx = math.ceil(maxx / resolution) * resolution
        maxy = math.ceil(maxy / resolution) * resolution
    width = max(1, int(round((maxx - minx) / resolution)))
    height = max(1, int(round((maxy - miny) / resolution)))
    # Bounds that are not a whole number of pixels are extended, as stackstac does, so transform and shape agree.
    maxx, miny = minx + width * resolution, maxy - height * resolution
    return GridPlan(crs=spec.grid.crs, resolution=resolution, bounds=(minx, miny, maxx, maxy), shape=(height, width))


def output_dates(items: Sequence[dict[str, Any]], group_by: str) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    """The output dates (``YYYY-MM-DDTHH:MM:SS[.ffffff]``, UTC) and, for ``solar_day``, the items of each pass."""
    if group_by == "solar_day":
        first, steps = solar_day_steps(items)
        return tuple(_naive_utc(t) for t in first), steps
    return tuple(_naive_utc(item["properties"]["datetime"]) for item in items), ()


def _naive_utc(text: str) -> str:
    from rasterflow.spec.timeparse import parse_instant

    return parse_instant(text).replace(tzinfo=None).isoformat()


def local_layout(spec: Spec, *, processes: bool | str | None = None) -> WorkerLayout:
    """The layout a local run of the spec's ``cluster`` section starts with: worker processes or one process, as
    ``cluster.processes`` says (:func:`rasterflow.sizing.size_local_run`, what ``run`` uses), so ``validate`` and
    ``profile`` check the budget of the processes the job will really run in. ``processes`` overrides the spec's
    (``True``: the worker processes ``auto`` falls back to when one process does not fit)."""
    cluster = spec.cluster
    return size_local_run(
        local_machine(),
        n_workers=cluster.n_workers,
        threads_per_worker=cluster.threads_per_worker,
        memory_limit=cluster.memory_limit,
        processes=cluster.processes if processes is None else processes,
    )


def budget_inputs(spec: Spec, grid: GridPlan, layout: WorkerLayout, n_items: int | None,
                  source_tile: tuple[int, int] | None = None, load_dtype: str | None = None,
                  source_codec: str | None = None) -> budget.BudgetInputs:
    """Collect the model's numbers; ``n_items`` None means the static check (max_items or an assumption)."""
    if n_items is not None:
        n_time, source = max(1, n_items), "search"
    elif spec.source.stac.max_items is not None:
        n_time, source = spec.source.stac.max_items, "max_items"
    else:
        n_time, source = budget.DEFAULT_ASSUMED_ITEMS, "assumed"
    gdal_cache = budget.spec_gdal_cachemax(spec.cluster.gdal_cachemax)
    limit_source = "spec" if spec.cluster.memory_limit != "auto" and layout.source == "local" else (
        "auto (local machine)" if layout.source == "local" else layout.source
    )
    return budget.BudgetInputs(
        grid_shape=grid.shape,
        n_time=n_time,
        time_source=source,
        chunk_time=spec.chunks.time,
        chunk_y=spec.chunks.y,
        chunk_x=spec.chunks.x,
        dtype=spec.grid.dtype,
        threads_per_worker=layout.threads_per_worker,
        n_workers=layout.n_workers,
        memory_limit=layout.memory_limit,
        limit_source=limit_source,
        gdal_cachemax=gdal_cache,
        writer_cachemax=gdal_cache,
        max_fraction=spec.budget.max_fraction,
        source_tile=source_tile,
        load_dtype=load_dtype,
        one_process=not layout.processes,
        source_codec=source_codec,
        client_cores=local_machine().cores,
    )


def make_plan(spec: Spec, *, items: Sequence[dict[str, Any]] | None = None, layout: WorkerLayout | None = None,
              source_tile: tuple[int, int] | None = None,
              headers: Mapping[str, FileHeader] | None = None, source_codec: str | None = None,
              remote: RemoteProbe | None = None) -> JobPlan:
    """Resolve grid, layout and budget (with fixes when refused). Pure: the caller did the search, the cluster
    query and (optionally) read file headers: one file's tile shape, and ``headers`` for assets whose items declare
    no data type (see :func:`rasterflow.sources.resolve_sources`)."""
    import numpy as np

    from rasterflow.statcost import statistics_cost

    grid = resolve_grid(spec)
    layout = layout or local_layout(spec)
    shape = budget.pipeline_shape(spec)
    sources = None
    load_dtype = None
    if items is not None:
        with gc_paused():  # one AssetRead per item and asset: 219,000 for 1,000 tiles × a year
            sources = resolve_sources(items, {a: spec.source.assets[a] for a in shape.assets_loaded}, grid,
                                      overrides=spec.source.overrides, working_dtype=spec.grid.dtype,
                                      headers=headers)
        sources = with_resampling(sources, spec, items, shape.mask.names if shape.mask is not None else set())
        # the widest loaded asset sizes the block (conservative for mixed uint8 / uint16 assets)
        load_dtype = max((a.load_dtype for a in sources.assets), key=lambda d: np.dtype(d).itemsize, default=None)
    inputs = budget_inputs(spec, grid, layout, None if items is None else len(items), source_tile, load_dtype,
                           source_codec)
    if (spec.cluster.gdal_cachemax == "auto" and sources is not None and source_tile is not None
            and tiles_on_chunk_edges(sources, grid, source_tile, inputs.chunk_yx)):
        inputs = budget.dataclasses_replace(inputs, gdal_cachemax=budget.ALIGNED_GDAL_CACHEMAX)
    dates = output_dates(items, spec.source.group_by) if items is not None else ((), ())
    index = None
    if items is not None and sources is not None:  # the model follows the tasks the graph runs on these items
        index = build_chunk_index(sources, grid.shape, inputs.chunk_yx, steps=dates[1],
                                  dates_kept=not absent_is_nan(shape.bands, shape.assets_loaded, spec.grid.dtype))
        inputs = budget.dataclasses_replace(inputs, **_budget_details(spec, dates[0], sources, layout, index))
        if inputs.local_files and tiles.decodes(source_codec, source_tile) and all(
                read.direct for reads in sources.reads for read in reads if read is not None):
            # no warp: every read decodes the file's tiles itself (rasterflow.read.tiles), libtiff keeps no decoder
            inputs = budget.dataclasses_replace(inputs, tile_decoder=True)
        if any(not read.direct for reads in sources.reads for read in reads if read is not None):
            inputs = budget.dataclasses_replace(inputs, warped=True)
        elif remote_fetch(spec, sources, source_codec, source_tile, remote):
            # remote files the concurrent reader decodes itself: no GDAL dataset, compressed tiles in the tasks
            inputs = budget.dataclasses_replace(
                inputs, remote_fetch=True, tile_decoder=True, io_buffer=spec.source.io.buffer_bytes,
                source_bytes_per_pixel=remote.bytes_per_pixel if remote is not None else None)
        report = budget.estimate(shape, inputs, on_exceed=spec.budget.on_exceed)
    else:
        report = budget.static_estimate(shape, inputs, on_exceed=spec.budget.on_exceed)
    report = budget.with_fixes(report, shape)
    if sources is not None and sources.warnings:
        report = budget.dataclasses_replace(report, warnings=report.warnings + sources.warnings)
    times: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    bounds: tuple[tuple[str, str], ...] = ()
    program = None
    aoi_text, outside = "", frozenset[tuple[int, int]]()
    if isinstance(spec.source.stac.intersects, dict):
        aoi_text, outside = plan_aoi(spec.source.stac.intersects, grid, inputs.chunk_yx)
    if items is not None:
        times, steps = dates
        groups: tuple[tuple[int, ...], ...] = ()
        if spec.reduce_period:
            labels, groups, bounds = plan_periods(spec, times)
        program = Program(
            assets=shape.assets_loaded, mask=shape.mask, masked_assets=shape.masked_assets, bands=shape.bands,
            dtype=spec.grid.dtype, reduce_method=reduce_method(spec),
            quantiles=() if spec.reduce is None or isinstance(spec.reduce, list) else spec.reduce.quantiles,
            groups=groups, steps=steps, statistics=spec.statistics, composite=composite_of(spec),
            mask_cleanup=spec.cleanup_steps, halo=spec.cleanup_halo, aoi=aoi_text,
        )
    return JobPlan(
        grid=grid, layout=layout, shape=shape, report=report, items=tuple(items or ()), sources=sources,
        program=program, times=times, period_labels=labels, period_bounds=bounds, outside_chunks=outside,
        quantile_dim=len(spec.reductions) == 1 and isinstance(spec.reductions[0].q, list), name=spec.name,
        resampling=spec.grid.resampling, expressions=tuple(spec.bands.items()),
        cost=None if sources is None else job_cost(sources, grid, report, layout, index, remote,
                                                    io_concurrency(spec.source.io.concurrency,
                                                                   remote.round_trip if remote else None)),
        chunk_index=index, round_trip=remote.round_trip if remote is not None else None,
        read_policy=None if sources is None else policy_from_spec(
            spec.source, [read.href for reads in sources.reads for read in reads if read is not None],
            remote.round_trip if remote is not None else None),
        output=output_plan(spec), cluster=cluster_plan(spec),
        statistics_cost=statistics_cost(spec, shape, report.inputs),
    )


def remote_fetch(spec: Spec, sources: SourceTable, codec: str | None, tile: tuple[int, int] | None,
                 probe: RemoteProbe | None) -> bool:
    """Whether every read of the job goes through the concurrent remote reader: all files remote over a scheme it
    speaks, on the output grid, ``source.io.reader: auto``, and the probed file one it decodes (its codec and
    tiling, as :func:`rasterflow.read.tiles.decodes` says for local files)."""
    from rasterflow.read.fetch import supported

    if spec.source.io.reader == "gdal" or (probe is not None and not probe.decodable):
        return False
    reads = [read for reads in sources.reads for read in reads if read is not None]
    return bool(reads) and all(supported(read.href) and read.direct for read in reads) \
        and tiles.decodes(codec, tile)


def tiles_on_chunk_edges(sources: SourceTable, grid: GridPlan, source_tile: tuple[int, int],
                         chunk_yx: tuple[int, int]) -> bool:
    """Whether every source block is decoded exactly once: every loaded file is read straight into the block (on the
    output grid, :attr:`AssetRead.direct`) with its ``proj:transform`` declared, its tile grid starts on a chunk
    edge (the file's first row and column are a whole number of ``source_tile`` tiles from the grid's origin), and
    the chunks are whole tiles (or the whole grid along an axis). Then no chunk or sub-block edge (sub-blocks are
    whole source tiles, :func:`rasterflow.budget.sub_block`) cuts a tile, and GDAL's block cache cannot help.

    ``source_tile`` is one file's (``plan`` reads one header): the files of a collection share their tiling."""
    tile_y, tile_x = source_tile
    if tile_y <= 0 or tile_x <= 0:
        return False
    height, width = grid.shape
    cy, cx = chunk_yx
    if (cy % tile_y and cy < height) or (cx % tile_x and cx < width):
        return False
    res = grid.resolution
    left, top = grid.bounds[0], grid.bounds[3]
    for reads in sources.reads:
        for read in reads:
            if read is None:
                continue
            if not read.direct or read.transform is None:
                return False
            row = (top - read.transform[5]) / res  # the output row of the file's first row
            col = (read.transform[2] - left) / res
            if round(row) % tile_y or round(col) % tile_x:
                return False
    return True


def _budget_details(spec: Spec, times: Sequence[str], sources: SourceTable, layout: WorkerLayout,
                    index: ChunkIndex) -> dict[str, Any]:
    """What the items tell the budget: each asset's load dtype and coverage planes, the output dates (passes,
    ``times`` from :func:`output_dates`), the largest period, the machine the client (and a LocalCluster) runs
    on, and from the chunk index what one task holds: its items, dates and files (``index.depth``)."""

    group_dates = n_periods = None
    if spec.reduce_period and times:
        _, groups, _ = plan_periods(spec, times)
        group_dates = max((len(g) for g in groups), default=0) or None
        n_periods = len(groups) or None
    return {
        "asset_dtypes": tuple(a.load_dtype for a in sources.assets),
        "coverage_assets": sum(1 for a in sources.assets if a.fill is None),
        "n_dates": max(1, len(times)),
        "group_dates": group_dates,
        "n_periods": n_periods,
        "machine_memory": local_machine().memory_bytes,
        "workers_local": layout.source == "local",
        "files_per_chunk": index.most_files,
        "chunk_depth": index.depth,
        "local_files": not any(is_remote(read.href) for reads in sources.reads for read in reads if read is not None),
    }


def check_items(loaded: LoadedSpec, plan: JobPlan) -> None:
    """Check the searched items against the spec, before any pixel is read.

    Raises
    ------
    SpecError
        (exit 2) when items lack an asset key of the spec (naming the spec line, the key, the keys the items do
        have), or when the mask applies an integer-only operation to an asset the items declare as float.
    """
    from rasterflow.errors import ExpressionError

    spec = loaded.spec
    issues: list[SpecIssue] = []
    loaded_assets = {a: spec.source.assets[a] for a in plan.shape.assets_loaded}
    problems: list[MissingAsset] = missing_assets(plan.items, loaded_assets)
    for problem in problems:
        issues.append(_issue(loaded, ("source", "assets", problem.name), "source.assets." + problem.name,
                             problem.message()))
    if not problems and plan.sources is not None and plan.shape.mask is not None:
        kinds = plan.sources.kinds()
        try:
            plan.shape.mask.check_kinds({name: kinds[name] for name in plan.shape.mask.names})
        except ExpressionError as err:
            floats = [n for n in plan.shape.mask.names if kinds[n] == "float"]
            issues.append(_issue(loaded, ("mask",), "mask", f"{err}\n(the items declare {', '.join(floats)} as "
                                 "float, or do not declare their data type: set source.overrides.<name>.data_type)"))
    if issues:
        raise SpecError(issues)


def _issue(loaded: LoadedSpec, loc: tuple[str | int, ...], field: str, message: str) -> SpecIssue:
    position = loaded.positions.position_of(loc)
    return SpecIssue(str(loaded.path), position.line if position else None, position.column if position else None,
                     field, message)


def static_check(loaded: LoadedSpec) -> budget.BudgetReport:
    """The check ``validate`` runs: no network, time axis from ``max_items``.

    Raises
    ------
    BudgetExceededError
        When refused, naming the worst stage and the fixes.
    """
    plan = make_plan(loaded.spec)
    if not plan.report.ok and loaded.spec.cluster.processes == "auto" and not plan.layout.processes:
        plan = make_plan(loaded.spec, layout=local_layout(loaded.spec, processes=True))  # as run falls back to worker processes
    budget.enforce(plan.report, where=loaded.where("chunks"))
    return plan.report

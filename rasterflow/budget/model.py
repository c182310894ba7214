"""The budget's data: what the expressions imply (:class:`PipelineShape`), the sizes (:class:`BudgetInputs`), a kind
of task (:class:`TaskShape`), a stage's peak (:class:`StageEstimate`), a fix (:class:`Fix`) and the verdict
(:class:`BudgetReport`, whose ``to_dict`` keys are ``plan --json``'s contract)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from rasterflow.expr import Expression, parse_expression
from rasterflow.units import dtype_itemsize, format_bytes

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.spec.models import Spec


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
    """``output.zarr_shards`` (None: :func:`rasterflow.writeplan.shard_side`'s default)."""
    stored_dtype: str | None = None
    """``output.encoding.dtype`` (None: the working dtype)."""
    tile_size: int | None = None
    """``output.tiling.size``: each tile is its own store, sharded on its own grid."""
    cog_blocksize: int = 512
    """``output.cog.blocksize``."""
    cog_resampling: str = "average"
    """``output.cog.overview_resampling``: with ``average`` the workers can compress the COG's tiles
    (:mod:`rasterflow.write.cogtiles`, laid out by :func:`rasterflow.writeplan.fast_layout`)."""
    compression: str = "zstd"
    """``output.compression``."""
    halo: int = 0
    """Pixels read around each task's window for ``mask_cleanup`` (``Spec.cleanup_halo``, as the plan's
    :attr:`rasterflow.kernels.Program.halo`): the
    task's planes and series are counted at the grown size."""
    statistics: int = 0
    """Statistics of a list ``reduce`` (each band's variables: one per statistic, in one COG file per period);
    0 for a single ``reduce``."""
    statistic_methods: tuple[str, ...] = ()
    """The methods of a list ``reduce``, each once (they run one after the other on the same series: the reduce
    stage counts the one with the most working copies); empty for a single ``reduce``."""
    composite: str | None = None
    """``geomedian`` or ``best`` (:class:`rasterflow.kernels.Composite`): one result of ``n_quantiles`` variables
    for all the bands together, not one per band."""
    composite_inputs: tuple[str, ...] = ()
    """The bands a composite reads: a geomedian's bands; a best-pixel composite's output bands (``by`` is one of
    the series too)."""
    composite_outputs: tuple[str, ...] = ()
    """A composite's variables, in the order of its result slots."""
    unused_bands: tuple[str, ...] = ()
    """Bands of the spec no output needs (``Spec.unused_bands``): not computed, and said so."""

    @property
    def result_bands(self) -> int:
        """The band axis of a task's result: one per band, or one for a composite (whose variables are its slots)."""
        return 1 if self.composite else len(self.bands)

    @property
    def output_band_names(self) -> tuple[str, ...]:
        """The names of the output's variables per period (a COG's band descriptions)."""
        if self.composite:
            return self.composite_outputs
        if self.statistics:
            return tuple(f"{name}_{k}" for name, _ in self.bands for k in range(self.statistics))
        return tuple(name for name, _ in self.bands)


_ORDER_STATISTICS = ("median", "quantile")


def _budget_method(spec: Spec) -> str | None:
    """The method the budget sizes a task by: a single ``reduce``'s; for a list (its statistics run one after the
    other on the same series, each result in its slot) the one with the most working copies, an order statistic
    first (it needs time whole)."""
    from rasterflow.budget.constants import REDUCTION_EXTRA_PLANES

    methods = [r.method for r in spec.reductions]
    if not methods:
        return None
    if len(methods) == 1:
        return str(methods[0])
    ordered = [m for m in methods if m in _ORDER_STATISTICS]
    return str(max(ordered or methods, key=lambda m: REDUCTION_EXTRA_PLANES[m]))


def _composite_shape(spec: Spec) -> dict[str, Any]:
    """The composite fields of :class:`PipelineShape` (empty for anything but a geomedian or best-pixel composite):
    its inputs and outputs as the plan's :class:`~rasterflow.kernels.Composite` names them (``Spec.composite``)."""
    names = spec.composite
    if names is None:
        return {}
    return {"composite": names.method, "composite_inputs": names.inputs, "composite_outputs": names.outputs}


def pipeline_shape(spec: Spec) -> PipelineShape:
    """Analyse a validated spec's expressions (names read, live arrays)."""
    assets = list(spec.source.assets)
    mask = parse_expression(spec.mask, assets, what="mask") if spec.mask else None
    known = list(assets)
    bands = []
    for name, text in spec.program_bands.items():
        bands.append((name, parse_expression(text, known, what=f"band {name!r}")))
        known.append(name)
    read_by_bands = set().union(*(expr.names for _, expr in bands)) & set(assets)
    read = read_by_bands | (mask.names if mask else set())
    composite = _composite_shape(spec)
    return PipelineShape(
        assets_loaded=tuple(a for a in assets if a in read),
        mask=mask,
        masked_assets=tuple(a for a in assets if a in read_by_bands) if mask else (),
        bands=tuple(bands),
        reduce_method=_budget_method(spec),
        n_quantiles=len(spec.statistics) or len(composite.get("composite_outputs", ())) or (
            len(spec.reduce.quantiles) if spec.reduce is not None and not isinstance(spec.reduce, list) else 0),
        has_period=bool(spec.reduce_period),
        mosaics_passes=spec.source.group_by == "solar_day",
        output_format=getattr(spec.output, "resolved_format", "zarr"),
        zarr_format=spec.output.zarr_format,
        zarr_shards=spec.output.zarr_shards,
        stored_dtype=spec.output.encoding.dtype,
        tile_size=spec.output.tiling.size if spec.output.tiling else None,
        cog_blocksize=spec.output.cog.blocksize,
        cog_resampling=spec.output.cog.overview_resampling,
        compression=spec.output.compression,
        statistics=len(spec.statistics),
        statistic_methods=tuple(dict.fromkeys(method for _, method, _ in spec.statistics)),
        **composite,
        unused_bands=spec.unused_bands,
        halo=spec.cleanup_halo,
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
    n_periods: int | None = None
    """Periods in the output (``reduce.period``: every period of the window, empty ones too); None = estimated from
    the dates and :attr:`group_dates`."""
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
    aoi_mask: bool = False
    """An area of interest (``source.stac.intersects``) masks the tasks' windows with rasterio's ``geometry_mask``
    (:func:`rasterflow.aoi.outside`): the worker imports GDAL even when every read is decoded by rasterflow."""
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
    patch: dict[str, Any]
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

    def to_dict(self) -> dict[str, Any]:
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


def axis_chunk_sizes(total: int, chunk: int) -> list[tuple[int, int]]:
    """(size, how many) of the chunks along an axis of ``total`` cut every ``chunk``."""
    full, rest = divmod(total, chunk)
    out = [(chunk, full)] if full else []
    if rest:
        out.append((rest, 1))
    return out

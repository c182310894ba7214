"""The static memory model: will one task per thread, times the threads, fit in a worker? Pure arithmetic.

DOMAIN.md: ``peak per worker ≈ chunk_bytes × live_arrays × threads_per_worker + GDAL block cache + interpreter``.

rasterflow runs mask, band math and the reduction of one chunk fused in a single task (``kernels.py``), so a task's
memory is counted in *planes*: one plane is one asset's chunk over the time axis, ``t × y × x`` in the working dtype.
The task holds the loaded block (in the source dtype when the items allow it) and one output series per band; mask
and band math run one date at a time, so the temporaries that ``expr.py``'s liveness count predicts are planes of a
single date (1/t of a plane each). The reduction adds its own working copies. Each thread also keeps the source
files it opened (GDAL datasets with a small file cache) for the whole job.
Nothing here imports Dask or touches the network: ``validate`` runs this in milliseconds.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from rasterflow.errors import BudgetExceededError
from rasterflow.expr import Expression, parse_expression
from rasterflow.units import dtype_itemsize, format_bytes

__all__ = [
    "PipelineShape",
    "BudgetInputs",
    "StageEstimate",
    "Fix",
    "BudgetReport",
    "pipeline_shape",
    "estimate",
    "enforce",
    "REDUCTION_EXTRA_PLANES",
    "WORKER_BASELINE_BYTES",
    "DEFAULT_ASSUMED_ITEMS",
]

# Working copies a reduction over time makes, in planes of its input (t × y × x, working dtype), on top of the planes
# the task holds. Measured with benchmarks/budget_accuracy.py (the reduction table it prints first) on 2026-12-02:
# kernels.reduce_time on a 16 × 1024 × 1024 series with 30 % NaN, RSS high-water mark above the input, bottleneck
# 1.6.1, NumPy 2.4:
# - median, mean, std, min, max: 0.063 planes for float32 and float64, i.e. only the (y, x) result (1/t of a plane):
#   bottleneck reduces along the time axis without copying the series (NumPy's nanmedian/nanmean would copy it).
#   0.1 covers the result for t >= 10.
# - sum: 0.39 (float32) / 0.26 (float64): the boolean valid mask (1/4 resp. 1/8 plane) and its any() over time.
# - count: 0.37 / 0.19: ~isnan's two boolean temporaries. Both rounded up to 0.5.
# - quantile: 2.08 / 2.31 (float32, 1 / 3 quantiles), 1.76 / 1.95 (float64): np.sort's sorted copy plus its
#   buffer along the non-contiguous time axis, and the valid count; rounded up to 2.5 (a few more quantiles fit).
REDUCTION_EXTRA_PLANES: Mapping[str, float] = {
    "median": 0.1,
    "quantile": 2.5,
    "mean": 0.1,
    "sum": 0.5,
    "std": 0.1,
    "count": 0.5,
    "min": 0.1,
    "max": 0.1,
}

WORKER_BASELINE_BYTES = 180 * 10**6
"""RSS of an idle Dask worker after importing what a task imports (NumPy, rasterio/GDAL, xarray, stackstac, zarr,
bottleneck, rasterflow's kernels). Measured by benchmarks/budget_accuracy.py on 2026-12-02 (Python 3.11, dask
2026.8, one-thread LocalCluster worker): 168-174 MB over seven runs; rounded up to 180 MB."""

LOAD_COPIES = 1
"""Copies of the loaded block alive in a task: the read output itself; the kernel takes it without a copy."""

OPEN_FILE_BYTES = 2 * 10**6
"""Memory each open source file keeps per worker thread for the whole job: a GDAL dataset with its header and a
1 MB file cache (graph.VSI_CACHE_SIZE). Measured with benchmarks/budget_accuracy.py on 2026-12-02: ~2 MB per
file and thread (4.5 MB with GDAL's default 25 MB cache)."""

DEFAULT_ASSUMED_ITEMS = 100
"""Time-axis length assumed by the static check when ``max_items`` is not set (a warning says so)."""

MIN_CHUNK_BYTES = 16 * 10**6
MIN_TASKS_FOR_LARGE_JOB = 1_000
MAX_TASKS = 100_000
LARGE_JOB_BYTES = 10 * 10**9
SMALL_JOB_BYTES = 10**9
"""Below this much input, small chunks cost little; the small-chunk warning would only be noise."""
ORDER_STATISTICS = ("median", "quantile")


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
    )


@dataclass(frozen=True)
class BudgetInputs:
    """Sizes the model needs, resolved from the spec (statically) or from a search and the real cluster."""

    grid_shape: tuple[int, int]
    """(height, width) of the output grid in pixels."""
    n_time: int
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
    """dtype the block is loaded in (the source integers, e.g. uint16) when known from the items; None = working
    dtype (the static check assumes floats: it cannot know the items)."""

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
        """One asset's chunk over its time slice in the working dtype: the model's unit."""
        cy, cx = self.chunk_yx
        return self.time_per_chunk * cy * cx * dtype_itemsize(self.dtype)

    @property
    def n_spatial_chunks(self) -> int:
        cy, cx = self.chunk_yx
        return math.ceil(self.grid_shape[0] / cy) * math.ceil(self.grid_shape[1] / cx)

    @property
    def n_time_chunks(self) -> int:
        return math.ceil(self.n_time / self.time_per_chunk)


@dataclass(frozen=True)
class StageEstimate:
    """Peak memory of one task while a stage runs."""

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
    """The verdict of the static check."""

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

    @property
    def ok(self) -> bool:
        return not self.refusals

    @property
    def worst_stage(self) -> StageEstimate:
        return max(self.stages, key=lambda s: s.bytes_per_task)

    @property
    def formula(self) -> str:
        inputs = self.inputs
        return (
            f"({format_bytes(self.peak_task_bytes)} per task ({self.worst_stage.stage}) + "
            f"{format_bytes(self.open_files_bytes)} open files) × {inputs.threads_per_worker} "
            f"thread{'s' if inputs.threads_per_worker != 1 else ''} + {format_bytes(inputs.gdal_cachemax)} GDAL cache + "
            f"{format_bytes(WORKER_BASELINE_BYTES)} baseline = {format_bytes(self.peak_per_worker)}"
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
            "baseline_bytes": WORKER_BASELINE_BYTES,
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
        }


def stage_estimates(shape: PipelineShape, inputs: BudgetInputs) -> tuple[StageEstimate, ...]:
    """Per-stage peak of one task, following :mod:`rasterflow.kernels` (planes: ``t × y × x`` working dtype)."""
    plane = inputs.plane_bytes
    load_size = dtype_itemsize(inputs.load_dtype or inputs.dtype) / dtype_itemsize(inputs.dtype)
    n_loaded, n_bands = len(shape.assets_loaded), len(shape.bands)
    stages = []

    def add(stage: str, planes: float, detail: str) -> None:
        stages.append(StageEstimate(stage, round(planes, 3), int(planes * plane), detail))

    block = LOAD_COPIES * n_loaded * load_size
    add("load", block, f"{n_loaded} asset(s) loaded as {inputs.load_dtype or inputs.dtype}")
    held = block + n_bands  # the block and one output series per band, for the whole task
    per_date = 1 / inputs.time_per_chunk
    mosaic = n_loaded if shape.mosaics_passes else 0  # the next tile's planes while they fill the mosaic
    if shape.mask is not None:
        temps = n_loaded + mosaic + shape.mask.live_arrays - len(shape.mask.names)
        add("mask", held + temps * per_date,
            f"block + {n_bands} band series + {temps} one-date planes (assets in working dtype, mask temporaries)")
    for index, (name, expr) in enumerate(shape.bands):
        temps = n_loaded + mosaic + index + expr.live_arrays - len(expr.names)
        add(f"band {name}", held + temps * per_date,
            f"block + {n_bands} band series + {temps} one-date planes (assets, earlier bands, {expr.live_arrays} live)")
    if shape.reduce_method and inputs.time_per_chunk == inputs.n_time:
        extra = REDUCTION_EXTRA_PLANES[shape.reduce_method] + (1 if shape.has_period else 0)
        add(f"reduce {shape.reduce_method}", held + extra,
            f"block + {n_bands} band series + {extra:g} working copies" + (" (period subset)" if shape.has_period else ""))
    else:
        # kernels.band_block: the series are copied into one (t, band, y, x) output; a chunked-time reduction then
        # runs on that output with NumPy's nan-functions (a copy plus a mask).
        extra = n_bands + (1.25 if shape.reduce_method else 0)
        add("bands out" if not shape.reduce_method else f"reduce {shape.reduce_method} (tree)", held + extra,
            f"block + {n_bands} band series + {extra:g} planes of output and working copies")
    return tuple(stages)


def open_files_bytes(shape: PipelineShape, inputs: BudgetInputs) -> int:
    """Source files one thread keeps open: every date and loaded asset it reads, :data:`OPEN_FILE_BYTES` each."""
    return inputs.n_time * len(shape.assets_loaded) * OPEN_FILE_BYTES


def estimate_task_count(inputs: BudgetInputs, n_bands: int, reduce_method: str | None) -> int:
    """Tasks in the graph: per chunk, the read+kernel task and the per-band selections, and the writes (an upper
    bound since the reader of ``rasterflow.read`` fuses what stackstac's graph split in two).

    A reduction over a chunked time axis adds a tree-reduction layer.
    """
    spatial, time_chunks = inputs.n_spatial_chunks, inputs.n_time_chunks
    per_chunk = 3 * time_chunks + (time_chunks if reduce_method and time_chunks > 1 else 0)
    writes = n_bands * (1 if reduce_method else time_chunks)
    return spatial * (per_chunk + writes) + 10


def estimate(shape: PipelineShape, inputs: BudgetInputs, *, on_exceed: str = "error") -> BudgetReport:
    """Estimate the peak per worker and decide. Fixes are solved for separately (:func:`solve_fixes`)."""
    stages = stage_estimates(shape, inputs)
    peak_task = max(s.bytes_per_task for s in stages)
    files = open_files_bytes(shape, inputs)
    peak_worker = (peak_task + files) * inputs.threads_per_worker + inputs.gdal_cachemax + WORKER_BASELINE_BYTES
    allowed = int(inputs.max_fraction * inputs.memory_limit)
    refusals, warnings = [], []
    if peak_worker > allowed:
        worst = max(stages, key=lambda s: s.bytes_per_task)
        text = (
            f"over budget: the {worst.stage} stage holds {worst.planes:g} planes of "
            f"{_plane_words(inputs)} = {format_bytes(worst.bytes_per_task)} per task; "
            f"({format_bytes(peak_task)} + {format_bytes(files)} open files) × {inputs.threads_per_worker} thread(s) + "
            f"{format_bytes(inputs.gdal_cachemax)} GDAL cache + {format_bytes(WORKER_BASELINE_BYTES)} baseline = "
            f"{format_bytes(peak_worker)} per worker, more than {inputs.max_fraction:g} × "
            f"{format_bytes(inputs.memory_limit)} limit = {format_bytes(allowed)}"
        )
        (warnings if on_exceed == "warn" else refusals).append(text)
    if shape.reduce_method in ORDER_STATISTICS and inputs.time_per_chunk < inputs.n_time:
        refusals.append(
            f"chunks.time={inputs.chunk_time} splits time into {inputs.n_time_chunks} chunks, but a {shape.reduce_method} "
            f"over time needs every date of a pixel in one task: Dask would shuffle the chunks between workers and "
            f"hold them while they move; set chunks.time: -1"
        )
    tasks = estimate_task_count(inputs, len(shape.bands), shape.reduce_method)
    total_bytes = inputs.plane_bytes * inputs.n_spatial_chunks * inputs.n_time_chunks * max(1, len(shape.assets_loaded))
    if tasks > MAX_TASKS:
        refusals.append(
            f"about {tasks:,} tasks: above ~{MAX_TASKS:,} the scheduler is the bottleneck (~1 ms each); "
            f"use larger chunks ({_chunk_for_tasks(inputs, shape, 20_000)} keeps it near 20,000)"
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
    )


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
    return f"{inputs.time_per_chunk}×{cy}×{cx} {inputs.dtype} ({format_bytes(inputs.plane_bytes)})"


def _chunk_for_tasks(inputs: BudgetInputs, shape: PipelineShape, target: int) -> str:
    per_spatial = max(1, estimate_task_count(inputs, len(shape.bands), shape.reduce_method) - 10) / inputs.n_spatial_chunks
    pixels = inputs.grid_shape[0] * inputs.grid_shape[1]
    side = int(math.sqrt(pixels * per_spatial / target))
    side = max(256, (side // 256) * 256)
    return f"chunks.y = chunks.x = {side}"


def solve_fixes(shape: PipelineShape, inputs: BudgetInputs) -> tuple[Fix, ...]:
    """Solve for changes that make a refused job pass, and verify each one by estimating again.

    Candidates: time whole (for order statistics), the largest square spatial chunk that fits (a multiple of 256
    when possible, to stay aligned with COG tiles), fewer threads per worker, float32.
    """
    fixes: list[Fix] = []
    base = inputs
    base_patch: dict = {}
    if shape.reduce_method in ORDER_STATISTICS and inputs.time_per_chunk < inputs.n_time:
        base = dataclasses.replace(inputs, chunk_time=-1)
        base_patch = {"chunks": {"time": -1}}

    def passes(candidate: BudgetInputs) -> BudgetReport | None:
        report = estimate(shape, candidate)
        return report if report.ok else None

    def add(description: str, candidate: BudgetInputs, patch: dict) -> None:
        report = passes(candidate)
        if report is not None:
            fixes.append(Fix(description, patch, report.peak_per_worker, report.fraction_of_limit))

    if base is not inputs:
        add("keep time whole: chunks.time: -1", base, base_patch)
    side = _largest_square_chunk(shape, base)
    if side is not None:
        cy, cx = base.chunk_yx
        if side < max(cy, cx):
            candidate = dataclasses.replace(base, chunk_y=side, chunk_x=side)
            patch = _merge(base_patch, {"chunks": {"y": side, "x": side}})
            add(f"chunks.y = chunks.x = {side} (the largest square chunk that fits)", candidate, patch)
    for threads in range(base.threads_per_worker - 1, 0, -1):
        candidate = dataclasses.replace(base, threads_per_worker=threads)
        if passes(candidate):
            add(f"cluster.threads_per_worker: {threads} (each thread holds a working set)", candidate,
                _merge(base_patch, {"cluster": {"threads_per_worker": threads}}))
            break
    if base.dtype == "float64":
        add("grid.dtype: float32 (halves every array)", dataclasses.replace(base, dtype="float32"),
            _merge(base_patch, {"grid": {"dtype": "float32"}}))
    return tuple(fixes)


def _largest_square_chunk(shape: PipelineShape, inputs: BudgetInputs) -> int | None:
    """The largest square spatial chunk (multiple of 256, or of 64 below 256) whose estimate passes."""
    unit = dataclasses.replace(inputs, chunk_y=1, chunk_x=1, grid_shape=(1, 1))
    per_pixel_task = max(s.bytes_per_task for s in stage_estimates(shape, unit))
    room = (inputs.max_fraction * inputs.memory_limit - inputs.gdal_cachemax - WORKER_BASELINE_BYTES
            - open_files_bytes(shape, inputs) * inputs.threads_per_worker)
    if room <= 0 or per_pixel_task <= 0:
        return None
    side = int(math.sqrt(room / (per_pixel_task * inputs.threads_per_worker)))
    step = 256 if side >= 256 else 64
    side = (side // step) * step
    while side >= step:
        candidate = dataclasses.replace(inputs, chunk_y=side, chunk_x=side)
        if estimate(shape, candidate).ok:
            return side
        side -= step
    return None


def _merge(a: dict, b: dict) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in a.items()}
    for key, value in b.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


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
    if report.fixes:
        lines.append("  fixes (each passes the check):")
        for fix in report.fixes:
            lines.append(f"    - {fix.description} -> {format_bytes(fix.peak_per_worker)} per worker "
                         f"({fix.fraction:.0%} of the limit)")
    else:
        lines.append("  no spec change fits this worker; give workers more memory (cluster.memory_limit)")
    raise BudgetExceededError("\n".join(lines))

"""A resolved job as frozen values: the grid, the chunks, the worker layout, the items and the budget verdict.

Planning is pure: no network and no Dask here. The catalog search and the cluster query happen in ``run.py``,
which hands their results (item dicts, a :class:`~rasterflow.sizing.WorkerLayout`) to :func:`make_plan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rasterflow import budget
from rasterflow.errors import SpecError, SpecIssue
from rasterflow.kernels import Program, group_indices, period_labels, solar_day_steps
from rasterflow.sources import FileHeader, MissingAsset, SourceTable, missing_assets, resolve_sources
from rasterflow.sizing import WorkerLayout, local_machine, size_local_cluster
from rasterflow.units import parse_bytes

__all__ = [
    "GridPlan", "JobPlan", "resolve_grid", "local_layout", "budget_inputs", "make_plan", "static_check",
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


@dataclass(frozen=True)
class JobPlan:
    """Everything a run needs, decided before any pixel is read."""

    grid: GridPlan
    layout: WorkerLayout
    shape: budget.PipelineShape
    report: budget.BudgetReport
    items: tuple[dict, ...] = ()
    """Item dicts from the search (empty for a static plan)."""
    sources: SourceTable | None = None
    """Per item and asset: href, declared grid, dtype, nodata, scale/offset (None for a static plan)."""
    program: Program | None = None
    """What every task computes (None for a static plan)."""
    times: tuple[str, ...] = ()
    """The output dates (ISO 8601, UTC, no zone): one per item, or one per pass with ``group_by: solar_day``."""
    period_labels: tuple[str, ...] = ()
    """The output periods ("2024-06", "2024-JJA", "2024"), empty without ``reduce.period``."""
    quantile_dim: bool = False
    """True when the output has a quantile dimension (``reduce.q`` is a list)."""
    name: str = ""
    resampling: str = "nearest"
    expressions: tuple[tuple[str, str], ...] = ()
    """Band name -> expression text, for the outputs' metadata."""

    @property
    def chunks(self) -> dict[str, int]:
        inputs = self.report.inputs
        cy, cx = inputs.chunk_yx
        return {"time": inputs.time_per_chunk, "y": cy, "x": cx}


def resolve_grid(spec: Any) -> GridPlan:
    """The output grid: ``grid.bounds`` as given, or ``source.stac.bbox`` projected and snapped to the resolution."""
    resolution = float(spec.grid.resolution)
    if spec.grid.bounds is not None:
        minx, miny, maxx, maxy = (float(v) for v in spec.grid.bounds)
    else:
        from pyproj import Transformer

        transformer = Transformer.from_crs("EPSG:4326", spec.grid.crs, always_xy=True)
        west, south, east, north = (float(v) for v in spec.source.stac.bbox)
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


def output_dates(items: Sequence[dict], group_by: str) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    """The output dates (``YYYY-MM-DDTHH:MM:SS[.ffffff]``, UTC) and, for ``solar_day``, the items of each pass."""
    if group_by == "solar_day":
        first, steps = solar_day_steps(items)
        return tuple(_naive_utc(t) for t in first), steps
    return tuple(_naive_utc(item["properties"]["datetime"]) for item in items), ()


def _naive_utc(text: str) -> str:
    from rasterflow.spec.timeparse import parse_instant

    return parse_instant(text).replace(tzinfo=None).isoformat()


def local_layout(spec: Any) -> WorkerLayout:
    """The LocalCluster this machine would start for the spec's ``cluster`` section."""
    cluster = spec.cluster
    return size_local_cluster(
        local_machine(),
        n_workers=cluster.n_workers,
        threads_per_worker=cluster.threads_per_worker,
        memory_limit=cluster.memory_limit,
    )


def budget_inputs(spec: Any, grid: GridPlan, layout: WorkerLayout, n_items: int | None,
                  source_tile: tuple[int, int] | None = None, load_dtype: str | None = None) -> budget.BudgetInputs:
    """Collect the model's numbers; ``n_items`` None means the static check (max_items or an assumption)."""
    if n_items is not None:
        n_time, source = max(1, n_items), "search"
    elif spec.source.stac.max_items is not None:
        n_time, source = spec.source.stac.max_items, "max_items"
    else:
        n_time, source = budget.DEFAULT_ASSUMED_ITEMS, "assumed"
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
        gdal_cachemax=parse_bytes(spec.cluster.gdal_cachemax),
        max_fraction=spec.budget.max_fraction,
        source_tile=source_tile,
        load_dtype=load_dtype,
    )


def make_plan(spec: Any, *, items: Sequence[dict] | None = None, layout: WorkerLayout | None = None,
              source_tile: tuple[int, int] | None = None,
              headers: Mapping[str, FileHeader] | None = None) -> JobPlan:
    """Resolve grid, layout and budget (with fixes when refused). Pure: the caller did the search, the cluster
    query and (optionally) read file headers: one file's tile shape, and ``headers`` for assets whose items declare
    no data type (see :func:`rasterflow.sources.resolve_sources`)."""
    import numpy as np

    grid = resolve_grid(spec)
    layout = layout or local_layout(spec)
    shape = budget.pipeline_shape(spec)
    sources = None
    load_dtype = None
    if items is not None:
        sources = resolve_sources(items, {a: spec.source.assets[a] for a in shape.assets_loaded}, grid,
                                  overrides=spec.source.overrides, working_dtype=spec.grid.dtype, headers=headers)
        # the widest loaded asset sizes the block (conservative for mixed uint8 / uint16 assets)
        load_dtype = max((a.load_dtype for a in sources.assets), key=lambda d: np.dtype(d).itemsize, default=None)
    inputs = budget_inputs(spec, grid, layout, None if items is None else len(items), source_tile, load_dtype)
    if items is not None and sources is not None:  # the model follows the tasks the graph runs on these items
        inputs = budget.dataclasses_replace(inputs, **_budget_details(spec, items, sources, layout))
        report = budget.estimate(shape, inputs, on_exceed=spec.budget.on_exceed)
    else:
        report = budget.static_estimate(shape, inputs, on_exceed=spec.budget.on_exceed)
    report = budget.with_fixes(report, shape)
    if sources is not None and sources.warnings:
        report = budget.dataclasses_replace(report, warnings=report.warnings + sources.warnings)
    times: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    program = None
    if items is not None:
        times, steps = output_dates(items, spec.source.group_by)
        groups: tuple[tuple[int, ...], ...] = ()
        if spec.reduce is not None and spec.reduce.period:
            dates = [np.datetime64(t) for t in times]
            labels, groups = group_indices(period_labels(dates, spec.reduce.period))
        program = Program(
            assets=shape.assets_loaded, mask=shape.mask, masked_assets=shape.masked_assets, bands=shape.bands,
            dtype=spec.grid.dtype, reduce_method=spec.reduce.method if spec.reduce else None,
            quantiles=spec.reduce.quantiles if spec.reduce else (), groups=groups, steps=steps,
        )
    return JobPlan(
        grid=grid, layout=layout, shape=shape, report=report, items=tuple(items or ()), sources=sources,
        program=program, times=times, period_labels=labels,
        quantile_dim=spec.reduce is not None and isinstance(spec.reduce.q, list), name=spec.name,
        resampling=spec.grid.resampling, expressions=tuple(spec.bands.items()),
    )


def _budget_details(spec: Any, items: Sequence[dict], sources: SourceTable, layout: WorkerLayout) -> dict:
    """What the items tell the budget: each asset's load dtype and coverage planes, the output dates (passes), the
    largest period, and the machine the client (and a LocalCluster) runs on."""
    import numpy as np

    times, _ = output_dates(items, spec.source.group_by)
    group_dates = None
    if spec.reduce is not None and spec.reduce.period and times:
        _, groups = group_indices(period_labels([np.datetime64(t) for t in times], spec.reduce.period))
        group_dates = max(len(g) for g in groups)
    return {
        "asset_dtypes": tuple(a.load_dtype for a in sources.assets),
        "coverage_assets": sum(1 for a in sources.assets if a.fill is None),
        "n_dates": max(1, len(times)),
        "group_dates": group_dates,
        "machine_memory": local_machine().memory_bytes,
        "workers_local": layout.source == "local",
        "files_per_chunk": _files_per_chunk(spec, sources),
    }


def _files_per_chunk(spec: Any, sources: SourceTable) -> int:
    """The most files (item × asset) whose footprint meets one spatial chunk: what a task opens (``graph.read_jobs``)."""
    import numpy as np

    height, width = resolve_grid(spec).shape
    cy = height if spec.chunks.y == -1 else min(spec.chunks.y, height)
    cx = width if spec.chunks.x == -1 else min(spec.chunks.x, width)
    counts = np.zeros((math.ceil(height / cy), math.ceil(width / cx)), dtype=np.int64)
    for item_reads in sources.reads:
        for read in item_reads:
            if read.footprint is None:
                counts += 1
                continue
            r0, r1, c0, c1 = read.footprint
            if r0 < r1 and c0 < c1:
                # footprints are rounded out by a pixel; a file opened for that pixel only reads its header, which
                # costs little next to the file cache of a file that is read (budget.OPEN_FILE_BYTES)
                r0, r1 = (r0 + 1, r1 - 1) if r1 - r0 > 2 else (r0, r1)
                c0, c1 = (c0 + 1, c1 - 1) if c1 - c0 > 2 else (c0, c1)
                counts[r0 // cy:(r1 - 1) // cy + 1, c0 // cx:(c1 - 1) // cx + 1] += 1
    return int(counts.max()) if counts.size else 0


def check_items(loaded: Any, plan: JobPlan) -> None:
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


def _issue(loaded: Any, loc: tuple, field: str, message: str) -> SpecIssue:
    position = loaded.positions.position_of(loc)
    return SpecIssue(str(loaded.path), position.line if position else None, position.column if position else None,
                     field, message)


def static_check(loaded: Any) -> budget.BudgetReport:
    """The check ``validate`` runs: no network, time axis from ``max_items``.

    Raises
    ------
    BudgetExceededError
        When refused, naming the worst stage and the fixes.
    """
    plan = make_plan(loaded.spec)
    budget.enforce(plan.report, where=loaded.where("chunks"))
    return plan.report

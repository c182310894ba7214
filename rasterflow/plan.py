"""A resolved job as frozen values: the grid, the chunks, the worker layout, the items and the budget verdict.

Planning is pure: no network and no Dask here. The catalog search and the cluster query happen in ``run.py``,
which hands their results (item dicts, a :class:`~rasterflow.sizing.WorkerLayout`) to :func:`make_plan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from rasterflow import budget
from rasterflow.sizing import WorkerLayout, local_machine, size_local_cluster
from rasterflow.units import parse_bytes

__all__ = [
    "GridPlan", "JobPlan", "resolve_grid", "source_encoding", "local_layout", "budget_inputs", "make_plan",
    "static_check",
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
        minx, miny, maxx, maxy = transformer.transform_bounds(*spec.source.stac.bbox, densify_pts=21)
        minx = math.floor(minx / resolution) * resolution
        miny = math.floor(miny / resolution) * resolution
        maxx = math.ceil(maxx / resolution) * resolution
        maxy = math.ceil(maxy / resolution) * resolution
    width = max(1, int(round((maxx - minx) / resolution)))
    height = max(1, int(round((maxy - miny) / resolution)))
    # Bounds that are not a whole number of pixels are extended, as stackstac does, so transform and shape agree.
    maxx, miny = minx + width * resolution, maxy - height * resolution
    return GridPlan(crs=spec.grid.crs, resolution=resolution, bounds=(minx, miny, maxx, maxy), shape=(height, width))


def source_encoding(items: Sequence[dict], asset_keys: Sequence[str]) -> tuple[str, int] | None:
    """The integer dtype and nodata value to load raw values in, or None to load floats with NaN.

    Loading the source integers (uint16 for Sentinel-2) instead of floats halves the loaded block; the kernel
    converts one date at a time. That is exact only when one value means "no data" in every asset: every loaded
    asset of every item must declare an integer ``raster:bands`` data_type and the same nodata, which stackstac then
    also uses as the fill outside the data.
    """
    import numpy as np

    dtypes, nodatas = set(), set()
    for item in items:
        for key in asset_keys:
            bands = (item.get("assets", {}).get(key) or {}).get("raster:bands") or [{}]
            dtypes.add(bands[0].get("data_type"))
            nodatas.add(bands[0].get("nodata"))
    if not items or len(nodatas) != 1 or None in dtypes:
        return None
    (nodata,) = nodatas
    try:
        dtype = np.result_type(*(np.dtype(d) for d in dtypes))
    except TypeError:
        return None
    if dtype.kind not in "iu" or not isinstance(nodata, int) or not np.can_cast(np.min_scalar_type(nodata), dtype):
        return None
    return dtype.name, nodata


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
              source_tile: tuple[int, int] | None = None) -> JobPlan:
    """Resolve grid, layout and budget (with fixes when refused). Pure: the caller did the search, the cluster
    query and (optionally) read one source file's tile shape."""
    grid = resolve_grid(spec)
    layout = layout or local_layout(spec)
    shape = budget.pipeline_shape(spec)
    encoding = source_encoding(items or (), [spec.source.assets[a] for a in shape.assets_loaded])
    inputs = budget_inputs(spec, grid, layout, None if items is None else len(items), source_tile,
                           encoding[0] if encoding else None)
    report = budget.with_fixes(budget.estimate(shape, inputs, on_exceed=spec.budget.on_exceed), shape)
    return JobPlan(grid=grid, layout=layout, shape=shape, report=report, items=tuple(items or ()))


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

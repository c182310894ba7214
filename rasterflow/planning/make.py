"""Making the plan: from the spec, the searched items and the layout to a JobPlan (pure: no network, no Dask)."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any, Container, Mapping, Sequence

from rasterflow import budget
from rasterflow.kernels import Composite, Program, absent_is_nan, solar_day_steps
from rasterflow.planning.chunks import ChunkIndex, build_chunk_index
from rasterflow.planning.cost import RemoteProbe, job_cost
from rasterflow.planning.grid import GridPlan, plan_aoi, resolve_grid, tiles_on_chunk_edges
from rasterflow.planning.jobplan import JobPlan, cluster_plan, output_plan
from rasterflow.readplan import decodes, io_buffer, io_concurrency, is_remote, policy_from_spec, supported
from rasterflow.sizing import WorkerLayout, local_machine, size_local_run
from rasterflow.sources import FileHeader, SourceTable, gc_paused, resolve_sources

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.spec import Spec


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
        if inputs.local_files and decodes(source_codec, source_tile) and all(
                read.direct for reads in sources.reads for read in reads if read is not None):
            # no warp: every read decodes the file's tiles itself (rasterflow.read.tiles), libtiff keeps no decoder
            inputs = budget.dataclasses_replace(inputs, tile_decoder=True)
        if isinstance(spec.source.stac.intersects, dict):  # tasks.clip masks with rasterio: GDAL in the workers
            inputs = budget.dataclasses_replace(inputs, aoi_mask=True)
        if any(not read.direct for reads in sources.reads for read in reads if read is not None):
            inputs = budget.dataclasses_replace(inputs, warped=True)
        elif remote_fetch(spec, sources, source_codec, source_tile, remote):
            # remote files the concurrent reader decodes itself: no GDAL dataset, compressed tiles in the tasks
            inputs = budget.dataclasses_replace(
                inputs, remote_fetch=True, tile_decoder=True,
                io_buffer=io_buffer(None if spec.source.io.buffer == "auto" else spec.source.io.buffer_bytes,
                                    remote.round_trip if remote is not None else None),
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
    tiling, as :func:`rasterflow.readplan.decodes` says for local files)."""

    if spec.source.io.reader == "gdal" or (probe is not None and not probe.decodable):
        return False
    reads = [read for reads in sources.reads for read in reads if read is not None]
    return bool(reads) and all(supported(read.href) and read.direct for read in reads) \
        and decodes(codec, tile)


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

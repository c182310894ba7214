"""Compile a plan into a lazy xarray Dataset: load (stackstac) -> scale -> mask -> band math -> reduction.

Nothing here computes: the result is a Dask-backed Dataset that a writer streams to storage chunk by chunk.
With time whole (the default) mask, bands and reduction run fused in one task per spatial chunk
(:func:`rasterflow.kernels.reduce_block`), so no intermediate leaves its task and no data moves between workers.
"""

from __future__ import annotations

from typing import Any, Sequence

import dask.array as da
import numpy as np
import xarray as xr

from rasterflow import kernels
from rasterflow.plan import JobPlan

__all__ = ["build_dataset", "load_cube", "make_program", "scale_offset_table"]


def load_cube(items: Sequence[dict], asset_keys: Sequence[str], plan: JobPlan, spec: Any) -> xr.DataArray:
    """A lazy ``(time, band, y, x)`` cube on the plan's grid, in the working dtype with NaN for nodata.

    Raw values (no scale/offset: stackstac refuses float32 with ``rescale=True``; the kernel applies them per item),
    bands whole in each chunk, time whole or chunked as planned.
    """
    import stackstac
    from rasterio.enums import Resampling

    chunks = plan.chunks
    return stackstac.stack(
        [dict(item) for item in items],
        assets=list(asset_keys),
        epsg=plan.grid.epsg,
        resolution=plan.grid.resolution,
        bounds=plan.grid.bounds,
        snap_bounds=False,
        dtype=np.dtype(spec.grid.dtype),
        fill_value=np.dtype(spec.grid.dtype).type(np.nan),
        rescale=False,
        chunksize=(chunks["time"], len(asset_keys), chunks["y"], chunks["x"]),
        resampling=Resampling[spec.grid.resampling],
        sortby_date=False,
        xy_coords="center",
        properties=False,
        band_coords=False,
    )


def scale_offset_table(items: Sequence[dict], asset_keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per item and asset, ``raster:bands`` scale and offset (1 and 0 when absent): ``(time, asset)`` arrays.

    Per item, not per collection: Sentinel-2 L2A changed its offset with processing baseline 04.00.
    """
    scale = np.ones((len(items), len(asset_keys)))
    offset = np.zeros((len(items), len(asset_keys)))
    for t, item in enumerate(items):
        for a, key in enumerate(asset_keys):
            bands = (item.get("assets", {}).get(key) or {}).get("raster:bands") or [{}]
            scale[t, a] = bands[0].get("scale", 1.0)
            offset[t, a] = bands[0].get("offset", 0.0)
    return scale, offset


def make_program(spec: Any, plan: JobPlan, times: Sequence[np.datetime64]) -> tuple[kernels.Program, tuple[str, ...]]:
    """The kernel program and the period labels (empty without a period)."""
    shape = plan.shape
    labels: tuple[str, ...] = ()
    groups: tuple[tuple[int, ...], ...] = ()
    if spec.reduce is not None and spec.reduce.period:
        labels, groups = kernels.group_indices(kernels.period_labels(times, spec.reduce.period))
    program = kernels.Program(
        assets=shape.assets_loaded,
        mask=shape.mask,
        masked_assets=shape.masked_assets,
        bands=shape.bands,
        dtype=spec.grid.dtype,
        reduce_method=spec.reduce.method if spec.reduce else None,
        quantiles=spec.reduce.quantiles if spec.reduce else (),
        groups=groups,
    )
    return program, labels


def build_dataset(plan: JobPlan, spec: Any) -> xr.Dataset:
    """The lazy result: one variable per band, dims ``([period,] [quantile,] y, x)`` or ``(time, y, x)``."""
    import rioxarray  # noqa: F401  (registers the .rio accessor)
    from affine import Affine

    items = list(plan.items)
    asset_keys = [spec.source.assets[name] for name in plan.shape.assets_loaded]
    cube = load_cube(items, asset_keys, plan, spec)
    program, labels = make_program(spec, plan, cube["time"].values)
    scale, offset = scale_offset_table(items, asset_keys)
    spatial_chunks = cube.data.chunks[2:]
    coords = {"y": cube["y"].values, "x": cube["x"].values}
    quantile_dim = spec.reduce is not None and isinstance(spec.reduce.q, list)

    if spec.reduce is None:
        bands = da.map_blocks(
            kernels.band_block, cube.data, program=program, scale=scale, offset=offset,
            chunks=(cube.data.chunks[0], (len(program.bands),), *spatial_chunks), dtype=program.dtype,
            name="rasterflow-bands",
        )
        variables = {
            name: (("time", "y", "x"), bands[:, index].rechunk({0: 1}))
            for index, name in enumerate(program.band_names)
        }
        coords["time"] = cube["time"].values
    elif cube.data.numblocks[0] == 1:
        fused = da.map_blocks(
            kernels.reduce_block, cube.data, program=program, scale=scale, offset=offset,
            drop_axis=[0, 1], new_axis=[0, 1, 2],
            chunks=((program.n_groups,), (program.n_quantiles,), (len(program.bands),), *spatial_chunks),
            dtype=program.dtype, name=f"rasterflow-{program.reduce_method}",
        )
        variables = {name: _reduced_dims(fused[:, :, index], bool(labels), quantile_dim)
                     for index, name in enumerate(program.band_names)}
    else:
        bands = da.map_blocks(
            kernels.band_block, cube.data, program=program, scale=scale, offset=offset,
            chunks=(cube.data.chunks[0], (len(program.bands),), *spatial_chunks), dtype=program.dtype,
            name="rasterflow-bands",
        )
        variables = {name: _reduced_dims(_tree_reduce(bands[:, index], program), bool(labels), quantile_dim)
                     for index, name in enumerate(program.band_names)}
    if labels:
        coords["period"] = np.array(labels)
    if quantile_dim:
        coords["quantile"] = np.array(program.quantiles)
    dataset = xr.Dataset(variables, coords=coords)
    dataset.attrs.update({"rasterflow_pipeline": spec.name, "rasterflow_items": len(items)})
    for name in program.band_names:
        dataset[name].attrs["long_name"] = name
        dataset[name].attrs["rasterflow_expression"] = spec.bands[name]
    dataset = dataset.rio.write_crs(plan.grid.crs).rio.write_transform(Affine(*plan.grid.transform))
    return dataset


def _reduced_dims(stacked: da.Array, keep_period: bool, keep_quantile: bool):
    """``(group, quantile, y, x)`` -> the dims a user expects: period only with a period, quantile only for a list."""
    dims = ["period", "quantile", "y", "x"]
    index: list[Any] = [slice(None) if keep_period else 0, slice(None) if keep_quantile else 0]
    array = stacked[tuple(index)]
    names = [d for d, keep in zip(dims[:2], (keep_period, keep_quantile)) if keep] + ["y", "x"]
    chunks = {i: 1 for i in range(len(names) - 2)}
    return tuple(names), array.rechunk(chunks) if chunks else array


def _tree_reduce(series: da.Array, program: kernels.Program) -> da.Array:
    """A reduction over a chunked time axis (streaming methods only; the budget refuses median/quantile here)."""
    groups = program.groups or (tuple(range(series.shape[0])),)
    results = []
    for indices in groups:
        subset = series[list(indices)] if len(indices) != series.shape[0] else series
        results.append(_dask_reduce(subset, program.reduce_method))
    return da.stack(results)[:, None]


def _dask_reduce(values: da.Array, method: str) -> da.Array:
    valid = ~da.isnan(values)
    if method == "mean":
        result = da.nanmean(values, axis=0)
    elif method == "std":
        result = da.nanstd(values, axis=0)
    elif method == "min":
        result = da.nanmin(values, axis=0)
    elif method == "max":
        result = da.nanmax(values, axis=0)
    elif method == "sum":
        result = da.where(valid.any(axis=0), da.nansum(values, axis=0), np.nan)
    elif method == "count":
        result = valid.sum(axis=0)
    else:
        raise ValueError(f"{method} needs time whole (chunks.time: -1)")
    return result.astype(values.dtype)

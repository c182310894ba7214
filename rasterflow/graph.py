"""Compile a plan into a lazy xarray Dataset: load (stackstac) -> scale -> mask -> band math -> reduction.

Nothing here computes: the result is a Dask-backed Dataset that a writer streams to storage chunk by chunk.
With time whole (the default) the read, mask, bands and reduction of a spatial chunk run fused in one task
(:func:`rasterflow.kernels.reduce_block`) that depends on no other task, so no intermediate leaves its task, the
chunks spread over all workers and no data moves between them. Blocks are loaded in the source's integer dtype
when the STAC metadata allows it (:func:`source_encoding`) and converted per date inside the kernel.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Sequence

import dask
import dask.array as da
import numpy as np
import xarray as xr

from rasterflow import kernels
from rasterflow.plan import JobPlan, source_encoding

__all__ = ["build_dataset", "load_cube", "make_program", "scale_offset_table"]


def load_cube(items: Sequence[dict], asset_keys: Sequence[str], plan: JobPlan, spec: Any,
              encoding: tuple[str, int] | None) -> xr.DataArray:
    """A lazy ``(time, band, y, x)`` cube on the plan's grid: raw integers (``encoding``) or the working dtype.

    Raw values (no scale/offset: stackstac refuses float32 with ``rescale=True``; the kernel applies them per item),
    bands whole in each chunk, time whole or chunked as planned.
    """
    import stackstac
    from rasterio.enums import Resampling

    if encoding is not None:
        dtype = np.dtype(encoding[0])
        fill_value = dtype.type(encoding[1])
    else:
        dtype = np.dtype(spec.grid.dtype)
        fill_value = dtype.type(np.nan)
    chunks = plan.chunks
    cube = stackstac.stack(
        [dict(item) for item in items],
        assets=list(asset_keys),
        epsg=plan.grid.epsg,
        resolution=plan.grid.resolution,
        bounds=plan.grid.bounds,
        snap_bounds=False,
        dtype=dtype,
        fill_value=fill_value,
        rescale=False,
        chunksize=(chunks["time"], len(asset_keys), chunks["y"], chunks["x"]),
        resampling=Resampling[spec.grid.resampling],
        sortby_date=False,
        xy_coords="center",
        properties=False,
        band_coords=False,
        gdal_env=_gdal_env(),
    )
    return cube.copy(data=_readers_in_every_task(cube.data, fill_value))


VSI_CACHE_SIZE = 1_000_000
"""Bytes of file cache GDAL keeps per open asset. stackstac opens files with VSI_CACHE on, and GDAL's default size
is 25 MB *per file handle*; readers stay open for the whole job, so every asset a worker touched kept up to 25 MB
(~600 MB per worker for 8 dates x 3 assets, more with more dates). The cache is there so that re-opening a COG in
another thread does not fetch its header again; 1 MB holds a header."""


def _gdal_env():
    from stackstac.rio_reader import DEFAULT_GDAL_ENV, LayeredEnv

    default = DEFAULT_GDAL_ENV
    return LayeredEnv(always=default._always, open={**default._open, "VSI_CACHE_SIZE": VSI_CACHE_SIZE},
                      open_vrt=default._open_vrt, read=default._read)


_READER_TABLES: OrderedDict[str, np.ndarray] = OrderedDict()
_READER_TABLES_LOCK = threading.Lock()


def _fetch(table: tuple[str, np.ndarray], slices: tuple[slice, slice], dtype: np.dtype, fill_value: Any) -> np.ndarray:
    """The ``(time, asset, y, x)`` block of one window, read with the readers this worker process already opened.

    stackstac's ``fetch_raster_window``, except that an asset that needs no warping and whose file nodata is the
    fill value is read straight into the block: stackstac's reader reads a masked array, fills it and copies it in
    (~0.14 s instead of ~0.08 s per 1024² x 8 dates x 3 assets), for the same values.
    """
    from rasterio import windows

    key, readers = table
    with _READER_TABLES_LOCK:
        readers = _READER_TABLES.setdefault(key, readers)
        _READER_TABLES.move_to_end(key)
        # Only recent tables stay: the open datasets of a finished job close with their readers.
        while len(_READER_TABLES) > 16:
            _READER_TABLES.popitem(last=False)
    window = windows.Window.from_slices(*slices)
    block = np.full(readers.shape + (window.height, window.width), fill_value, dtype=dtype)
    for index, entry in np.ndenumerate(readers):
        if not entry:
            continue
        reader, asset_window = entry
        if windows.intersect(window, asset_window) and not _read_plain(reader, window, block[index], fill_value):
            block[index] = reader.read(window)
    return block


def _read_plain(reader: Any, window: Any, out: np.ndarray, fill_value: Any) -> bool:
    """Read one asset into ``out`` without a mask when that gives stackstac's values; False when it would not."""
    from rasterio.vrt import WarpedVRT
    from stackstac.rio_reader import ThreadLocalRioDataset

    if tuple(reader.scale_offset) != (1, 0):
        return False
    source = reader.dataset  # opens the file on first use in this thread
    if not isinstance(source, ThreadLocalRioDataset):
        return False
    dataset = source.dataset
    if isinstance(dataset, WarpedVRT) or dataset.count != 1 or dataset.nodata is None or dataset.nodata != fill_value:
        return False
    source.read(window, out=out[None])  # nodata pixels already hold the fill value
    return True


def _readers_in_every_task(data: da.Array, fill_value: Any) -> da.Array:
    """stackstac's cube with the reader table embedded in each read task instead of computed by one shared task.

    stackstac opens its readers in one task that every read depends on. Distributed places a task next to its
    dependencies, and a tiny shared one pulls every chunk onto the worker that ran it whenever a job has few
    chunks (up to 2 per thread are not "root-ish"): one worker did all the work. Built here in the client
    (it only constructs reader objects, no I/O) and embedded, every chunk is an independent root task that
    fuses with the kernel and the writer, and nothing moves between workers. Each worker process keeps the
    unpickled readers per table block (:func:`_fetch`), so files are opened once per process, as before.
    """
    from dask.blockwise import BlockwiseDepDict, blockwise
    from dask.highlevelgraph import HighLevelGraph
    from dask.layers import ArraySliceDep
    from dask.local import get_sync

    graph = data.dask
    (reader_layer,) = [name for name in graph.layers if name.startswith("asset_table_to_reader_and_window-")]
    keys = sorted(graph.layers[reader_layer].get_output_keys())
    token = dask.base.tokenize(data.name)
    tables = {key[1:]: (f"{token}-{key[1]}-{key[2]}", readers)
              for key, readers in zip(keys, get_sync(dict(graph.cull(set(keys))), keys))}
    name = f"rasterflow-read-{token}"
    layer = blockwise(
        _fetch, name, "tbyx",
        BlockwiseDepDict(tables, numblocks=data.numblocks[:2]), "tb",
        ArraySliceDep(data.chunks[2:]), "yx",
        data.dtype, None, fill_value, None,
        numblocks={},
    )
    return da.Array(HighLevelGraph.from_collections(name, layer, []), name, data.chunks,
                    meta=np.ndarray((0, 0, 0, 0), dtype=data.dtype))


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


def make_program(spec: Any, plan: JobPlan, times: Sequence[np.datetime64], nodata: int | None = None,
                 steps: tuple[tuple[int, ...], ...] = ()) -> tuple[kernels.Program, tuple[str, ...]]:
    """The kernel program and the period labels (empty without a period); ``times`` are the output dates."""
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
        nodata=nodata,
        steps=steps,
    )
    return program, labels


def build_dataset(plan: JobPlan, spec: Any) -> xr.Dataset:
    """The lazy result: one variable per band, dims ``([period,] [quantile,] y, x)`` or ``(time, y, x)``."""
    import rioxarray  # noqa: F401  (registers the .rio accessor)
    from affine import Affine

    items = list(plan.items)
    asset_keys = [spec.source.assets[name] for name in plan.shape.assets_loaded]
    encoding = source_encoding(items, asset_keys)
    cube = load_cube(items, asset_keys, plan, spec, encoding)
    times, steps = cube["time"].values, ()
    if spec.source.group_by == "solar_day":
        # one output date per pass; the budget check guarantees time is whole, so a chunk holds every tile of a pass
        first, steps = kernels.solar_day_steps(items)
        times = np.array([np.datetime64(t.rstrip("Zz")[:26]) for t in first], dtype="datetime64[ns]")
    program, labels = make_program(spec, plan, times, encoding[1] if encoding else None, steps)
    time_chunks = ((len(steps),),) if steps else (cube.data.chunks[0],)
    scale, offset = scale_offset_table(items, asset_keys)
    spatial_chunks = cube.data.chunks[2:]
    coords = {"y": cube["y"].values, "x": cube["x"].values}
    quantile_dim = spec.reduce is not None and isinstance(spec.reduce.q, list)

    if spec.reduce is None:
        bands = da.map_blocks(
            kernels.band_block, cube.data, program=program, scale=scale, offset=offset,
            chunks=(*time_chunks, (len(program.bands),), *spatial_chunks), dtype=program.dtype,
            name="rasterflow-bands",
        )
        variables = {
            name: (("time", "y", "x"), bands[:, index].rechunk({0: 1}))
            for index, name in enumerate(program.band_names)
        }
        coords["time"] = times
    elif cube.data.numblocks[0] == 1:
        fused = da.map_blocks(
            kernels.reduce_block, cube.data, program=program, scale=scale, offset=offset,
            # One new leading axis and the input's (single-block) time and asset axes reused as quantile and band:
            # with drop_axis Dask would concatenate the dropped axes' blocks, copying the whole loaded block.
            new_axis=[0],
            chunks=((program.n_groups,), (program.n_quantiles,), (len(program.bands),), *spatial_chunks),
            dtype=program.dtype, name=f"rasterflow-{program.reduce_method}",
        )
        variables = {name: _reduced_dims(fused[:, :, index], bool(labels), quantile_dim)
                     for index, name in enumerate(program.band_names)}
    else:
        bands = da.map_blocks(
            kernels.band_block, cube.data, program=program, scale=scale, offset=offset,
            chunks=(*time_chunks, (len(program.bands),), *spatial_chunks), dtype=program.dtype,
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

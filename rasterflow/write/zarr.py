"""Stream a lazy Dataset into a Zarr store, one Dask block per Zarr chunk, atomically and resumably.

Design
------
* Local paths are written into a staging store ``<path>.partial`` and renamed into place only when complete; an
  existing output is moved aside, the new store renamed in, and only then the old one deleted. fsspec URLs
  (``s3://...``) are written in place.
* The store is created metadata-only first (``to_zarr(compute=False)``): array shapes, Zarr chunks equal to the Dask
  chunks, codec, ``_FillValue`` = NaN, coordinates (``y``, ``x``, leading dims, the scalar ``spatial_ref`` with the
  CRS and GeoTransform), and the group attributes ``rasterflow_fingerprint`` and ``rasterflow_complete: false``.
* Every Dask block is then written by the worker that computed it, straight into its Zarr chunk (blocks and chunks
  coincide, so no two tasks touch the same chunk), followed by an empty done-marker
  ``<store>/.rasterflow/done/<var>/<i>.<j>...``. The task returns a one-element array: nothing pixel-sized travels to
  the client.
* Resume: a staging store with the same fingerprint that is not complete is reused; blocks with a marker are not
  recomputed (their keys are never requested, so Dask culls their upstream tasks). Another fingerprint: start over.
* Finish: ``rasterflow_complete: true``, markers removed, metadata consolidated, renamed into place. Each step is
  idempotent, so a crash in between is finished by the next run.

Zarr format 3 is written (the default of zarr-python 3 and xarray; GDAL >= 3.8 reads it). Its consolidated metadata
(inside the root ``zarr.json``) is not yet part of the v3 specification: zarr-python warns when writing it (silenced
here), xarray reads it without a warning.
"""

from __future__ import annotations

import math
import os
import uuid
import warnings
from typing import Any, Callable

import dask
import dask.array as da
import numpy as np
import xarray as xr

from rasterflow.errors import OutputExistsError, RunFailedError
from rasterflow.write.common import (
    COMPLETE_ATTR,
    FINGERPRINT_ATTR,
    WriteResult,
    check_output_target,
    compression_name,
    exists,
    is_complete_zarr,
    is_remote,
    path_size,
    read_zarr_state,
    remove,
    spatial_dims,
    zarr_staging_path,
)

__all__ = ["write_zarr", "is_complete_zarr", "ZARR_FORMAT", "MARKER_DIR"]

ZARR_FORMAT = 3
#: Done-markers live under ``<store>/<MARKER_DIR>/<var>/``; removed when the store is complete.
MARKER_DIR = ".rasterflow/done"


# --------------------------------------------------------------------------------------------------------------------
# helpers that run on workers


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def _touch(url: str) -> None:
    if is_remote(url):
        import fsspec.core

        fs, p = fsspec.core.url_to_fs(url)
        fs.pipe_file(p, b"")
        return
    directory = os.path.dirname(url)
    os.makedirs(directory, exist_ok=True)
    with open(url, "wb"):
        pass


def _write_block(block: np.ndarray, *, store: str, var: str, markers: str, block_info=None) -> np.ndarray:
    """Write one Dask block into its Zarr chunk, then leave its done-marker. Runs on a worker."""
    import zarr

    info = block_info[0]
    region = tuple(slice(start, stop) for start, stop in info["array-location"])
    array = zarr.open_array(store, path=var, mode="r+", zarr_format=ZARR_FORMAT)
    array[region] = np.asarray(block, dtype=array.dtype)
    _touch(_join(markers, var, ".".join(str(i) for i in info["chunk-location"])))
    return np.ones((1,) * block.ndim, dtype=np.int8)


# --------------------------------------------------------------------------------------------------------------------
# preparing the dataset and the template


def _compressors(name: str) -> list | None:
    from zarr.codecs import BloscCodec, BloscShuffle, GzipCodec, ZstdCodec

    if name == "zstd":
        return [ZstdCodec(level=3)]
    if name == "deflate":
        return [GzipCodec(level=6)]
    if name == "lz4":  # Zarr v3 has no bare LZ4 codec; Blosc's is the standard one
        return [BloscCodec(cname="lz4", clevel=5, shuffle=BloscShuffle.shuffle)]
    return None


def _regular(chunks: tuple[int, ...]) -> bool:
    return all(c == chunks[0] for c in chunks[:-1]) and chunks[-1] <= chunks[0]


def _prepare(ds: xr.Dataset, compression: str) -> xr.Dataset:
    """A shallow copy of ``ds`` with dask-backed, regularly chunked data variables and explicit Zarr encodings."""
    spatial_dims(ds)  # same dims everywhere, at least 2-D
    out = ds.copy(deep=False)
    for name, var in ds.variables.items():
        if name in ds.data_vars:
            continue
        if isinstance(var.data, da.Array):
            var = var.compute()  # coordinates are small: they are written with the template
            out = out.assign_coords({name: var})
        if var.dtype.kind == "U":
            # fixed-width UTF-32 has no Zarr v3 specification (zarr-python warns, other readers may fail);
            # object strings are written as the variable-length ``string`` type
            out = out.assign_coords({name: var.astype(object)})
    first = out[next(iter(out.data_vars))]
    grid_mapping = first.encoding.get("grid_mapping") or first.attrs.get("grid_mapping") or "spatial_ref"
    if grid_mapping not in out.coords or out[grid_mapping].ndim != 0:
        grid_mapping = None
    for name in out.variables:
        out.variables[name].encoding = {}
    compressors = _compressors(compression)
    for name in list(out.data_vars):
        var = out[name]
        data = var.data
        if not isinstance(data, da.Array):
            data = da.from_array(np.asarray(data), chunks=-1)
        fixes = {axis: max(c) for axis, c in enumerate(data.chunks) if not _regular(c)}
        if fixes:
            data = data.rechunk(fixes)
        out[name] = var.copy(data=data)
        out[name].attrs = {k: v for k, v in var.attrs.items() if k not in ("grid_mapping", "coordinates")}
        encoding: dict[str, Any] = {"chunks": tuple(c[0] for c in data.chunks), "compressors": compressors}
        encoding["_FillValue"] = np.nan if np.issubdtype(data.dtype, np.floating) else None
        if grid_mapping:
            # CF puts grid mappings outside ``coordinates``, so xarray would reopen ``spatial_ref`` as a data
            # variable and rioxarray would not find the CRS; listing it keeps ``xr.open_zarr(path).rio.crs`` working.
            encoding["grid_mapping"] = grid_mapping
            encoding["coordinates"] = grid_mapping
        out.variables[name].encoding = encoding
    return out


def _write_template(ds: xr.Dataset, store: str, fingerprint: str) -> None:
    template = ds.copy(deep=False)
    template.attrs = {**ds.attrs, FINGERPRINT_ATTR: fingerprint, COMPLETE_ATTR: False}
    template.to_zarr(store, mode="w", compute=False, consolidated=False, zarr_format=ZARR_FORMAT)


def _layout_matches(ds: xr.Dataset, store: str) -> bool:
    """Whether the store's arrays have the shapes, chunks and dtypes this dataset would write."""
    import zarr

    try:
        group = zarr.open_group(store, mode="r", use_consolidated=False)
        for name in ds.data_vars:
            array = group[name]
            data = ds[name].data
            if (tuple(array.shape) != tuple(data.shape) or tuple(array.chunks) != tuple(c[0] for c in data.chunks)
                    or np.dtype(array.dtype) != data.dtype):
                return False
    except Exception:  # an unreadable or foreign store is not ours to resume: start over
        return False
    return True


def _done_markers(markers: str, names: list[str]) -> dict[str, set[tuple[int, ...]]]:
    done: dict[str, set[tuple[int, ...]]] = {name: set() for name in names}
    for name in names:
        directory = _join(markers, name)
        if is_remote(directory):
            import fsspec.core

            fs, p = fsspec.core.url_to_fs(directory)
            entries = [e.rsplit("/", 1)[-1] for e in fs.ls(p, detail=False)] if fs.exists(p) else []
        else:
            entries = os.listdir(directory) if os.path.isdir(directory) else []
        for entry in entries:
            try:
                done[name].add(tuple(int(i) for i in entry.split(".")))
            except ValueError:
                continue
    return done


def _finish(store: str) -> None:
    """Mark complete, drop the markers, consolidate. Idempotent."""
    import zarr

    group = zarr.open_group(store, mode="r+", use_consolidated=False)
    group.attrs.update({COMPLETE_ATTR: True})
    remove(_join(store, MARKER_DIR.split("/")[0]))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        zarr.consolidate_metadata(store, zarr_format=ZARR_FORMAT)


def _swap_into_place(staging: str, path: str, *, may_replace: bool) -> None:
    path = path.rstrip("/")
    if os.path.lexists(path):
        if not may_replace:
            raise OutputExistsError(f"output {path} appeared during the run; set output.overwrite: true or choose "
                                    f"another path (the finished store is kept at {staging})")
        parent, name = os.path.split(os.path.abspath(path))
        old = os.path.join(parent, f".{name}.replaced-{uuid.uuid4().hex[:8]}")
        os.rename(path, old)
        try:
            os.rename(staging, path)
        except BaseException:
            os.rename(old, path)
            raise
        remove(old)
    else:
        os.rename(staging, path)


# --------------------------------------------------------------------------------------------------------------------
# the writer


def _compute_on(client: Any, todo: list, progress: Callable[[int, int], None] | None) -> None:
    """Compute on the cluster, reporting each finished block; the first failure is raised."""
    from distributed import as_completed, futures_of

    # persist() optimizes the collections together (as compute() would) and yields one future per output block.
    futures = futures_of(client.persist(todo))
    try:
        # bound to this client's loop: without it as_completed looks for a *default* client
        for count, future in enumerate(as_completed(futures, loop=client.loop), start=1):
            future.result()
            if progress is not None:
                progress(count, len(futures))
    finally:
        client.cancel(futures)


def write_zarr(
    ds: xr.Dataset,
    path: str,
    *,
    overwrite: bool = False,
    compression: str = "zstd",
    fingerprint: str,
    client: Any = None,
    progress: Callable[[int, int], None] | None = None,
) -> WriteResult:
    """Write a lazy Dataset to a Zarr store, chunk by chunk in parallel, atomically, resuming an interrupted run.

    Parameters
    ----------
    ds : xarray.Dataset
        Dask-backed data variables with identical dims ``(..., y, x)``; CRS and transform written with rioxarray.
    path : str
        The store: a local path (staged in ``<path>.partial``, renamed when complete) or an fsspec URL (in place).
    overwrite : bool
        Replace an existing output (only after the new one is complete, for local paths).
    compression : {"zstd", "deflate", "lz4", "none"}
        zstd (level 3), deflate (gzip codec, level 6), lz4 (Blosc-LZ4 with byte shuffle) or none. ``"lzw"`` is
        accepted and written as deflate (Zarr has no LZW codec), with a warning.
    fingerprint : str
        Identity of the job; a staging store with the same fingerprint is resumed, any other is discarded.
    client : distributed.Client, optional
        Where to compute; default: Dask's default scheduler (a global client if one exists).

    Raises
    ------
    OutputExistsError
        The output exists and ``overwrite`` is false.
    RunFailedError
        A block failed to compute or write; the staging store keeps every finished block for the next run.
    """
    if not fingerprint or not isinstance(fingerprint, str):
        raise ValueError("write_zarr needs the job's fingerprint (a non-empty string) to know what it may resume")
    path = str(path).rstrip("/")
    check_output_target(path, "zarr", overwrite=overwrite, fingerprint=fingerprint)
    codec = compression_name(compression, "zarr")
    remote = is_remote(path)
    store = path if remote else zarr_staging_path(path)
    prepared = _prepare(ds, codec)
    names = list(prepared.data_vars)

    # a local output that is itself an unfinished store of this job (e.g. left by an in-place write) may be replaced
    target_state = read_zarr_state(path) if not remote else None
    may_replace = overwrite or bool(target_state and not target_state.complete
                                    and target_state.fingerprint == fingerprint)

    state = read_zarr_state(store)
    resumable = (state is not None and state.fingerprint == fingerprint and _layout_matches(prepared, store))
    if not resumable:
        if exists(store):
            remove(store)
        if not remote:
            os.makedirs(os.path.dirname(os.path.abspath(store)), exist_ok=True)
        _write_template(prepared, store, fingerprint)
    complete = bool(resumable and state is not None and state.complete)

    markers = _join(store, MARKER_DIR)
    total = sum(math.prod(prepared[name].data.numblocks) for name in names)
    written = 0
    skipped = total if complete else 0
    if not complete:
        done = _done_markers(markers, names) if resumable else {name: set() for name in names}
        token = dask.base.tokenize(store, fingerprint, *(prepared[n].data.name for n in names))
        outs = []
        for name in names:
            data = prepared[name].data
            outs.append(da.map_blocks(
                _write_block, data, dtype=np.int8, chunks=tuple((1,) * len(c) for c in data.chunks),
                meta=np.empty((0,) * data.ndim, dtype=np.int8), name=f"rasterflow-write-zarr-{name}-{token}",
                store=store, var=name, markers=markers,
            ))
        pending = sum(len(d) for d in done.values())
        todo: list = []
        if pending == 0:
            todo = outs  # a fresh run: compute whole arrays, with Dask's array optimizations (blockwise fusion)
        else:
            # a resumed run: request only the missing blocks' keys; culling drops the finished blocks' upstream.
            # (No dask.optimize() here: optimizing the outputs together inlines shared inputs into each output.)
            for name, out in zip(names, outs):
                blocks = out.to_delayed(optimize_graph=False)
                for index in np.ndindex(blocks.shape):
                    if index in done[name]:
                        skipped += 1
                    else:
                        todo.append(blocks[index])
        try:
            if todo:
                if client is not None:
                    _compute_on(client, todo, progress)
                else:
                    dask.compute(*todo)
        except Exception as exc:
            raise RunFailedError(
                f"writing {path} failed: {type(exc).__name__}: {exc}. Finished blocks are kept in {store}; "
                f"rerunning the same job resumes from there."
            ) from exc
        written = total - skipped

    try:
        _finish(store)
        if not remote:
            _swap_into_place(store, path, may_replace=may_replace)
    except OutputExistsError:
        raise
    except Exception as exc:
        raise RunFailedError(f"finishing {path} failed: {type(exc).__name__}: {exc}") from exc
    return WriteResult(paths=(path,), bytes_written=path_size(path), blocks_written=written,
                       blocks_skipped=skipped, format="zarr")

"""Stream a lazy Dataset into a Zarr store, one Dask block per Zarr chunk, atomically and resumably.

Design
------
* Local paths are written into a staging store ``<path>.partial`` and renamed into place only when complete; an
  existing output is moved aside, the new store renamed in, and only then the old one deleted.
* fsspec URLs (``s3://bucket/prefix/out.zarr``) are staged the same way, under ``<path>.partial/``; an object store
  has no rename of a prefix, so the finished staging store is *copied* into place (server-side copies, no pixel
  travels through this process) in an order that never lets the final prefix look complete before it is:
  (1) an existing output's consolidated metadata is deleted, (2) the staging store's root metadata -- this job's
  fingerprint and ``rasterflow_complete: false`` -- is written over the output's, (3) objects of the old output that
  the new one does not have are deleted, (4) every array and chunk is copied, (5) ``rasterflow_complete: true`` and
  then the consolidated metadata are written at the final prefix, last, (6) the staging store is deleted. A reader
  that opens with consolidated metadata, or checks ``rasterflow_complete``, sees either the old complete output, a
  store saying it is incomplete, or the new complete one. A run killed at any step leaves at most an incomplete
  store of *this* job at the final prefix, which the next run of the same job (same fingerprint) replaces: it
  finds every block done in the staging store and only copies again. Why not write in place with the completeness
  attribute last: replacing an existing output (``if_exists: overwrite``) would then delete the old one before the
  new one is computed, and a failed run would leave neither; staged, the old output stays readable until the new
  one is complete, as with local paths.
* The store is created metadata-only first (``to_zarr(compute=False)``): array shapes, Zarr chunks equal to the Dask
  chunks, codec, the stored dtype with ``_FillValue`` (NaN by default) and ``scale_factor``/``add_offset`` when an
  :class:`~rasterflow.write.common.Encoding` asks, GDAL's ``_CRS`` attribute, coordinates (``y``, ``x``, leading
  dims, the scalar ``spatial_ref`` with the CRS and GeoTransform), the run's description (``metadata``) and the group
  attributes ``rasterflow_fingerprint`` and ``rasterflow_complete: false``.
* Every write region is then encoded and written by a worker, straight into its Zarr object, followed by an empty
  done-marker ``<store>/.rasterflow/done/<var>/<i>.<j>...``. A region is one Dask block = one Zarr chunk, or with
  Zarr v3 sharding one shard of up to ``side`` x ``side`` chunks, assembled from its Dask blocks by one task and
  written with one assignment. Each region belongs to exactly one task, so no two tasks ever write the same object
  (writing parts of one shard from several tasks would read-modify-write it concurrently and lose data, see
  pydata/xarray#10831). The task returns a one-element array: nothing pixel-sized travels to the client.
* Submission is bounded (:mod:`rasterflow.write.submit`): a few regions per worker thread in flight, a new batch
  when half of them finished, each batch's graph (its write tasks and their upstream) built from its own regions
  only; the futures of finished regions are released at once. The client and the scheduler hold O(regions in
  flight), not the job. Regions of one spatial position (every variable and leading index) go together, since they
  share their read-and-reduce task.
* Resume: a staging store with the same fingerprint and layout (shape, chunks, shards, dtype) that is not complete is
  reused; regions with a marker are not submitted, so their upstream tasks never run. Otherwise: start over.
* Finish: ``rasterflow_complete: true``, markers removed, metadata consolidated, renamed into place. Each step is
  idempotent, so a crash in between is finished by the next run.

Zarr format 2 is written by default, because it is what GIS tools open: the GDAL 3.10 inside the rasterio wheel
(and QGIS on top of it) reads these v2 stores georeferenced -- CRS from the ``_CRS`` attribute of each array (GDAL's
own convention for Zarr) and from the CF ``grid_mapping`` variable, transform from the regular ``x``/``y``
coordinate arrays, nodata from ``fill_value``, scale/offset from ``scale_factor``/``add_offset``; open a band as
``ZARR:"out.zarr":/ndvi``. It does *not* open the Zarr v3 stores zarr-python 3 writes ("Unsupported codec: bytes";
Debian's GDAL 3.6 does not know v3 at all). ``zarr_format=3`` remains available for xarray-only consumers; its
consolidated metadata (inside the root ``zarr.json``) is not yet part of the v3 specification: zarr-python warns when
writing it (silenced here), xarray reads it without a warning. Both formats carry CF metadata (``grid_mapping``,
``_FillValue``, ``scale_factor``/``add_offset``), so ``xr.open_zarr`` decodes physical values and rioxarray finds the
CRS and transform.

Sharding (format 3 only; :mod:`rasterflow.write.shards`): by default an array of more than ``SHARD_ABOVE_CHUNKS``
chunks is stored in shards of up to ``MAX_SHARD_SIDE`` x ``MAX_SHARD_SIDE`` chunks and at most ``SHARD_BYTES``
(``shards=``, the spec's ``output.zarr_shards``, sets the side; 1 turns it off), so a continental grid is thousands of
objects instead of millions. The chunks inside a shard stay individually readable (zarr-python reads the shard
index, then only the chunks asked for). Every chunk result of a shard is held until the shard is written, so the
writer keeps ``SHARDS_IN_FLIGHT`` shard positions in flight (the budget counts them, ``budget.held_for_shards``).
"""

from __future__ import annotations

import math
import os
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import dask
import dask.array as da
import numpy as np
import xarray as xr

from rasterflow.errors import OutputExistsError, RunFailedError
from rasterflow.write.common import (
    COMPLETE_ATTR,
    FINGERPRINT_ATTR,
    Encoding,
    WriteResult,
    check_output_target,
    compression_name,
    exists,
    is_complete_zarr,
    is_remote,
    filesystem,
    path_size,
    read_zarr_state,
    remove,
    spatial_dims,
    zarr_staging_path,
)
from rasterflow.write.regions import ZarrFormat, join as _join, write_region as _write_region
from rasterflow.write.shards import SHARDS_IN_FLIGHT, shard_side
from rasterflow.write.stac import BlockStats

if TYPE_CHECKING:  # pragma: no cover
    import numpy.typing as npt
    import zarr
    from distributed import Client
    from numcodecs.abc import Codec
    from zarr.abc.codec import BytesBytesCodec

    from rasterflow.layers import Task
    from rasterflow.write.submit import Key

__all__ = ["write_zarr", "is_complete_zarr", "ZARR_FORMAT", "ZARR_FORMATS", "MARKER_DIR"]

#: The default Zarr format: 2, the one GDAL (and so QGIS) opens; see the module docstring.
ZARR_FORMAT: ZarrFormat = 2
ZARR_FORMATS = (2, 3)
#: Done-markers live under ``<store>/<MARKER_DIR>/<var>/``; removed when the store is complete.
MARKER_DIR = ".rasterflow/done"


# --------------------------------------------------------------------------------------------------------------------
# helpers that run on workers


# --------------------------------------------------------------------------------------------------------------------
# preparing the dataset and the template


def _compressors(name: str, zarr_format: ZarrFormat) -> list[Codec] | list[BytesBytesCodec] | None:
    if zarr_format == 2:
        # numcodecs' codecs are the v2 ones; GDAL's Zarr driver decodes zstd, zlib and blosc
        import numcodecs

        if name == "zstd":
            return [numcodecs.Zstd(level=3)]
        if name == "deflate":
            return [numcodecs.Zlib(level=6)]
        if name == "lz4":
            return [numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)]
        return None
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


def _crs_attr(ds: xr.Dataset) -> dict[str, str] | None:
    """GDAL's ``_CRS`` array attribute (``{"wkt": ...}``), or None when the dataset has no CRS."""
    from rasterflow.georef import crs_of

    crs = crs_of(ds)
    return None if crs is None else {"wkt": crs.to_wkt()}


def _prepare(ds: xr.Dataset, compression: str, zarr_format: ZarrFormat = ZARR_FORMAT,
             encoding: Encoding | None = None, shards: int | None = None) -> tuple[xr.Dataset, Encoding, int]:
    """A shallow copy of ``ds`` with dask-backed, regularly chunked data variables and explicit Zarr encodings,
    the resolved encoding of the stored values and the chunks per shard side (1: no sharding)."""
    spatial_dims(ds)  # same dims everywhere, at least 2-D
    out = ds.copy(deep=False)
    for name, var in ds.variables.items():
        if name in ds.data_vars:
            continue
        if isinstance(var.data, da.Array):
            var = var.compute()  # coordinates are small: they are written with the template
            out = out.assign_coords({name: var})
        if var.dtype.kind == "U" and zarr_format == 3:
            # fixed-width UTF-32 has no Zarr v3 specification (zarr-python warns, other readers may fail);
            # object strings are written as the variable-length ``string`` type
            out = out.assign_coords({name: var.astype(object)})
    first = out[next(iter(out.data_vars))]
    grid_mapping = first.encoding.get("grid_mapping") or first.attrs.get("grid_mapping") or "spatial_ref"
    if grid_mapping not in out.coords or out[grid_mapping].ndim != 0:
        grid_mapping = None
    for name in out.variables:
        out.variables[name].encoding = {}
    compressors = _compressors(compression, zarr_format)
    computed = np.result_type(*(out[n].dtype for n in out.data_vars))
    if encoding is None and computed.kind in "iu":
        stored = Encoding(dtype=computed.name, nodata=None)  # integers as computed, every value valid (no fill)
    else:
        stored = (encoding or Encoding()).resolved(computed)
    crs_attr = _crs_attr(ds)
    side = 1
    for name in list(out.data_vars):
        band = out[name]
        data = band.data
        if not isinstance(data, da.Array):
            data = da.from_array(np.asarray(data), chunks=-1)
        fixes = {axis: max(c) for axis, c in enumerate(data.chunks) if not _regular(c)}
        if fixes:
            data = data.rechunk(fixes)
        out[name] = band.copy(data=data)
        out[name].attrs = {k: v for k, v in band.attrs.items() if k not in ("grid_mapping", "coordinates", "_CRS")}
        if crs_attr:
            out[name].attrs["_CRS"] = crs_attr  # what GDAL's Zarr driver reads for the CRS
        chunks = tuple(c[0] for c in data.chunks)
        var_encoding: dict[str, Any] = {"chunks": chunks, "compressors": compressors,
                                        "dtype": np.dtype(stored.dtype)}
        if zarr_format == 3:
            side = shard_side((chunks[-2], chunks[-1]), np.dtype(stored.dtype).itemsize,
                              (data.numblocks[-2], data.numblocks[-1]), shards)
            if side > 1:
                # one shard object holds side x side chunks; each shard is written whole by one task
                var_encoding["shards"] = chunks[:-2] + tuple(
                    c * min(side, n) for c, n in zip(chunks[-2:], data.numblocks[-2:]))
        elif shards not in (None, 1):
            raise ValueError("shards need Zarr format 3 (output.zarr_format: 3); format 2 has no sharding")
        # xarray writes these as CF attributes (fill_value for v2), and decodes them on open
        var_encoding["_FillValue"] = None if stored.nodata is None else np.dtype(stored.dtype).type(stored.nodata)
        if stored.is_scaled:
            var_encoding["scale_factor"] = stored.scale
            var_encoding["add_offset"] = stored.offset
        if grid_mapping:
            # CF puts grid mappings outside ``coordinates``, so xarray would reopen ``spatial_ref`` as a data
            # variable and rioxarray would not find the CRS; listing it keeps ``xr.open_zarr(path).rio.crs`` working.
            var_encoding["grid_mapping"] = grid_mapping
            var_encoding["coordinates"] = grid_mapping
        out.variables[name].encoding = var_encoding
    return out, stored, side


def _write_template(ds: xr.Dataset, store: str, fingerprint: str, zarr_format: ZarrFormat,
                    metadata: dict[str, Any] | None = None) -> None:
    template = ds.copy(deep=False)
    template.attrs = {**ds.attrs, **(metadata or {}), FINGERPRINT_ATTR: fingerprint, COMPLETE_ATTR: False}
    with warnings.catch_warnings():
        # the template's values are never computed, so xarray's "encoding NaN to an integer" warning is moot
        warnings.filterwarnings("ignore", category=RuntimeWarning)
        # safe_chunks=False: xarray writes no block of a data variable here (compute=False); each shard of several
        # Dask blocks is written later by exactly one task (_write_region), never by two at once
        template.to_zarr(store, mode="w", compute=False, consolidated=False, zarr_format=zarr_format,
                         safe_chunks=False)


def _layout_matches(ds: xr.Dataset, store: str, stored_dtype: npt.DTypeLike) -> bool:
    """Whether the store's arrays have the shapes, chunks, shards and dtypes this dataset would write."""
    import zarr

    try:
        group = zarr.open_group(store, mode="r", use_consolidated=False)
        for name in ds.data_vars:
            array = group[str(name)]
            data = ds[name].data
            if not isinstance(array, zarr.Array):
                return False
            if (tuple(array.shape) != tuple(data.shape) or tuple(array.chunks) != tuple(c[0] for c in data.chunks)
                    or np.dtype(array.dtype) != np.dtype(stored_dtype)):
                return False
            shards = array.shards
            expected = ds[name].encoding.get("shards")
            if (tuple(shards) if shards else None) != (tuple(expected) if expected else None):
                return False
    except Exception:  # an unreadable or foreign store is not ours to resume: start over
        return False
    return True


def _format_of(store: str) -> int | None:
    """The Zarr format of an existing store (None when it does not open)."""
    import zarr

    try:
        return int(zarr.open_group(store, mode="r", use_consolidated=False).metadata.zarr_format)
    except Exception:  # unreadable: not resumable
        return None


def _done_markers(markers: str, names: list[str]) -> dict[str, set[tuple[int, ...]]]:
    done: dict[str, set[tuple[int, ...]]] = {name: set() for name in names}
    for name in names:
        directory = _join(markers, name)
        if is_remote(directory):
            fs, p = filesystem(directory)  # a fresh listing: the markers were written by the workers
            entries = [e.rsplit("/", 1)[-1] for e in fs.ls(p, detail=False)] if fs.exists(p) else []
        else:
            entries = os.listdir(directory) if os.path.isdir(directory) else []
        for entry in entries:
            try:
                done[name].add(tuple(int(i) for i in entry.split(".")))
            except ValueError:
                continue
    return done


def _finish(store: str, zarr_format: ZarrFormat) -> None:
    """Complete the grid mapping's CF parameters, mark complete, drop the markers, consolidate. Idempotent."""
    import zarr

    group = zarr.open_group(store, mode="r+", use_consolidated=False)
    _complete_grid_mapping(group)
    group.attrs.update({COMPLETE_ATTR: True})
    remove(_join(store, MARKER_DIR.split("/")[0]))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        zarr.consolidate_metadata(store, zarr_format=zarr_format)


def _complete_grid_mapping(group: zarr.Group) -> None:
    """Add the CF grid-mapping parameters to the store's grid mapping (``rasterflow.georef``: the graph writes its
    WKT and GeoTransform, pyproj is loaded only now, after the compute)."""
    from rasterflow.georef import GRID_MAPPING, cf_grid_mapping, needs_cf

    if GRID_MAPPING not in group:
        return
    mapping = group[GRID_MAPPING]
    attrs = dict(mapping.attrs)
    if needs_cf(attrs):
        mapping.attrs.update({**cf_grid_mapping(str(attrs["crs_wkt"])), **attrs})


#: Root metadata objects of a Zarr group (v2: group marker and attributes; v3: both in ``zarr.json``).
_ROOT_KEYS = frozenset({".zgroup", ".zattrs", "zarr.json"})
#: Consolidated metadata of a v2 store (v3 keeps it inside the root ``zarr.json``).
_CONSOLIDATED_V2 = ".zmetadata"


def _publish_remote(staging: str, path: str, *, may_replace: bool, zarr_format: ZarrFormat) -> None:
    """Copy a finished staging store on an object store into place, completeness last (see the module docstring).

    Every step is idempotent: a run killed in between is finished by the next run of the same job.
    """
    fs, src = filesystem(staging)
    _, dst = filesystem(path)
    src, dst = src.rstrip("/"), dst.rstrip("/")
    marker_root = MARKER_DIR.split("/")[0] + "/"
    relative = sorted(p[len(src) + 1:] for p in fs.find(src) if p.startswith(src + "/"))
    relative = [r for r in relative if not r.startswith(marker_root) and r != _CONSOLIDATED_V2]
    root = [r for r in relative if r in _ROOT_KEYS]
    body = [r for r in relative if r not in _ROOT_KEYS]
    if not root:
        raise RunFailedError(f"the staging store {staging} has no root metadata; rerun to write it again")
    old = [p[len(dst) + 1:] for p in fs.find(dst) if p.startswith(dst + "/")] if fs.exists(dst) else []
    if old:
        if not may_replace:
            raise OutputExistsError(f"output {path} appeared during the run; set output.overwrite: true or choose "
                                    f"another path (the finished store is kept at {staging})")
        if _CONSOLIDATED_V2 in old:  # (1) the old output stops claiming to be complete to consolidated readers
            fs.rm_file(_join(dst, _CONSOLIDATED_V2))
    # (2) this job's root metadata, incomplete: from here on the prefix is "job F, unfinished" (resumable)
    fs.copy([_join(src, r) for r in root], [_join(dst, r) for r in root])
    stale = sorted(set(old) - set(root) - set(body) - {_CONSOLIDATED_V2})
    if stale:  # (3) arrays or chunks the new output does not have (another layout, a dropped band)
        fs.rm([_join(dst, r) for r in stale])
    if body:  # (4) arrays and chunks, server-side
        fs.copy([_join(src, r) for r in body], [_join(dst, r) for r in body])
    _finish(path, zarr_format)  # (5) rasterflow_complete: true, then the consolidated metadata
    remove(staging)  # (6)


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


def _writer_key(name: str, token: str) -> str:
    """The Dask key name of the write tasks of array ``name``."""
    return f"rasterflow-write-zarr-{name}-{token}"


def _write_units(prepared: xr.Dataset, names: list[str], done: dict[str, set[tuple[int, ...]]], side: int, *,
                 store: str, markers: str, zarr_format: ZarrFormat, encoding: Encoding | None,
                 token: str, lead_groups: Sequence[int] | None = None,
                 ) -> tuple[Callable[[Key], Task | None], Callable[[Key], int], Iterator[list[Key]], int, int]:
    """The write tasks of the job, made per batch: a task maker (Dask's graph specification: a tuple with the
    function first), the units (the regions of one spatial position: every variable and leading index, as they
    share their upstream tasks; with ``lead_groups`` every variable of one run of leading indices along the first
    leading axis, in runs of these counts), the Dask blocks of a region's key, and the counts of Dask blocks to
    write and already done. A region is one Zarr chunk, or with shards one shard of up to ``side`` x ``side``
    chunks."""
    from dask.utils import apply

    first = prepared[names[0]].data
    lead_blocks: tuple[int, ...] = first.numblocks[:-2]
    ny: int = first.numblocks[-2]
    nx: int = first.numblocks[-1]
    sy, sx = -(-ny // side), -(-nx // side)  # write regions (shards) per axis
    offsets = [np.concatenate([[0], np.cumsum(c)]).astype(int) for c in first.chunks]
    writers = {_writer_key(name, token): name for name in names}
    inputs = {name: prepared[name].data.name for name in names}
    leads = list(np.ndindex(*lead_blocks))
    groups = [leads]
    if lead_groups is not None:
        edges = np.concatenate([[0], np.cumsum(lead_groups)]).astype(int)
        if lead_blocks and edges[-1] == lead_blocks[0]:
            groups = [[lead for lead in leads if start <= lead[0] < stop]
                      for start, stop in zip(edges[:-1], edges[1:])]

    def blocks_in(si: int, sj: int) -> int:
        return (min(ny, (si + 1) * side) - si * side) * (min(nx, (sj + 1) * side) - sj * side)

    def weight(key: Key) -> int:
        return blocks_in(key[-2], key[-1])

    def task(key: Key) -> Task | None:
        if not (isinstance(key, tuple) and key and key[0] in writers):
            return None
        name = writers[key[0]]
        *lead, si, sj = key[1:]
        rows = range(si * side, min(ny, (si + 1) * side))
        cols = range(sj * side, min(nx, (sj + 1) * side))
        blocks = [(inputs[name], *lead, i, j) for i in rows for j in cols]
        region = tuple((int(offsets[axis][k]), int(offsets[axis][k + 1])) for axis, k in enumerate(lead)) + (
            (int(offsets[-2][rows.start]), int(offsets[-2][rows.stop])),
            (int(offsets[-1][cols.start]), int(offsets[-1][cols.stop])),
        )
        kwargs = dict(store=store, var=name, markers=markers, zarr_format=zarr_format, encoding=encoding,
                      region=region, marker=".".join(str(int(i)) for i in (*lead, si, sj)), columns=len(cols))
        return (apply, _write_region, [blocks], kwargs)

    def units() -> Iterator[list[Key]]:
        for si in range(sy):
            for sj in range(sx):
                for group in groups:
                    unit = [(writer, *lead, si, sj) for writer, name in writers.items() for lead in group
                            if (*lead, si, sj) not in done[name]]
                    if unit:
                        yield unit

    skipped = sum(blocks_in(index[-2], index[-1]) for name in names for index in done[name]
                  if len(index) == len(lead_blocks) + 2
                  and all(0 <= k < n for k, n in zip(index, (*lead_blocks, sy, sx))))
    total = len(leads) * ny * nx * len(names)
    return task, weight, units(), total - skipped, skipped


def write_zarr(
    ds: xr.Dataset,
    path: str,
    *,
    overwrite: bool = False,
    compression: str = "zstd",
    fingerprint: str,
    client: Client | None = None,
    progress: Callable[[int, int], None] | None = None,
    zarr_format: ZarrFormat = ZARR_FORMAT,
    encoding: Encoding | None = None,
    metadata: dict[str, Any] | None = None,
    shards: int | None = None,
    fused: bool = False,
    place_reads: bool = False,
    lead_groups: Sequence[int] | None = None,
) -> WriteResult:
    """Write a lazy Dataset to a Zarr store, chunk by chunk in parallel, atomically, resuming an interrupted run.

    Parameters
    ----------
    ds : xarray.Dataset
        Dask-backed data variables with identical dims ``(..., y, x)``; CRS and transform written with rioxarray.
    path : str
        The store: a local path (staged in ``<path>.partial``, renamed when complete) or an fsspec URL (staged in
        ``<path>.partial/``, copied into place when complete, completeness written last).
    overwrite : bool
        Replace an existing output, only after the new one is complete.
    compression : {"zstd", "deflate", "lz4", "none"}
        zstd (level 3), deflate (gzip codec, level 6), lz4 (Blosc-LZ4 with byte shuffle) or none. ``"lzw"`` is
        accepted and written as deflate (Zarr has no LZW codec), with a warning.
    fingerprint : str
        Identity of the job; a staging store with the same fingerprint is resumed, any other is discarded.
    client : distributed.Client, optional
        Where to compute; default: Dask's default scheduler (a global client if one exists).
    zarr_format : {2, 3}
        2 (default) opens in GDAL/QGIS and xarray; 3 in xarray only (see the module docstring).
    encoding : Encoding, optional
        Stored dtype, scale, offset and nodata (default: the computed float dtype, NaN). Written as CF
        ``_FillValue``/``scale_factor``/``add_offset``, so readers decode physical values.
    metadata : dict, optional
        Extra group attributes (JSON values): time range, method, item count, versions...
    shards : int, optional
        Zarr format 3 only: chunks per shard side (1: no sharding). Default: :func:`~rasterflow.write.shards.shard_side`
        (none up to 1,024 chunks per array, above that the largest power of two up to 8 whose shard holds at most
        64 MiB), so a large grid is a manageable number of objects. Each shard is assembled from its Dask blocks and
        written whole by one task.
    fused : bool
        The blocks come from the fused path (one task makes every variable of a chunk): keep a chunk per cluster
        thread and :data:`~rasterflow.write.submit.QUEUED_UNITS` more in flight even when one chunk's variables
        fill the cap on blocks (not with shards).
    place_reads : bool
        The blocks come from the tree path (a chunk's band tasks per time chunk, their partials combined): a chunk
        per cluster thread is in flight even when one chunk's blocks (its periods x variables) fill the cap; on
        worker processes that read remote files, each chunk's band tasks go to a worker the writer picks, their
        reads started there first (not with shards; :func:`rasterflow.write.submit.run_units`).
    lead_groups : sequence of int, optional
        The blocks along the first leading axis that share their upstream task, in runs of these counts (the series
        whose reads the writer places: the dates of each band task, :attr:`rasterflow.planning.JobPlan.places_reads`):
        each run of a chunk is a unit of its own, computed as one task (its band task, then its dates' writes) and,
        on worker processes that read remote files, sent to a worker the writer picks, its reads started there first,
        one running and one queued per worker thread (not with shards). Without it a chunk's leading blocks are one
        unit (a season's 36 dates would fill the cap alone, one chunk at a time).

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
    if zarr_format not in ZARR_FORMATS:
        raise ValueError(f"zarr_format must be 2 or 3, got {zarr_format!r}")
    codec = compression_name(compression, "zarr")
    remote = is_remote(path)
    store = zarr_staging_path(path)  # staged for local paths and object stores alike
    prepared, stored, side = _prepare(ds, codec, zarr_format, encoding, shards)
    assert stored.dtype is not None  # _prepare resolves the encoding's dtype
    # float output without scaling is written as computed: no per-block encoding work
    computed = np.result_type(*(prepared[n].dtype for n in prepared.data_vars))
    as_computed = (not stored.is_scaled and np.dtype(stored.dtype) == computed
                   and (stored.nodata is None or np.isnan(stored.nodata)))
    block_encoding = None if as_computed else stored
    names = [str(name) for name in prepared.data_vars]

    # an output that is itself an unfinished store of this job (left by an in-place write, or by a copy into place
    # on an object store that was cut short) may be replaced
    target_state = read_zarr_state(path)
    may_replace = overwrite or bool(target_state and not target_state.complete
                                    and target_state.fingerprint == fingerprint)

    state = read_zarr_state(store)
    resumable = (state is not None and state.fingerprint == fingerprint
                 and _layout_matches(prepared, store, stored.dtype) and _format_of(store) == zarr_format)
    if not resumable:
        if exists(store):
            remove(store)
        if not remote:
            os.makedirs(os.path.dirname(os.path.abspath(store)), exist_ok=True)
        _write_template(prepared, store, fingerprint, zarr_format, metadata)
    complete = bool(resumable and state is not None and state.complete)

    markers = _join(store, MARKER_DIR)
    written = skipped = 0
    statistics: dict[str, dict[tuple[int, ...], BlockStats]] = {}
    if complete:
        skipped = sum(math.prod(prepared[name].data.numblocks) for name in names)
    else:
        from rasterflow.write import submit

        done = _done_markers(markers, names) if resumable else {name: set() for name in names}
        token = dask.base.tokenize(store, fingerprint, side, *(prepared[n].data.name for n in names))
        task, weight, units, todo, skipped = _write_units(
            prepared, names, done, side, store=store, markers=markers, zarr_format=zarr_format,
            encoding=block_encoding, token=token, lead_groups=lead_groups if side <= 1 else None)
        client = submit.default_client(client)
        writer_names = {_writer_key(name, token): name for name in names}

        def keep_statistics(key: Key, chunks: Mapping[tuple[int, ...], BlockStats]) -> None:
            statistics.setdefault(writer_names[key[0]], {}).update(chunks)

        build = submit.BlockTasks([prepared[n].data for n in names], task)
        try:
            # a bounded number of regions in flight, each batch's graph built from its regions only; with shards
            # the cap counts the chunks held until their shard is written: SHARDS_IN_FLIGHT shard positions
            cap = submit.in_flight_cap(client)
            if side > 1:
                leads = math.prod(prepared[names[0]].data.numblocks[:-2])
                cap = max(cap, SHARDS_IN_FLIGHT * len(names) * leads * side * side)
            # the fused path: every thread has a chunk to run even when one chunk's variables fill the cap (a
            # geomedian's 8 on 2 threads ran one chunk at a time); its queued chunks hold nothing until they run. Not
            # with shards (a shard's chunks are held until it is written: the cap alone bounds them) nor on the tree
            # and series paths, whose next chunk's band tasks would run beside the held blocks of the first
            # (budget_accuracy.py rows 17, 20, 29: measured up to 1.45x the projection)
            whole = (fused or lead_groups is not None) and side <= 1
            floor = submit.cluster_threads(client) + submit.QUEUED_UNITS if whole else 1
            if place_reads and side <= 1:
                # the tree path: a chunk per thread however many blocks it holds (a monthly mean has a block per
                # month of the window: 24 over two years filled the cap alone, one chunk at a time at half the
                # threads, 42 s against 30 s on the season's 2 workers), but none queued: a queued chunk's band
                # tasks ran beside the first's held blocks (budget_accuracy.py row 17: 1.49x the projection with
                # threads + 1, 1.00 with threads)
                floor = submit.cluster_threads(client)
            # and on the fused path a chunk's read-and-reduce and its variables' writes are one task: its result is
            # never held on a worker waiting for the writes while the thread starts the next chunk
            written = submit.run_units(units, build, total=todo, client=client, progress=progress, weight=weight,
                                       max_in_flight=cap, on_result=keep_statistics, min_units=floor,
                                       one_task_per_unit=whole,
                                       place_reads=place_reads and side <= 1)
        except Exception as exc:
            raise RunFailedError(
                f"writing {path} failed: {type(exc).__name__}: {exc}. Finished blocks are kept in {store}; "
                f"rerunning the same job resumes from there."
            ) from exc

    try:
        if remote:
            _publish_remote(store, path, may_replace=may_replace, zarr_format=zarr_format)
        else:
            _finish(store, zarr_format)
            _swap_into_place(store, path, may_replace=may_replace)
    except OutputExistsError:
        raise
    except Exception as exc:
        raise RunFailedError(f"finishing {path} failed: {type(exc).__name__}: {exc}") from exc
    return WriteResult(paths=(path,), bytes_written=path_size(path), blocks_written=written,
                       blocks_skipped=skipped, format="zarr", statistics=statistics)

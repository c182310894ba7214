"""Stream a lazy Dataset into Cloud-Optimized GeoTIFFs: one file per entry of the leading dims, one band per variable.

How it streams
--------------
When the layout allows it (``average`` overviews of float results, chunks that cover whole COG tiles:
:func:`rasterflow.write.cogtiles.fast_layout`), the worker tasks compress the tiles themselves and this process
assembles them behind GDAL's own header (:mod:`rasterflow.write.cogtiles`, :mod:`rasterflow.write.cogassembly`):
no pass over the raster after the last block (:class:`WorkerTiledCog`). Otherwise, and with
``RASTERFLOW_COG_WRITER=gdal`` (:class:`StreamedCog`), as ``rio.to_raster(driver="COG")`` loads the whole raster
first (STACK-NOTES), the COG is made in two steps:

1. A tiled, compressed GTiff per output file is filled block by block. Blocks are computed on the cluster (the
   given ``distributed.Client``, a global one, or a local thread pool) and each finished block is written by *this*
   process with rasterio, then released. At most ``2 × threads`` blocks are in flight, so memory stays bounded and
   workers never need to see the output filesystem (works with a remote cluster). Blocks are submitted in bounded
   batches (:mod:`rasterflow.write.submit`), each batch's graph built from its own blocks only, so the client and
   the scheduler hold O(blocks in flight), not the whole job.
2. ``rasterio.shutil.copy(..., driver="COG")`` turns it into a COG with overviews under ``GDAL_CACHEMAX``, into a
   hidden temporary file next to the output, which is renamed onto the output only when every file is done.
   For an fsspec URL (``s3://bucket/prefix/out.tif``) both files are made in a local scratch directory and each
   finished COG is uploaded in one go (one PUT, or a multipart upload for large files, which S3 shows only once
   complete), then its size and checksum are compared with the local file's
   (:func:`~rasterflow.write.common.upload_verified`); without ``overwrite`` the PUT is conditional, so an object
   that appeared meanwhile is kept.

A failure anywhere deletes the temporary files; nothing is ever written at an output path before it is complete.

Encoding: blocks are encoded (:class:`~rasterflow.write.common.Encoding`: dtype, scale, offset, nodata) just before
they are written, and the scale, offset and nodata are set on every band, so ``rasterio``'s ``scales``/``offsets``
and GDAL (``gdalinfo``, QGIS) give the physical values back. The run's description (time range, method, item count,
expressions, versions) goes into the dataset tags.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import dask.array as da
import numpy as np
import numpy.typing as npt
import rasterio
import rasterio.shutil
import xarray as xr
from rasterio.windows import Window

from rasterflow.errors import RunFailedError
from rasterflow.georef import crs_of, transform_of
from rasterflow.layers import stack_blocks
from rasterflow.write import cogtiles
from rasterflow.write.cogassembly import Assembly, check_template, make_template
from rasterflow.write.common import (
    Encoding,
    WriteResult,
    check_output_target,
    cog_entries,
    compression_name,
    encode_block,
    is_remote,
    leading_dims,
    path_size,
    publish,
    remove,
    spatial_dims,
    upload_verified,
)

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client
    from rasterio.io import DatasetWriter

    from rasterflow.layers import Task
    from rasterflow.write.stacstats import BlockStats
    from rasterflow.write.submit import Key

__all__ = ["StreamedCog", "WorkerTiledCog", "write_cog"]

#: Upper bound on the bytes of one unit of submission (leading-dim entries of one spatial block, when they fit).
BATCH_BYTES = 128 * 2**20
#: Finished blocks in flight per worker thread when they travel to this process whole (GDAL's copy), so fewer than
#: the Zarr writer's.
COG_INFLIGHT_PER_THREAD = 2
#: The same when the workers compress the tiles (:mod:`rasterflow.write.cogtiles`): what travels is compressed and
#: spooled at once, so as many as the Zarr writer's (10980² season: the compute 0.6 s shorter than with 2).
TILES_INFLIGHT_PER_THREAD = 4
_RESAMPLINGS = ("nearest", "average", "bilinear", "cubic", "cubicspline", "lanczos", "mode", "rms")
#: ``predictor`` -> the COG driver's PREDICTOR creation option
_PREDICTORS = {"auto": "YES", "none": "NO", "standard": "STANDARD", "floating_point": "FLOATING_POINT"}


def copy_threads() -> int:
    """Threads GDAL's COG driver compresses tiles and builds overviews with: the cores this process may run on
    (what the budget counts for the copy, ``budget.cog_copy_bytes``)."""
    from rasterflow.sizing import local_machine

    return max(1, local_machine().cores)


def _stream_name(final: str, token: str) -> str:
    # unique per run (token): an overlapping run can never touch this run's temp files
    directory, name = os.path.split(final)
    return os.path.join(directory, f".{name}.rasterflow-stream-{token}.tif")


def _scratch_name(final: str, token: str, what: str) -> str:
    directory, name = os.path.split(final)
    return os.path.join(directory, f".{name}.rasterflow-{what}-{token}")


def _partial_name(final: str, token: str) -> str:
    directory, name = os.path.split(final)
    return os.path.join(directory, f".{name}.rasterflow-partial-{token}.tif")


#: Local scratch directories of remote COG writes: ``<tmp>/rasterflow-cog-<pid>-<random>``.
_SCRATCH_PREFIX = "rasterflow-cog-"


def _remove_dead_scratch() -> None:
    """Delete the scratch directories of killed remote COG writes on this host (their pid is gone).

    A SIGKILL leaves the local files of a remote write behind (nothing reached the object store): without this, each
    killed nightly run would leave a COG-sized directory in the temporary directory.
    """
    from rasterflow.lock import pid_alive

    base = tempfile.gettempdir()
    try:
        names = os.listdir(base)
    except OSError:  # pragma: no cover - no temp dir to look at
        return
    for name in names:
        if not name.startswith(_SCRATCH_PREFIX):
            continue
        pid = name[len(_SCRATCH_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def _tile_size(chunks: tuple[int, ...], blocksize: int) -> int:
    """A GTiff tile edge that divides the Dask chunk edge, so block windows are tile-aligned when possible."""
    size = chunks[0]
    if len(chunks) > 1 and size % 16 == 0:
        for tile in range(min(size, 1024), 15, -16):
            if size % tile == 0:
                return tile
    return blocksize


def _cube(ds: xr.Dataset, names: list[str], nlead: int) -> da.Array:
    """``(*leading, band, y, x)``, chunked 1 along leading dims and whole along bands."""
    arrays: list[da.Array] = []
    for name in names:
        data = ds[name].data
        if not isinstance(data, da.Array):
            data = da.from_array(np.asarray(data), chunks=(1,) * nlead + (-1, -1))
        arrays.append(data)
    dtype = np.result_type(*(a.dtype for a in arrays))
    if all(a.chunks[-2:] == arrays[0].chunks[-2:] for a in arrays):
        # one lazy layer (layers.stack_blocks): Dask's stack + rechunk would hold ~3.6 KB per chunk of a 3-band job
        return stack_blocks(arrays, nlead, dtype)
    cube: da.Array = da.stack([a.astype(dtype, copy=False) for a in arrays], axis=nlead)
    rechunked: da.Array = cube.rechunk({**{axis: 1 for axis in range(nlead)}, nlead: len(names)})
    return rechunked


def _stream_blocks(cube: da.Array, nlead: int, client: Client | None,
                   write: Callable[[tuple[int, ...], int, int, Any], None],
                   progress: Callable[[int, int], None] | None = None, results: da.Array | None = None,
                   per_thread: int = COG_INFLIGHT_PER_THREAD, fused: bool = False, place_reads: bool = False) -> int:
    """Compute every block of ``cube`` and hand it to ``write(lead_index, i, j, block)``; returns blocks written.
    With ``results`` (an array of ``cube``'s blocks, e.g. :func:`_tile_tasks`) its blocks are what is handed over.

    Bounded (:func:`rasterflow.write.submit.run_units`): at most ``per_thread`` blocks per worker thread
    in flight, each batch's graph made from its own blocks only, each block fetched, written and released as it
    finishes.

    ``fused``: the blocks come from the fused path (one task makes every leading entry of a chunk); ``place_reads``:
    from the tree path (a chunk's band tasks per time chunk, their partials). Where worker processes read remote
    files (:func:`rasterflow.write.placement.places_units`) and a chunk's entries make one unit (no more than the
    batch's bytes and the cap allow), the chunk goes to a worker that starts its reads before they run, as the Zarr
    writer does: fused as one task; from the tree path with every task of it, where the cap lets every worker have
    a chunk (:func:`rasterflow.write.submit.run_units`). More entries keep a task each and are not placed.
    """
    from rasterflow.write import submit

    lead_indices = list(np.ndindex(*cube.numblocks[:nlead]))
    ny, nx = cube.numblocks[-2:]
    unit_bytes = cube.dtype.itemsize * cube.shape[nlead] * max(cube.chunks[-2]) * max(cube.chunks[-1])
    max_inflight = submit.in_flight_cap(client, per_thread)
    group = max(1, min(max_inflight, BATCH_BYTES // max(1, unit_bytes)))
    collection = cube if results is None else results
    name = collection.name
    build = submit.BlockTasks([collection])
    # where a chunk's entries are one unit already (within the batch's bytes and the cap), its read-and-reduce and
    # its entries run as one task, on the worker its reads were started on
    placed = (fused or place_reads) and client is not None and len(lead_indices) <= group and submit.places_units(
        client, build, [(name, *lead, 0, 0, 0) for lead in lead_indices])

    def units() -> Iterator[list[Key]]:
        # one unit: entries of the leading dims of one spatial block (they share the block's read-and-reduce task)
        for i in range(ny):
            for j in range(nx):
                for start in range(0, len(lead_indices), group):
                    yield [(name, *lead, 0, i, j) for lead in lead_indices[start:start + group]]

    def on_result(key: Key, block: Any) -> None:
        write(tuple(key[1:1 + nlead]), key[-2], key[-1], np.asarray(block) if results is None else block)

    return submit.run_units(units(), build, total=len(lead_indices) * ny * nx, client=client,
                            max_in_flight=max_inflight, on_result=on_result, progress=progress,
                            min_units=submit.cluster_threads(client) + submit.QUEUED_UNITS if placed and fused
                            else None, one_task_per_unit=placed and fused, place_reads=placed and not fused)


def _tile_tasks(cube: da.Array, layout: cogtiles.TileLayout) -> da.Array:
    """An array of ``cube``'s blocks made into COG tiles (:func:`rasterflow.write.cogtiles.block_tiles`): one lazy
    layer, each task taking its block of ``cube``."""
    import dask

    from rasterflow.layers import lazy_array

    name = "rasterflow-cogtiles-" + dask.base.tokenize(cube.name, layout)
    return lazy_array(name, cube.numblocks, _TileTasks(cube.name, layout), cube.chunks, object, [cube])


class _TileTasks:
    """The task of block ``(*lead, 0, i, j)`` of :func:`_tile_tasks`: that block of the cube made into tiles."""

    def __init__(self, source: str, layout: cogtiles.TileLayout):
        self.source, self.layout = source, layout

    def __call__(self, block: tuple[int, ...]) -> Task:
        return (cogtiles.block_tiles, (self.source, *block), block[-2], block[-1], self.layout)



def _tag_text(value: Any) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value)


def _label_text(value: Any) -> str:
    if isinstance(value, (np.floating, float)):
        return f"{float(value):g}"
    return str(value.item() if hasattr(value, "item") else value)


@dataclass
class _CogJob:
    """A checked :func:`write_cog` call: what both writers need."""

    ds: xr.Dataset
    path: str
    entries: list[tuple[dict[Hashable, int], dict[Hashable, Any], str]]
    lead: tuple[Hashable, ...]
    names: list[str]
    cube: da.Array
    stored: Encoding
    codec: str
    needs_encoding: bool
    client: Client | None
    overwrite: bool
    gdal_cachemax: int
    progress: Callable[[int, int], None] | None
    profile: dict[str, Any]
    cog_options: dict[str, Any]
    metadata: Mapping[str, Any] | None
    file_metadata: Mapping[str, Mapping[str, Any]] | None
    fused: bool = False
    """The blocks come from the fused path (see :func:`_stream_blocks`)."""
    place_reads: bool = False
    """The blocks come from the tree path (see :func:`_stream_blocks`)."""

    @property
    def paths(self) -> list[str]:
        return [p for _pos, _labels, p in self.entries]


class _CogWriter:
    """What both COG writers do: name the temporary files, open the stream files with their tags and band labels,
    publish the finished files and clean up after a failure. Subclasses fill the partial files (:meth:`_fill`)."""

    def __init__(self, job: _CogJob):
        self.job = job
        self.remote = is_remote(job.path)
        self.profile = dict(job.profile)
        self.scratch: str | None = None
        self.locals_: list[str] = []  # where each final file is assembled locally
        self.stream_files: list[str] = []
        self.partial_files: list[str] = []
        self.datasets: list[DatasetWriter] = []
        self.checksums: dict[str, str] = {}
        self.index_of = {positions_key: k for k, positions_key in
                         enumerate(tuple(pos[d] for d in job.lead) for pos, _labels, _p in job.entries)}

    def write(self) -> WriteResult:
        """Write every file of the job; returns what was written.

        Raises
        ------
        RunFailedError
            A block failed to compute or a file failed to write; no output and no temporary file is left behind.
        """
        job = self.job
        self._place()
        try:
            with rasterio.Env(GDAL_CACHEMAX=int(job.gdal_cachemax)):
                self._open_streams()
                written = self._fill()
            self._publish()
        except BaseException as exc:
            self._release()
            for f in self._temporary_files():
                try:
                    remove(f)
                except OSError:  # pragma: no cover - best effort
                    pass
            if self.scratch:
                shutil.rmtree(self.scratch, ignore_errors=True)
            if isinstance(exc, Exception):
                raise RunFailedError(f"writing {job.path} failed: {type(exc).__name__}: {exc}") from exc
            raise
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
        paths = job.paths
        return WriteResult(paths=tuple(paths), bytes_written=sum(path_size(p) for p in paths), blocks_written=written,
                           blocks_skipped=0, format="cog", checksums=self.checksums, statistics=self._statistics())

    def _place(self) -> None:
        """The local file of each output (in a scratch directory for a remote output) and the temporary names."""
        if self.remote:
            _remove_dead_scratch()
            self.scratch = tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-")
        for final in self.job.paths:
            if self.scratch is not None:
                self.locals_.append(os.path.join(self.scratch, f"{len(self.locals_)}-{os.path.basename(final)}"))
            else:
                os.makedirs(os.path.dirname(os.path.abspath(final)), exist_ok=True)
                self.locals_.append(final)
        token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.stream_files = [_stream_name(p, token) for p in self.locals_]
        self.partial_files = [_partial_name(p, token) for p in self.locals_]
        self._name_more(token)

    def _name_more(self, token: str) -> None:
        """Name the writer's own temporary files."""

    def _temporary_files(self) -> list[str]:
        return self.stream_files + self.partial_files

    def _open_streams(self) -> None:
        """Open each file's tiled GTiff with its band descriptions, scales and tags (carried into the COG)."""
        job = self.job
        names, stored = job.names, job.stored
        common_tags = {str(k): _tag_text(v) for k, v in (job.metadata or {}).items()}
        for (_pos, labels, final), stream in zip(job.entries, self.stream_files):
            dst = rasterio.open(stream, "w", **self.profile)
            self.datasets.append(dst)
            for band, name in enumerate(names, start=1):
                dst.set_band_description(band, name)
                expression = job.ds[name].attrs.get("rasterflow_expression")
                if expression:
                    dst.update_tags(band, rasterflow_expression=str(expression))
            if stored.is_scaled:
                dst.scales = (stored.scale,) * len(names)
                dst.offsets = (stored.offset,) * len(names)
            extra = {str(k): _tag_text(v) for k, v in ((job.file_metadata or {}).get(final) or {}).items()}
            dst.update_tags(**{**common_tags, **extra, "rasterflow_bands": ",".join(names),
                               **{str(d): _label_text(v) for d, v in labels.items()}})

    def _close_streams(self) -> None:
        while self.datasets:
            self.datasets.pop().close()

    def _fill(self) -> int:
        """Make each file's COG at its partial path; returns the blocks computed."""
        raise NotImplementedError

    def _publish(self) -> None:
        for partial, local, final in zip(self.partial_files, self.locals_, self.job.paths):
            if self.remote:
                # one PUT (multipart when large), then size and checksum compared with the local file
                self.checksums[final] = upload_verified(partial, final, replace=self.job.overwrite)
                remove(partial)
            else:
                publish(partial, local, replace=self.job.overwrite)  # never replaces what appeared meanwhile unless asked

    def _release(self) -> None:
        """Close what is open after a failure, before its files are deleted."""
        for dst in self.datasets:
            try:
                dst.close()
            except Exception:  # pragma: no cover - best effort
                pass

    def _statistics(self) -> dict[str, Mapping[tuple[int, ...], BlockStats]]:
        return {}


class StreamedCog(_CogWriter):
    """The client writes each finished block into its file's stream GTiff, then GDAL's COG driver copies each file.

    Parameters
    ----------
    job : _CogJob
        The checked :func:`write_cog` call.
    """

    def _fill(self) -> int:
        job = self.job
        cube, names, stored = job.cube, job.names, job.stored
        row_offsets = np.concatenate([[0], np.cumsum(cube.chunks[-2])]).astype(int)
        col_offsets = np.concatenate([[0], np.cumsum(cube.chunks[-1])]).astype(int)

        def write(lead_index: tuple[int, ...], i: int, j: int, block: npt.NDArray[Any]) -> None:
            dst = self.datasets[self.index_of[tuple(lead_index)]]
            block = block.reshape(block.shape[-3:])
            if job.needs_encoding:
                block = np.stack([encode_block(block[k], stored, names[k]) for k in range(len(names))])
            window = Window(int(col_offsets[j]), int(row_offsets[i]), block.shape[-1], block.shape[-2])
            dst.write(block, window=window)

        written = _stream_blocks(cube, len(job.lead), job.client, write, job.progress, fused=job.fused,
                                 place_reads=job.place_reads)
        self._close_streams()
        # NUM_THREADS parallelizes the tiles' compression; GDAL_NUM_THREADS also the overviews' computation,
        # which is otherwise one thread (same bytes, ~1 s of 10.5 faster on the season's 10980² output)
        with rasterio.Env(GDAL_NUM_THREADS=job.cog_options["NUM_THREADS"]):
            for stream, partial in zip(self.stream_files, self.partial_files):
                rasterio.shutil.copy(stream, partial, driver="COG", **job.cog_options)
                remove(stream)
        return written


class WorkerTiledCog(_CogWriter):
    """The workers compress the COG tiles (:mod:`rasterflow.write.cogtiles`); the client spools them and writes each
    file behind GDAL's header (:mod:`rasterflow.write.cogassembly`).

    Parameters
    ----------
    job : _CogJob
        The checked :func:`write_cog` call.
    layout : TileLayout
        The tiles' layout (:func:`rasterflow.write.cogtiles.fast_layout`).
    """

    def __init__(self, job: _CogJob, layout: cogtiles.TileLayout):
        super().__init__(job)
        self.layout = layout
        self.profile["sparse_ok"] = True  # the stream file only carries the tags into GDAL's template: no tile written
        self.template_files: list[str] = []
        self.spool_files: list[str] = []
        self.assemblies: list[Assembly] = []

    def _name_more(self, token: str) -> None:
        self.template_files = [_scratch_name(p, token, "template") + ".tif" for p in self.locals_]
        self.spool_files = [_scratch_name(p, token, "tiles") for p in self.locals_]

    def _temporary_files(self) -> list[str]:
        return super()._temporary_files() + self.template_files + self.spool_files

    def _fill(self) -> int:
        """While the blocks are computed, GDAL makes each file's header from its sparse stream file in a thread of
        this process and the arriving tiles are spooled; then each file is written (header, tiles) at its partial
        path."""
        import threading

        job, layout = self.job, self.layout
        self._close_streams()
        options = {key: value for key, value in job.cog_options.items() if key != "NUM_THREADS"}
        failures: list[BaseException] = []

        def templates() -> None:
            try:
                for stream, template in zip(self.stream_files, self.template_files):
                    make_template(stream, template, options)
                    remove(stream)
            except BaseException as exc:  # raised in the caller's thread below
                failures.append(exc)

        thread = threading.Thread(target=templates, name="rasterflow-cog-template", daemon=True)
        thread.start()
        try:
            for spool in self.spool_files:
                self.assemblies.append(Assembly(layout, spool, job.cube.dtype))

            def write(lead_index: tuple[int, ...], i: int, j: int, result: cogtiles.BlockTiles) -> None:
                self.assemblies[self.index_of[tuple(lead_index)]].add(result)

            written = _stream_blocks(job.cube, len(job.lead), job.client, write, job.progress,
                                     results=_tile_tasks(job.cube, layout), per_thread=TILES_INFLIGHT_PER_THREAD,
                                     fused=job.fused, place_reads=job.place_reads)
        finally:
            thread.join()
        if failures:
            raise failures[0]
        for assembly, template, partial in zip(self.assemblies, self.template_files, self.partial_files):
            with open(template, "rb") as f:
                header = f.read()
            check_template(header, layout)
            _size, checksum = assembly.write(header, partial)
            assembly.checksum = checksum
            assembly.close()
            remove(assembly.spool_path)
            remove(template)
        return written

    def _publish(self) -> None:
        super()._publish()
        for final, assembly in zip(self.job.paths, self.assemblies):
            if not self.remote and assembly.checksum:
                # of the bytes written: the STAC Item need not read them again
                self.checksums[final] = assembly.checksum

    def _release(self) -> None:
        super()._release()
        for assembly in self.assemblies:
            assembly.close()

    def _statistics(self) -> dict[str, Mapping[tuple[int, ...], BlockStats]]:
        # the tiles' statistics as the workers computed them: the STAC Item need not read the file back
        return {final: assembly.statistics for final, assembly in zip(self.job.paths, self.assemblies)}


def write_cog(
    ds: xr.Dataset,
    path: str,
    *,
    overwrite: bool = False,
    compression: str = "zstd",
    gdal_cachemax: int = 256 * 2**20,
    client: Client | None = None,
    blocksize: int = 512,
    resampling: str = "average",
    progress: Callable[[int, int], None] | None = None,
    encoding: Encoding | None = None,
    predictor: str = "auto",
    metadata: Mapping[str, Any] | None = None,
    file_metadata: Mapping[str, Mapping[str, Any]] | None = None,
    fused: bool = False,
    place_reads: bool = False,
) -> WriteResult:
    """Write a lazy Dataset as Cloud-Optimized GeoTIFF(s), streaming block by block.

    Parameters
    ----------
    ds : xarray.Dataset
        Data variables with identical dims ``(y, x)``, ``(E, y, x)`` or ``(E1, E2, y, x)``; CRS and transform
        written with rioxarray. Every variable becomes a band (description = variable name), nodata NaN.
    path : str
        The output for 2-D data; with leading dims one file per entry, named by :func:`cog_output_paths`.
    overwrite : bool
        Replace existing outputs, each only after every new file is complete.
    compression : {"zstd", "deflate", "lzw", "none"}
        ``"lz4"`` is accepted and written as zstd (GeoTIFF has no LZ4), with a warning.
    gdal_cachemax : int
        Bytes of GDAL block cache while writing and building overviews (bounds this process's memory).
    client : distributed.Client, optional
        Where to compute the blocks; default: a global client if one exists, else a local thread pool.
    blocksize : int
        COG tile edge, a multiple of 16.
    resampling : str
        Overview resampling (``average`` suits continuous values; ``nearest`` or ``mode`` suits classes).
    encoding : Encoding, optional
        Stored dtype, scale, offset and nodata (default: the computed float dtype, nodata NaN).
    predictor : {"auto", "none", "standard", "floating_point"}
        TIFF predictor; auto lets GDAL choose (standard for integers, floating point for floats) when compressed.
    metadata : mapping, optional
        Dataset tags of every file (values are written as text).
    file_metadata : mapping, optional
        Per output file path: extra tags of that file (e.g. its period's time range).
    fused : bool
        The blocks come from the fused path (one task makes every variable and leading entry of a chunk): on worker
        processes reading remote files, each chunk whose entries fit one batch of the writer is then one task whose
        reads start on its worker before it runs.
    place_reads : bool
        The blocks come from the tree path (a chunk's band tasks per time chunk, their partials combined): on worker
        processes reading remote files, each chunk whose entries fit one batch of the writer, where the writer's cap
        lets every worker have a chunk, goes with all its tasks to a worker that starts its reads first.

    Raises
    ------
    OutputExistsError
        An output file exists and ``overwrite`` is false.
    RunFailedError
        A block failed to compute or a file failed to write; no output and no temporary file is left behind.
    """
    job = _check(ds, str(path), overwrite=overwrite, compression=compression, gdal_cachemax=gdal_cachemax,
                 client=client, blocksize=blocksize, resampling=resampling, progress=progress, encoding=encoding,
                 predictor=predictor, metadata=metadata, file_metadata=file_metadata, fused=fused,
                 place_reads=place_reads)
    layout = None
    if cogtiles.assembly_enabled():
        cube = job.cube
        layout = cogtiles.fast_layout(
            height=cube.shape[-2], width=cube.shape[-1], chunks=(cube.chunks[-2], cube.chunks[-1]),
            blocksize=blocksize, resampling=resampling, computed_dtype=cube.dtype, stored=job.stored,
            band_names=tuple(job.names), compression=job.codec, predictor=predictor,
            files=len(job.entries))
    writer = StreamedCog(job) if layout is None else WorkerTiledCog(job, layout)
    return writer.write()


def _check(ds: xr.Dataset, path: str, *, overwrite: bool, compression: str, gdal_cachemax: int,
           client: Client | None, blocksize: int, resampling: str, progress: Callable[[int, int], None] | None,
           encoding: Encoding | None, predictor: str, metadata: Mapping[str, Any] | None,
           file_metadata: Mapping[str, Mapping[str, Any]] | None, fused: bool = False,
           place_reads: bool = False) -> _CogJob:
    """:func:`write_cog`'s arguments checked, and what follows from them (the cube, the stored encoding, the stream
    files' profile, the COG driver's options)."""
    entries = cog_entries(path, ds)
    paths = [p for _pos, _labels, p in entries]
    check_output_target(path, "cog", overwrite=overwrite, paths=paths)
    codec = compression_name(compression, "cog")
    if blocksize <= 0 or blocksize % 16:
        raise ValueError(f"blocksize must be a positive multiple of 16, got {blocksize}")
    if resampling.lower() not in _RESAMPLINGS:
        raise ValueError(f"unknown overview resampling {resampling!r}; expected one of {', '.join(_RESAMPLINGS)}")
    spatial_dims(ds)  # validates: same dims everywhere, (..., y, x)
    lead = leading_dims(ds)
    names = [str(n) for n in ds.data_vars]
    crs = crs_of(ds)
    if crs is None:
        raise ValueError("the dataset has no CRS; write one with rasterflow.georef.write_georef or "
                         "ds.rio.write_crs(...)")
    transform = transform_of(ds)
    if predictor not in _PREDICTORS:
        raise ValueError(f"unknown predictor {predictor!r}; expected one of {', '.join(_PREDICTORS)}")
    cube = _cube(ds, names, len(lead))
    height, width = cube.shape[-2:]
    if encoding is None and cube.dtype.kind in "iu":
        stored = Encoding(dtype=cube.dtype.name, nodata=None)  # integers as computed, every value valid
    else:
        stored = (encoding or Encoding()).resolved(cube.dtype)
    if predictor == "floating_point" and np.dtype(stored.dtype).kind != "f":
        raise ValueError(f"the floating_point predictor needs a float dtype, not {stored.dtype}")
    needs_encoding = stored.is_scaled or np.dtype(stored.dtype) != cube.dtype or not (
        stored.nodata is None or np.isnan(stored.nodata))
    from rasterflow.write.submit import default_client

    client = default_client(client)
    profile = dict(
        driver="GTiff", width=width, height=height, count=len(names), dtype=stored.dtype, crs=crs,
        transform=transform, nodata=stored.nodata, tiled=True, blockxsize=_tile_size(cube.chunks[-1], blocksize),
        blockysize=_tile_size(cube.chunks[-2], blocksize), compress="ZSTD", zstd_level=1, interleave="pixel",
        bigtiff="IF_SAFER",
    )
    cog_options = dict(
        COMPRESS=codec.upper(), BLOCKSIZE=blocksize, OVERVIEWS="AUTO", RESAMPLING=resampling.upper(),
        BIGTIFF="IF_SAFER",
        # the copy runs after the last block is written, when no task is left: the tiles' compression and the
        # overviews on every core of this machine instead of one (10980² x 36 season: see benchmarks/README.md)
        NUM_THREADS=str(copy_threads()),
    )
    if codec == "zstd":
        cog_options["ZSTD_LEVEL"] = str(cogtiles.ZSTD_LEVEL)  # the workers' level (cogtiles), the Zarr writer's
    if codec != "none" and predictor != "none":
        cog_options["PREDICTOR"] = _PREDICTORS[predictor]
    return _CogJob(ds=ds, path=path, entries=entries, lead=lead, names=names, cube=cube, stored=stored, codec=codec,
                   needs_encoding=needs_encoding, client=client, overwrite=overwrite,
                   gdal_cachemax=gdal_cachemax, progress=progress, profile=profile, cog_options=cog_options,
                   metadata=metadata, file_metadata=file_metadata, fused=fused, place_reads=place_reads)

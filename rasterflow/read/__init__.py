"""rasterflow's reader: one task's pixels, per item and asset, read with rasterio into the task's planes.

Per item and asset, the window of the output chunk is read on the file's native grid straight into the plane when
the file's grid is the output grid (same CRS and resolution, whole-pixel offset); otherwise through a WarpedVRT of
the file on the output grid. Files that the metadata places outside the chunk are not opened. A file that cannot be
opened or read is an error naming the item, the asset and the href (:class:`~rasterflow.errors.SourceReadError`):
never a silent hole.

Remote files (http(s), s3, /vsi paths; :mod:`rasterflow.read.remote`) are read under the run's
:class:`~rasterflow.read.policy.ReadPolicy`: an open and read that fails transiently (5xx, 429, a reset, a timeout)
is tried again with backoff (``source.retry``), with GDAL's cached failure of that file cleared first; one that
fails for good (404, 403, not a raster, tries used up) stops the run (``on_read_error: fail``) or leaves that file's
part of the window missing (``nodata``), and is counted for the run report either way.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rasterflow.errors import SourceMismatchError, SourceReadError
from rasterflow.kernels import ItemStream, Planes
from rasterflow.read import prefetch
from rasterflow.read.cogheader import is_local_path, local_header
from rasterflow.read.datasets import GDAL_OPEN_OPTIONS, check_facts, failure_error, forget, open_source, reason, \
    warped_source
from rasterflow.read.policy import ReadPolicy, current_policy, failed_before, record_failure, record_retry
from rasterflow.read.remote import Failure, ReadFailedError, classify, is_remote, vsi_path
from rasterflow.read.tiles import TileIndex, decoder_available, read_window, tile_index
from rasterflow.retry import retrying
from rasterflow.sources import AssetRead, AssetSource, FileHeader, compression_name, grid_offset

if TYPE_CHECKING:  # pragma: no cover
    import numpy.typing as npt
    from rasterio.io import DatasetReader

    from rasterflow.planning import GridPlan

__all__ = ["ReadJob", "read_planes", "item_stream", "gdal_env", "enter_gdal", "gdal_entered", "read_asset", "read_header", "header_reader", "GDAL_OPEN_OPTIONS"]

_log = logging.getLogger(__name__)


_TOKEN_PREFIX = uuid.uuid4().hex
_TOKENS = itertools.count()


@dataclass(frozen=True)
class ReadJob:
    """What one task reads: the asset reads of its items (None: that item's file of the asset misses the chunk).

    The items are those the plan's chunk index puts on the task's chunk (``graph.local_read_job``), in time order;
    :class:`~rasterflow.kernels.TaskItems` says which of the plan's dates they make."""

    reads: tuple[tuple[AssetRead | None, ...], ...]
    """``[item][asset]`` in the order of ``assets``."""
    assets: tuple[AssetSource, ...]
    grid: GridPlan
    """The output :class:`~rasterflow.planning.GridPlan`."""
    resampling: str
    policy: ReadPolicy | None = None
    """The run's read policy, carried by every task (retries, failure policy, signing, I/O settings): two runs on
    one cluster each read under their own. None: the process's (:func:`~rasterflow.read.policy.current_policy`)."""
    token: str = field(default_factory=lambda: f"{_TOKEN_PREFIX}-{next(_TOKENS)}", init=False, compare=False,
                       repr=False)
    """Made with the object (a ``dataclasses.replace`` copy gets its own), unique in this process: what dask's
    tokenize sees of the job (:meth:`__dask_tokenize__`)."""

    def read_policy(self) -> ReadPolicy:
        """:attr:`policy`, else the process's."""
        return self.policy or current_policy()

    def __dask_tokenize__(self) -> tuple[str, str]:
        """dask names the graph the client submits by tokenizing every task's arguments; walking a job's ~100
        asset reads field by field cost ~10 ms a task in the client, on the cores the workers compute on. A job is
        made once per task and never changes, so a token made with the object serves (dask's public protocol)."""
        return ("rasterflow.ReadJob", self.token)


def read_planes(job: ReadJob, rows: tuple[int, int], cols: tuple[int, int], *, into: Planes | None = None) -> Planes:
    """Read the output window ``rows`` x ``cols`` of every item and asset of ``job``.

    ``into``: planes of the same shape from an earlier call, whose arrays are filled again (an item stream reads
    every item into the same buffers) instead of new ones.

    Returns
    -------
    Planes
        Raw values per asset ``(item, y, x)`` in its load dtype, coverage where needed, and the per-item nodata,
        scale and offset.
    """
    n_items, height, width = len(job.reads), rows[1] - rows[0], cols[1] - cols[0]
    if into is not None and (into.n_items, *into.spatial_shape) == (n_items, height, width):
        planes = into
        for a, source in enumerate(job.assets):
            planes.raw[a].fill(0 if source.fill is None else source.fill)
            coverage = planes.covered[a]
            if coverage is not None:
                coverage.fill(False)
        planes.nodata.fill(math.nan)
        planes.scale.fill(1.0)
        planes.offset.fill(0.0)
        for a, source in enumerate(job.assets):
            if source.fill is not None:
                planes.nodata[:, a] = source.fill
    else:
        planes = _new_planes(job, height, width)
    policy = job.read_policy()
    with gdal_env(policy), prefetch.task_reads(job.reads, job.grid, [(rows, cols)], policy):
        _read_into(job, rows, cols, planes)
    return planes


def _new_planes(job: ReadJob, height: int, width: int) -> Planes:
    n_items = len(job.reads)
    raw: list[npt.NDArray[Any]] = []
    covered: list[npt.NDArray[np.bool_] | None] = []
    nodata = np.full((n_items, len(job.assets)), np.nan)
    scale = np.ones((n_items, len(job.assets)))
    offset = np.zeros((n_items, len(job.assets)))
    for a, source in enumerate(job.assets):
        fill = source.fill
        raw.append(np.full((n_items, height, width), 0 if fill is None else fill, dtype=source.load_dtype))
        covered.append(np.zeros((n_items, height, width), dtype=bool) if fill is None else None)
        if fill is not None:
            nodata[:, a] = fill  # what an item whose file misses the chunk holds there
    return Planes(raw=tuple(raw), covered=tuple(covered), nodata=nodata, scale=scale, offset=offset)


_env_state = threading.local()


@contextlib.contextmanager
def gdal_env(policy: ReadPolicy | None = None) -> Iterator[None]:
    """The run's GDAL options (:meth:`~rasterflow.read.policy.ReadPolicy.gdal_options`) around reads; nested uses
    enter nothing, so a task enters it once for all its items (:func:`item_stream`'s reads), not once per item.

    Lazy: the ``rasterio.Env`` is entered by the first read inside it that goes through GDAL (:func:`enter_gdal`),
    and left when the outermost ``gdal_env`` ends. A task whose files are all decoded by rasterflow itself (local
    tiled COGs, :func:`_read_local`; remote ones, :mod:`rasterflow.read.prefetch`) never imports rasterio."""
    if getattr(_env_state, "depth", 0):
        _env_state.depth += 1
        try:
            yield
        finally:
            _env_state.depth -= 1
        return
    _env_state.depth, _env_state.policy, _env_state.entered = 1, policy, None
    try:
        yield
    finally:
        entered = _env_state.entered
        _env_state.depth, _env_state.policy, _env_state.entered = 0, None, None
        if entered is not None:
            entered.close()


def enter_gdal() -> None:
    """Enter the GDAL options of the enclosing :func:`gdal_env` in this thread, if it has not entered them yet (no
    enclosing ``gdal_env``: nothing). Called before anything GDAL does for a read."""
    if not getattr(_env_state, "depth", 0) or getattr(_env_state, "entered", None) is not None:
        return
    import rasterio

    stack = contextlib.ExitStack()
    stack.enter_context(rasterio.Env(**(_env_state.policy or current_policy()).gdal_options()))
    _env_state.entered = stack


def gdal_entered() -> bool:
    """Whether this thread's :func:`gdal_env` has entered rasterio's ``Env`` (a read went through GDAL)."""
    return getattr(_env_state, "entered", None) is not None


def _read_into(job: ReadJob, rows: tuple[int, int], cols: tuple[int, int], planes: Planes) -> None:
    raw, covered, nodata, scale, offset = planes.raw, planes.covered, planes.nodata, planes.scale, planes.offset
    policy = job.read_policy()
    for t, item_reads in enumerate(job.reads):
        for a, read in enumerate(item_reads):
            if read is None:
                continue
            nodata[t, a] = math.nan if read.nodata is None else read.nodata
            scale[t, a], offset[t, a] = read.scale, read.offset
            coverage = covered[a]
            plane_covered = coverage[t] if coverage is not None else None
            fill = job.assets[a].fill
            try:
                handled, file_nodata = _read_prefetched(read, rows, cols, raw[a][t], plane_covered, policy)
                if not handled:
                    handled, file_nodata = _read_local(read, job.grid, rows, cols, raw[a][t], plane_covered, policy)
                if handled:
                    if read.nodata is None and file_nodata is not None:
                        nodata[t, a] = file_nodata
                    continue
                read_asset(read, job.grid, job.assets[a].resampling, fill, rows, cols, raw[a][t], plane_covered,
                           policy=policy)
                if read.nodata is None:
                    # the item declares none: the file's own nodata holds (where a warp ran, it is NaN
                    # already); the file is open now (read_asset retried its open), so this costs no request
                    file_nodata = open_source(read, policy=policy).nodata
                    if file_nodata is not None:
                        nodata[t, a] = file_nodata
            except SourceMismatchError:
                raise  # the file contradicts its metadata: a wrong result, never a hole
            except SourceReadError as err:
                record_failure(policy, read, err)
                if policy.on_read_error != "nodata":
                    raise
                # as if the item had no file here: the fill value / not covered, so the kernels mask it
                raw[a][t][...] = 0 if fill is None else fill
                if plane_covered is not None:
                    plane_covered[...] = False
                nodata[t, a] = math.nan if fill is None else fill
                scale[t, a], offset[t, a] = 1.0, 0.0


def _read_prefetched(read: AssetRead, rows: tuple[int, int], cols: tuple[int, int], out: npt.NDArray[Any],
                     covered: npt.NDArray[np.bool_] | None, policy: ReadPolicy) -> tuple[bool, float | None]:
    """Read through the task's concurrent remote reads (:mod:`rasterflow.read.prefetch`) when it planned this
    file and window: ``(True, the file's nodata)``; else ``(False, None)`` (GDAL reads it)."""
    session = prefetch.active()
    if session is None:
        return False, None
    earlier = failed_before(policy, read.href)
    if earlier is not None:
        raise ReadFailedError(earlier["error"], href=read.href, status=earlier["status"], transient=False,
                              attempts=earlier["attempts"])
    return session.read(read, rows, cols, out, covered)


def _read_local(read: AssetRead, grid: GridPlan, rows: tuple[int, int], cols: tuple[int, int], out: npt.NDArray[Any],
                covered: npt.NDArray[np.bool_] | None, policy: ReadPolicy) -> tuple[bool, float | None]:
    """Read a local tiled COG on the output grid without GDAL: its header parsed by tifffile
    (:func:`~rasterflow.read.cogheader.local_header`, once per file and process), checked against the item's
    metadata as an open checks it, its tiles decoded by :mod:`rasterflow.read.tiles`: ``(True, the file's
    nodata)``. ``(False, None)`` where GDAL reads it (:func:`read_asset`): a remote or ``/vsi`` href, a file the
    header says needs GDAL (see :func:`~rasterflow.read.cogheader.parse_local`), a grid that needs warping, a
    window with a sparse tile, a file that cannot be opened or a tile that does not decode (GDAL then reads it,
    or names the failure as it always has). The values are GDAL's bit for bit (tests/test_tiles.py)."""
    href = read.href
    if not is_local_path(href) or not decoder_available() or failed_before(policy, href) is not None:
        return False, None
    try:
        header = local_header(href)
    except OSError:
        return False, None
    facts, index = header.facts, header.index
    if facts is None or index is None:
        return False, None
    check_facts(read, count=facts.count, dtype=facts.dtype, crs=facts.crs, height=facts.height,
                width=facts.width, transform=facts.transform)
    direct = grid_offset(facts.crs, facts.transform, grid)
    if direct is None:
        return False, None
    row_off, col_off = direct
    r0, r1 = max(rows[0], row_off), min(rows[1], row_off + facts.height)
    c0, c1 = max(cols[0], col_off), min(cols[1], col_off + facts.width)
    if r0 >= r1 or c0 >= c1:
        return True, facts.nodata
    target = out[r0 - rows[0]:r1 - rows[0], c0 - cols[0]:c1 - cols[0]]
    try:
        if target.dtype == index.dtype:
            done = read_window(index, r0 - row_off, c0 - col_off, target)
        else:  # GDAL's path reads the file's type and casts with NumPy: the same here
            values = np.empty(target.shape, dtype=index.dtype)
            done = read_window(index, r0 - row_off, c0 - col_off, values)
            if done:
                target[...] = values
    except MemoryError:
        raise  # not a file's fault: GDAL would need the same memory again
    except Exception as err:  # a tile that does not decode: GDAL reads the file, or names its failure as always
        _log.debug("rasterflow's tile decoder could not read %s (%s: %s); GDAL reads it", href,
                   type(err).__name__, err)
        return False, None
    if not done:
        return False, None
    if covered is not None:
        covered[r0 - rows[0]:r1 - rows[0], c0 - cols[0]:c1 - cols[0]] = True
    return True, facts.nodata


def item_stream(job: ReadJob, rows: tuple[int, int], cols: tuple[int, int]) -> ItemStream:
    """The window ``rows`` x ``cols`` of ``job``'s items, each read (as :func:`read_planes` reads it) when the kernel
    asks for it: a task then holds one item's raw values at a time, not every item's. Each read refills the arrays
    of the read before (take what you need of an item before asking for the next, as the kernels do); run the kernel
    inside :func:`gdal_env` to enter the GDAL options once for all the items, not once per item."""

    last: list[Planes] = []

    def read(t: int) -> Planes:
        planes = read_planes(ReadJob(reads=(job.reads[t],), assets=job.assets, grid=job.grid,
                                     resampling=job.resampling, policy=job.policy), rows, cols,
                             into=last[0] if last else None)
        last[:] = [planes]
        return planes

    return ItemStream(n_items=len(job.reads), spatial_shape=(rows[1] - rows[0], cols[1] - cols[0]), read=read)


class _Tries:
    """The retry loop of one file: whether an error is worth another try, the failure of the try before
    (:func:`~rasterflow.read.remote.classify` gives an "unreadable" answer one more try), and what to drop first."""

    def __init__(self, read: AssetRead, policy: ReadPolicy, *, count: bool):
        self.read, self.policy, self.count = read, policy, count
        self.last: Failure | None = None

    def transient(self, err: BaseException) -> bool:
        if isinstance(err, ReadFailedError):
            self.last = err.failure
            return err.transient
        return False

    def before_retry(self, attempt: int, err: BaseException) -> None:
        if self.count:
            record_retry(self.policy, self.read.href)
        forget(self.read.href)


def read_asset(read: AssetRead, grid: GridPlan, resampling: str, fill: float | None, rows: tuple[int, int],
               cols: tuple[int, int], out: npt.NDArray[Any], covered: npt.NDArray[np.bool_] | None, *,
               policy: ReadPolicy | None = None) -> None:
    """Read one file's part of the output window into ``out`` (a ``(y, x)`` plane); mark ``covered`` pixels.

    Transient failures are retried under ``policy.retry`` (default: the process's policy), each retry on a fresh
    open of the file; the error that ends the tries says how many were made.
    """
    policy = policy or current_policy()
    enter_gdal()
    earlier = failed_before(policy, read.href)
    if earlier is not None:
        # failed for good in an earlier window of this run: the same answer at once, without hammering the
        # server again, and with nodata the file is missing in every window of this worker, not only some
        raise ReadFailedError(earlier["error"], href=read.href, status=earlier["status"], transient=False,
                              attempts=earlier["attempts"])
    tries = _Tries(read, policy, count=True)
    attempt = 1
    try:
        # The first try runs outside tenacity: its loop costs ~75 us a call, and a 36-date task reads ~400 windows
        # (~4% of the task). Only a transient failure enters the loop, whose first attempt re-raises that failure,
        # so the tries, waits and messages are tenacity's as before.
        try:
            _read_once(read, grid, resampling, fill, rows, cols, out, covered, policy, fresh=False, previous=None)
            return
        except ReadFailedError as err:
            if not tries.transient(err):
                raise
            seen = [err]
        for trying in retrying(policy.retry, tries.transient, tries.before_retry):
            with trying:
                attempt = trying.retry_state.attempt_number
                if seen:
                    raise seen.pop()
                _read_once(read, grid, resampling, fill, rows, cols, out, covered, policy, fresh=attempt > 1,
                           previous=tries.last)
    except ReadFailedError as err:
        forget(read.href)  # a broken handle must not serve the next window
        if attempt > 1:
            why = "transient failures" if err.transient else "then a failure that is not transient"
            err = ReadFailedError(f"{err} (gave up after {attempt} tries: {why}; source.retry.attempts is "
                                  f"{policy.retry.attempts})", href=err.href, status=err.status,
                                  transient=err.transient, attempts=attempt)
        raise err from None


def _read_once(read: AssetRead, grid: GridPlan, resampling: str, fill: float | None, rows: tuple[int, int],
               cols: tuple[int, int], out: npt.NDArray[Any], covered: npt.NDArray[np.bool_] | None,
               policy: ReadPolicy, *,
               fresh: bool, previous: Failure | None) -> None:
    from rasterio.windows import Window

    dataset = open_source(read, fresh=fresh, policy=policy, previous=previous)
    try:
        direct, file_dtype, tiles = _file_facts(dataset, grid, read.href)
        if direct is not None:
            row_off, col_off = direct
            r0, r1 = max(rows[0], row_off), min(rows[1], row_off + dataset.height)
            c0, c1 = max(cols[0], col_off), min(cols[1], col_off + dataset.width)
            if r0 >= r1 or c0 >= c1:
                return
            target = out[r0 - rows[0]:r1 - rows[0], c0 - cols[0]:c1 - cols[0]]
            _read_direct(dataset, tiles, file_dtype, r0 - row_off, c0 - col_off, target)
            if covered is not None:
                covered[r0 - rows[0]:r1 - rows[0], c0 - cols[0]:c1 - cols[0]] = True
            return
        vrt = warped_source(read, grid, resampling, fill, policy=policy)
        window = Window(cols[0], rows[0], cols[1] - cols[0], rows[1] - rows[0])
        if covered is not None:
            data = vrt.read((1, vrt.count), window=window)
            out[...] = data[0]
            covered |= data[1] > 0
        else:
            out[...] = vrt.read(1, window=window)
    except SourceReadError:
        raise
    except Exception as err:  # a truncated or corrupt file, a network failure mid-read
        failure = classify(reason(err), read.href, policy.retry, opening=False)
        raise failure_error("read", read, failure) from None


def _read_direct(dataset: DatasetReader, tiles: TileIndex | None, file_dtype: np.dtype[Any], row: int, col: int,
                 target: npt.NDArray[Any]) -> None:
    """The file's pixels from ``row``, ``col`` into ``target``: decoded from its tiles where
    :mod:`rasterflow.read.tiles` can (no decoder kept per open file), else by GDAL."""
    from rasterio.windows import Window

    same_type = target.dtype == file_dtype
    if tiles is not None and same_type and read_window(tiles, row, col, target):
        return
    window = Window(col, row, target.shape[1], target.shape[0])
    if same_type and target.flags.c_contiguous:
        dataset.read(1, window=window, out=target)  # no copy: the common case of whole-width chunks
    else:
        target[...] = dataset.read(1, window=window)


_facts = threading.local()


def _file_facts(dataset: DatasetReader, grid: GridPlan,
                href: str) -> tuple[tuple[int, int] | None, np.dtype[Any], TileIndex | None]:
    """:func:`_direct_offset`, the data type and the tile index (:func:`rasterflow.read.tiles.tile_index`, None:
    GDAL reads the file) of an open dataset, worked out once per dataset and grid in this thread (a task reads one
    window of the same open file per item and sub-block; asking GDAL for its CRS string every time was ~4% of a
    task)."""
    # (id(dataset), grid) -> (dataset, *facts)
    known: dict[tuple[int, GridPlan], tuple[Any, ...]] | None = getattr(_facts, "known", None)
    if known is None or len(known) > 4096:
        known = _facts.known = {}
    key = (id(dataset), grid)
    hit = known.get(key)
    if hit is not None and hit[0] is dataset:  # the same object: not a new dataset at a recycled address
        return hit[1], hit[2], hit[3]
    direct, dtype = _direct_offset(dataset, grid), np.dtype(dataset.dtypes[0])
    tiles = None
    if direct is not None and not is_remote(href):
        tiles = tile_index(vsi_path(href), band_count=dataset.count, dtype=dtype,
                           shape=(dataset.height, dataset.width), block_shape=tuple(dataset.block_shapes[0]))
    facts = (direct, dtype, tiles)
    known[key] = (dataset, *facts)
    return facts


def _direct_offset(dataset: DatasetReader, grid: GridPlan) -> tuple[int, int] | None:
    """Where the file's first pixel lies on the output grid, from the file itself (see :func:`grid_offset`)."""
    crs = dataset.crs.to_string() if dataset.crs is not None else None
    return grid_offset(crs, tuple(dataset.transform)[:6], grid)


def read_header(read: AssetRead, policy: ReadPolicy | None = None) -> FileHeader:
    """The header of ``read``'s file (data type, nodata, bands, tile shape; no pixels), opened as the reader opens
    files: signed, with the run's GDAL options, transient failures retried. Raises
    :class:`~rasterflow.errors.SourceReadError` naming the file."""
    policy = policy or current_policy()
    tries = _Tries(read, policy, count=False)  # plan time: the run's read statistics start with the workers
    dataset: DatasetReader | None = None
    for trying in retrying(policy.retry, tries.transient, tries.before_retry):
        with trying:
            attempt = trying.retry_state.attempt_number
            dataset = open_source(read, fresh=attempt > 1, policy=policy, previous=tries.last)
    assert dataset is not None  # the tries end in an open dataset or raise the last error
    try:
        tile = tuple(dataset.block_shapes[0]) if dataset.profile.get("tiled", False) else None
        return FileHeader(href=read.href, data_type=str(dataset.dtypes[0]),
                          nodata=None if dataset.nodata is None else float(dataset.nodata),
                          band_count=int(dataset.count), tile_shape=tile,
                          compression=compression_name(dataset))
    finally:
        forget(read.href)  # planning runs in the client: keep no handle there


def header_reader(policy: ReadPolicy | None = None) -> Callable[[Mapping[str, Any], str], FileHeader | None]:
    """``read(item, asset_key)`` for :func:`rasterflow.catalog.undeclared_headers`: the file's header via
    :func:`read_header`, None when it cannot be read (the run names the file when it needs its pixels)."""

    def read(item: Mapping[str, Any], key: str) -> FileHeader | None:
        href = str(((item.get("assets") or {}).get(key) or {}).get("href") or "")
        if not href:
            return None
        asset = AssetRead(item_id=str(item.get("id")), name=key, key=key, href=href, data_type=None, nodata=None,
                          scale=1.0, offset=0.0, crs=None, transform=None, shape=None, band_count=None,
                          footprint=None, direct=False)
        try:
            return read_header(asset, policy)
        except (SourceReadError, SourceMismatchError):
            return None

    return read

"""Open source files once per worker thread, check them against their item's metadata, and name them in errors.

rasterio datasets must not be shared between threads, so each thread keeps its own bounded cache (LRU) of open
datasets and of the WarpedVRTs made from them. A file is checked when it is opened: a data type, band count, CRS or
grid that contradicts the item's metadata is an error (:class:`~rasterflow.errors.SourceMismatchError`), never a
silently wrong read.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from rasterflow.errors import SourceMismatchError, SourceReadError
from rasterflow.gdalenv import REMOTE_READ_DEFAULTS, VSI_CACHE_SIZE  # noqa: F401  (VSI_CACHE_SIZE: re-exported)
from rasterflow.read.policy import ReadPolicy, current_policy
from rasterflow.read.remote import Failure, ReadFailedError, cache_busting_options, classify, is_remote, vsi_path
from rasterflow.sources import AssetRead

if TYPE_CHECKING:  # pragma: no cover
    from rasterio.crs import CRS
    from rasterio.io import DatasetReader
    from rasterio.vrt import WarpedVRT

    from rasterflow.planning import GridPlan

__all__ = ["MAX_OPEN_PER_THREAD", "GDAL_OPEN_OPTIONS", "open_options", "open_source", "warped_source", "reason", "clear_cache",
           "open_count", "forget", "failure_error", "check_facts", "signed_href"]

MAX_OPEN_PER_THREAD = 512
"""Open datasets one thread keeps (least recently used closed first): a task reads every date of every asset, so
the bound must hold one chunk's files (36 dates x 3 assets = 108) to avoid reopening them for every chunk."""

GDAL_OPEN_OPTIONS = dict(REMOTE_READ_DEFAULTS)
"""The defaults set around every open (:data:`rasterflow.gdalenv.REMOTE_READ_DEFAULTS`: no directory listing, a
small per-file cache, merged ranges, HTTP/2 multiplexing, no silent GDAL retries); a run's reads use its
:meth:`~rasterflow.read.policy.ReadPolicy.gdal_options`, which also leave alone what the environment sets."""

_local = threading.local()


def _cache() -> OrderedDict[tuple[Hashable, ...], DatasetReader | WarpedVRT]:
    """This thread's open datasets (``("file", href)``) and WarpedVRTs (``("vrt", href, grid, ...)``)."""
    cache: OrderedDict[tuple[Hashable, ...], DatasetReader | WarpedVRT] | None = getattr(_local, "cache", None)
    if cache is None:
        cache = _local.cache = OrderedDict()
    return cache


def open_count() -> int:
    """How many datasets this thread has open."""
    return len(_cache())


def clear_cache() -> None:
    """Close every dataset this thread has open."""
    cache = _cache()
    while cache:
        _, dataset = cache.popitem()
        dataset.close()


def forget(href: str) -> None:
    """Close and drop this thread's open dataset of ``href`` and the WarpedVRTs made from it (before a retry)."""
    cache = _cache()
    for key in [k for k in cache if k[1] == href]:
        dataset = cache.pop(key)
        try:
            dataset.close()
        except Exception:  # a handle broken by the failure that made us forget it
            pass


def _remember(key: tuple[Hashable, ...], dataset: DatasetReader | WarpedVRT) -> DatasetReader | WarpedVRT:
    cache = _cache()
    cache[key] = dataset
    while len(cache) > MAX_OPEN_PER_THREAD:
        _, old = cache.popitem(last=False)
        old.close()
    return dataset


def reason(err: BaseException) -> str:
    """GDAL's own words for a failure: rasterio's message plus the GDAL error chained under it."""
    parts = [str(err).strip() or type(err).__name__]
    cause = err.__cause__ or err.__context__
    while cause is not None and len(parts) < 4:
        text = str(cause).strip()
        if text and text not in parts:
            parts.append(text)
        cause = cause.__cause__ or cause.__context__
    return ": ".join(parts)


def failure_error(action: str, read: AssetRead, failure: Failure) -> ReadFailedError:
    """The error of a failed open or read: item, asset, href, then the HTTP status or GDAL's words."""
    return ReadFailedError(f"cannot {action} {read.describe()}: {failure.reason}", href=read.href,
                           status=failure.status, transient=failure.transient, unreadable=failure.unreadable)


def signed_href(read: AssetRead, policy: ReadPolicy) -> str:
    """The href, signed when the run has a signer (right before it is opened: tokens expire)."""
    if not policy.sign:
        return read.href
    from rasterflow.read.signing import get_signer

    return get_signer(policy.sign)(read.href)


def open_options(href: str, policy: ReadPolicy, *, fresh_href: str | None = None) -> dict[str, str]:
    """The GDAL config options :func:`open_source` opens ``href`` with: the run's read options; for a retry
    (``fresh_href``: the href as opened, signed) those that make GDAL forget the file; for a local file no per-file
    cache (``VSI_CACHE``), unless the environment sets one: the OS page cache serves local reads, and GDAL's cache
    would add ``VSI_CACHE_SIZE`` to every file a thread keeps open (1.7 MB per open file with it, 0.9 MB without,
    measured on the season benchmark; benchmarks/README.md)."""
    options = {**policy.gdal_options(), **(cache_busting_options(fresh_href) if fresh_href else {})}
    if not is_remote(href) and "VSI_CACHE" not in os.environ:
        options["VSI_CACHE"] = "FALSE"
    return options


def open_source(read: AssetRead, *, fresh: bool = False, policy: ReadPolicy | None = None,
                previous: Failure | None = None) -> DatasetReader:
    """The open, checked rasterio dataset of ``read.href`` (cached in this thread).

    ``fresh``: a retry; whatever this thread and GDAL cached about the file (a failed open included) is dropped
    first. A failure is a :class:`~rasterflow.read.remote.ReadFailedError` that says whether it is transient
    (``previous`` is the failure of the try before, see :func:`~rasterflow.read.remote.classify`).
    """
    import rasterio

    policy = policy or current_policy()
    key = ("file", read.href)
    cache = _cache()
    if fresh:
        forget(read.href)
    elif key in cache:
        cache.move_to_end(key)
        return cache[key]
    if not read.href:
        raise SourceReadError(f"{read.describe()}: the asset has no href")
    signed = signed_href(read, policy)
    path = vsi_path(signed)
    options = open_options(read.href, policy, fresh_href=signed if fresh else None)
    try:
        with rasterio.Env(**options):
            dataset = rasterio.open(path)
    except Exception as err:  # RasterioIOError, CPLE_*: any failure to open is the same to the user
        detail = reason(err).replace(path, vsi_path(read.href))  # never a signed URL's token in a message
        failure = classify(detail, read.href, policy.retry, opening=True, previous=previous, probe_href=signed)
        raise failure_error("open", read, failure) from None
    try:
        check_against_metadata(read, dataset)
    except SourceMismatchError:
        dataset.close()
        raise
    return _remember(key, dataset)


def check_against_metadata(read: AssetRead, dataset: DatasetReader) -> None:
    """Raise :class:`SourceMismatchError` when the file (an open rasterio dataset) contradicts what its item
    declares."""
    crs = dataset.crs
    check_facts(read, count=dataset.count, dtype=dataset.dtypes[0] if dataset.count else None,
                crs=None if crs is None else crs, height=dataset.height, width=dataset.width,
                transform=tuple(dataset.transform)[:6])


def check_facts(read: AssetRead, *, count: int, dtype: str | None, crs: CRS | str | None, height: int, width: int,
                transform: tuple[float, ...] | None) -> None:
    """Raise :class:`SourceMismatchError` when a file with these facts contradicts what ``read``'s item declares
    (``crs``: a rasterio CRS or an ``EPSG:nnnn`` string; ``transform`` None: not compared)."""
    problems: list[str] = []
    if count < 1:
        problems.append("the file has no band")
    elif read.band_count is not None and count != read.band_count:
        problems.append(f"the file has {count} bands, the item's metadata declares {read.band_count}")
    elif read.band_count is None and count != 1:
        problems.append(f"the file has {count} bands; rasterflow reads single-band assets (band 1 would be "
                        "read and the others ignored)")
    if read.data_type is not None and dtype and dtype != read.data_type:
        problems.append(f"its data type is {dtype}, the item's metadata says {read.data_type} (set "
                        f"source.overrides.{read.name}.data_type: {dtype} if the file is right)")
    if read.crs is not None:
        if crs is None:
            problems.append(f"the file has no CRS, the item's metadata says {read.crs}")
        elif not (isinstance(crs, str) and crs.upper() == read.crs.upper()):
            from rasterio.crs import CRS

            file_crs = CRS.from_user_input(crs) if isinstance(crs, str) else crs
            if CRS.from_user_input(read.crs) != file_crs:
                problems.append(f"its CRS is {file_crs.to_string()}, the item's metadata says {read.crs}")
    if read.shape is not None and tuple(read.shape) != (height, width):
        problems.append(f"its shape is {height} x {width}, the item's proj:shape says "
                        f"{read.shape[0]} x {read.shape[1]}")
    if read.transform is not None and transform is not None:
        actual = tuple(transform)[:6]
        if not all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6) for a, b in zip(actual, read.transform)):
            problems.append(f"its transform is {list(actual)}, the item's proj:transform says {list(read.transform)}")
    if problems:
        raise SourceMismatchError(f"{read.describe()} contradicts its item's metadata: " + "; ".join(problems))


def warped_source(read: AssetRead, grid: GridPlan, resampling: str, fill: float | None, *,
                  policy: ReadPolicy | None = None) -> WarpedVRT:
    """A WarpedVRT of the file on the output grid (cached in this thread); with ``fill`` None it carries an alpha
    band that says which pixels the file covers."""
    from affine import Affine
    from rasterio.enums import Resampling
    from rasterio.vrt import WarpedVRT

    key = ("vrt", read.href, grid, resampling, None if fill is None or math.isnan(fill) else fill, fill is None)
    cache = _cache()
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    dataset = open_source(read, policy=policy)
    options: dict[str, Any] = dict(
        crs=grid.crs, transform=Affine(*grid.transform), width=grid.shape[1], height=grid.shape[0],
        resampling=Resampling[resampling],
    )
    if read.nodata is not None:
        options["src_nodata"] = read.nodata
    if fill is None:
        options["add_alpha"] = True
    else:
        # the source's nodata value, not NaN, where it has one: the mask sees the raw values as a direct read does
        file_nodata = read.nodata if read.nodata is not None else dataset.nodata
        options["nodata"] = fill if file_nodata is None else file_nodata
    try:
        vrt = WarpedVRT(dataset, **options)
    except Exception as err:
        raise SourceReadError(f"cannot warp {read.describe()} onto the output grid: {reason(err)}") from None
    return _remember(key, vrt)

"""What both writers share: the pre-flight output check, output file names, the result record, filesystem helpers.

This module is light on purpose (stdlib only at import time; fsspec and zarr load inside the functions that need
them), so the orchestrator can check the output target before it builds a graph.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import shutil
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from rasterflow.errors import OutputExistsError

__all__ = [
    "WriteResult",
    "check_output_target",
    "is_complete_zarr",
    "cog_output_paths",
    "is_remote",
    "filesystem",
    "zarr_staging_path",
    "publish",
    "upload_verified",
    "read_zarr_state",
    "ZarrState",
    "path_size",
    "spatial_dims",
    "leading_dims",
    "Encoding",
    "encode_block",
    "ENCODING_DTYPES",
]

#: Group attributes a rasterflow Zarr store carries.
FINGERPRINT_ATTR = "rasterflow_fingerprint"
COMPLETE_ATTR = "rasterflow_complete"

#: The staging store of a local Zarr write is ``<path><STAGING_SUFFIX>``, a sibling of the output.
STAGING_SUFFIX = ".partial"

_OVERWRITE_HINT = "set output.overwrite: true or choose another path"


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """What a writer produced."""

    paths: tuple[str, ...]
    """The outputs written: one Zarr store, or one COG per entry of the leading dimensions."""
    bytes_written: int
    """Total size on disk of ``paths`` after the write (compressed bytes, overviews included)."""
    blocks_written: int
    """Dask blocks computed and written by this run (for COG: one block = all bands of one chunk of one file; for a
    sharded Zarr store, the blocks of the shards written)."""
    blocks_skipped: int
    """Blocks found finished by an earlier, interrupted run with the same fingerprint and not recomputed."""
    format: str
    """``"zarr"`` or ``"cog"``."""
    checksums: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Per path: its ``file:checksum`` (SHA2-256 multihash) when the writer already knows it (an uploaded COG,
    checked against the object), so the STAC item need not download the file again."""
    statistics: Mapping[str, Mapping[tuple[int, ...], Any]] = dataclasses.field(default_factory=dict)
    """Statistics (:class:`rasterflow.write.stac.BlockStats`) as the write tasks computed them: a Zarr store's by
    array name and chunk index (chunks not written by this run are read back); a COG's by file path and ``(band,
    tile row, tile column)`` of its full-resolution tiles, when the workers made the tiles
    (:mod:`rasterflow.write.cogtiles`; otherwise the file is read back)."""


# --------------------------------------------------------------------------------------------------------------------
# paths and filesystems


def is_remote(path: str) -> bool:
    """True for fsspec URLs (``s3://bucket/x.zarr``); ``file://`` URLs and plain paths are local."""
    return "://" in str(path) and not str(path).startswith("file://")


def _local(path: str) -> str:
    path = str(path)
    return path[len("file://"):] if path.startswith("file://") else path


def filesystem(path: str):
    """(fsspec filesystem, path inside it) for a URL or a local path.

    Credentials, region and endpoint come from the environment as boto users set them (``AWS_ACCESS_KEY_ID``,
    ``AWS_PROFILE``, ``AWS_REGION``, ``AWS_ENDPOINT_URL[_S3]``...): s3fs hands them to botocore unchanged. The listing
    cache is dropped first: workers (other processes) write objects this process's cached listings never saw.
    """
    import fsspec.core

    fs, inner = fsspec.core.url_to_fs(str(path))
    fs.invalidate_cache()
    return fs, inner


_fs = filesystem


def exists(path: str) -> bool:
    """Whether anything (file, directory, store) exists at ``path``."""
    if is_remote(path):
        fs, p = _fs(path)
        return bool(fs.exists(p))
    return os.path.lexists(_local(path))


def remove(path: str) -> None:
    """Delete a file or a directory tree at ``path``; no error when it is absent."""
    if is_remote(path):
        fs, p = _fs(path)
        if fs.exists(p):
            try:
                fs.rm(p, recursive=True)
            except FileNotFoundError:  # an object store's "directory" vanished with its last object
                pass
        return
    p = _local(path)
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p)
    elif os.path.lexists(p):
        os.remove(p)


def path_size(path: str) -> int:
    """Bytes on disk of a file, or of every file under a directory (a Zarr store)."""
    if is_remote(path):
        fs, p = _fs(path)
        return int(fs.du(p, total=True)) if fs.exists(p) else 0
    p = _local(path)
    if os.path.isfile(p):
        return os.path.getsize(p)
    total = 0
    for root, _dirs, files in os.walk(p):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:  # pragma: no cover - vanished while walking
                pass
    return total


def publish(temp: str, final: str, *, replace: bool) -> None:
    """Move a finished local file into place. Without ``replace`` it never replaces a file that appeared meanwhile
    (a hard link fails if ``final`` exists, atomically), raising :class:`OutputExistsError`."""
    if replace:
        os.replace(temp, final)
        return
    try:
        os.link(temp, final)
    except FileExistsError:
        raise OutputExistsError(f"output {final} appeared during the run; it was left as it is") from None
    except OSError:  # a filesystem without hard links: check, then rename (the output's lock keeps rasterflow out)
        if os.path.lexists(final):
            raise OutputExistsError(f"output {final} appeared during the run; it was left as it is") from None
        os.rename(temp, final)
        return
    os.remove(temp)


def zarr_staging_path(path: str) -> str:
    """Where a Zarr write is staged before it is put in place: ``<path>.partial`` (renamed locally, copied
    object by object on an object store, see :mod:`rasterflow.write.zarr`)."""
    return str(path).rstrip("/") + STAGING_SUFFIX


def _digests(local: str) -> tuple[str, str, int]:
    """(MD5 hex, SHA2-256 hex, size) of a local file, in one pass."""
    md5, sha = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    size = 0
    with open(local, "rb") as handle:
        for chunk in iter(lambda: handle.read(8 * 2**20), b""):
            md5.update(chunk)
            sha.update(chunk)
            size += len(chunk)
    return md5.hexdigest(), sha.hexdigest(), size


def upload_verified(local: str, url: str, *, replace: bool, part_size: int | None = None) -> str:
    """Upload a finished local file to an fsspec URL in one go, then check that the object is that file.

    s3fs's ``put_file`` sends a file under 100 MiB in one PUT and a larger one as a multipart upload (50 MiB parts,
    more when the file would need over 10,000), which S3 makes visible only when the upload completes: readers never
    see half an object. Without ``replace`` the PUT is conditional (``If-None-Match: *``), so an object that
    appeared meanwhile is never replaced.

    The check: the object's size, then its checksum -- the ETag when it is the MD5 of the bytes (a single-part upload
    without SSE-KMS), otherwise a re-download whose SHA2-256 must equal the local file's. A mismatch deletes the
    object and raises.

    Parameters
    ----------
    part_size : int, optional
        Bytes per part of a multipart upload (s3fs's ``chunksize``; at least 5 MiB on S3); default: s3fs's.

    Returns
    -------
    str
        The file's ``file:checksum`` (SHA2-256 multihash), so nobody needs to download it again.

    Raises
    ------
    OutputExistsError
        Without ``replace``: the object exists.
    RunFailedError
        The upload failed, or the object differs from the local file (size or checksum).
    """
    from rasterflow.errors import RunFailedError

    md5, sha, size = _digests(local)
    fs, target = _fs(url)
    if not replace and fs.exists(target):
        raise OutputExistsError(f"output {url} appeared during the run; it was left as it is")
    options = {} if part_size is None else {"chunksize": int(part_size)}
    try:
        fs.put_file(local, target, mode="overwrite" if replace else "create", **options)
    except FileExistsError:  # the conditional PUT lost a race (HTTP 412)
        raise OutputExistsError(f"output {url} appeared during the run; it was left as it is") from None
    except OSError as err:
        if replace or err.errno != errno.ENOSYS:
            raise
        # an S3 API without conditional writes (HTTP 501): the check above is all there is
        fs.put_file(local, target, **options)
    info = fs.info(target)
    problem = ""
    if int(info.get("size", -1)) != size:
        problem = f"{info.get('size')} bytes arrived instead of {size}"
    elif str(info.get("ETag", "")).strip('"') != md5:
        remote_sha = hashlib.sha256()
        with fs.open(target, "rb", block_size=8 * 2**20) as handle:
            for chunk in iter(lambda: handle.read(8 * 2**20), b""):
                remote_sha.update(chunk)
        if remote_sha.hexdigest() != sha:
            problem = f"its SHA2-256 is {remote_sha.hexdigest()}, the file's is {sha}"
    if problem:
        try:
            fs.rm(target)
        except OSError:  # pragma: no cover - best effort; the message says what is wrong
            pass
        raise RunFailedError(f"uploading {url} failed the check: {problem}; the object was deleted")
    return "1220" + sha


# --------------------------------------------------------------------------------------------------------------------
# Zarr store state


@dataclasses.dataclass(frozen=True)
class ZarrState:
    """The rasterflow attributes of an existing Zarr store."""

    fingerprint: str | None
    complete: bool


def read_zarr_state(path: str) -> ZarrState | None:
    """The rasterflow state of the Zarr store at ``path``; None when nothing there opens as a Zarr group.

    Reads the group attributes directly (not the consolidated metadata, which is written only at the end).
    """
    if not exists(path):
        return None
    import zarr

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            group = zarr.open_group(str(path), mode="r", use_consolidated=False)
            attrs = dict(group.attrs)
    except Exception:  # not a Zarr group: someone else's file or directory
        return None
    fingerprint = attrs.get(FINGERPRINT_ATTR)
    return ZarrState(fingerprint=None if fingerprint is None else str(fingerprint),
                     complete=attrs.get(COMPLETE_ATTR) is True)


def is_complete_zarr(path: str) -> bool:
    """True when ``path`` is a Zarr store that rasterflow finished writing (``rasterflow_complete: true``)."""
    state = read_zarr_state(path)
    return bool(state and state.complete)


# --------------------------------------------------------------------------------------------------------------------
# dimensions and COG file names


def spatial_dims(ds: Any) -> tuple[str, str]:
    """The (y, x) dimension names: the last two dims of the data variables."""
    names = list(ds.data_vars)
    if not names:
        raise ValueError("the dataset to write has no data variables")
    dims = ds[names[0]].dims
    if len(dims) < 2:
        raise ValueError(f"data variable {names[0]!r} has dims {dims}; expected (..., y, x)")
    for name in names[1:]:
        if ds[name].dims != dims:
            raise ValueError(
                f"every data variable must have the same dims; {names[0]!r} has {dims}, {name!r} has {ds[name].dims}"
            )
    return dims[-2], dims[-1]


def leading_dims(ds: Any) -> tuple[str, ...]:
    """The dims before (y, x), e.g. ``("period", "quantile")``; empty for plain 2-D bands."""
    spatial_dims(ds)  # validates
    return tuple(ds[next(iter(ds.data_vars))].dims[:-2])


def _format_label(dim: str, value: Any) -> str:
    import numpy as np

    if dim == "quantile":
        return f"q{float(value):g}"
    if isinstance(value, np.datetime64) or (hasattr(value, "dtype") and np.issubdtype(value.dtype, np.datetime64)):
        ts = np.datetime64(value, "s")
        day = np.datetime64(value, "D")
        if ts == day:
            return str(day)
        return str(ts).replace(":", "")
    if hasattr(value, "isoformat"):  # datetime / pandas.Timestamp
        text = value.isoformat()
        return text[:10] if text[10:].strip("T0:.") == "" else text.replace(":", "")
    if isinstance(value, (float, np.floating)):
        return f"{float(value):g}"
    if isinstance(value, bytes):
        value = value.decode()
    text = str(value.item() if hasattr(value, "item") else value)
    return text.replace("/", "-").replace(os.sep, "-").replace(" ", "_")


def cog_entries(path: str, ds_or_coords: Any) -> list[tuple[dict[str, int], dict[str, Any], str]]:
    """One ``(positions, labels, file path)`` per entry of the leading dims, in row-major order.

    ``positions`` maps each leading dim to the integer index of the entry, ``labels`` to its coordinate value.
    """
    import itertools

    if not hasattr(ds_or_coords, "data_vars") and isinstance(ds_or_coords, Mapping):  # a Dataset is a Mapping too
        coords: dict[str, Sequence[Any]] = {k: list(v) for k, v in ds_or_coords.items()}
    else:
        ds = ds_or_coords
        coords = {}
        for dim in leading_dims(ds):
            if dim in ds.coords:
                coords[dim] = list(ds[dim].values)
            else:  # a dimension without a coordinate: number the files
                coords[dim] = list(range(ds.sizes[dim]))
    path = str(path)
    directory, name = os.path.split(path)
    stem, suffix = os.path.splitext(name)
    if not coords:
        return [({}, {}, path)]
    dims = list(coords)
    out = []
    seen: dict[str, tuple] = {}
    for combo in itertools.product(*(range(len(coords[d])) for d in dims)):
        labels = {d: coords[d][i] for d, i in zip(dims, combo)}
        parts = [_format_label(d, labels[d]) for d in dims]
        file_path = os.path.join(directory, f"{stem}_{'_'.join(parts)}{suffix}")
        if file_path in seen:
            raise ValueError(
                f"two entries of {dims} ({seen[file_path]} and {tuple(labels.values())}) would both be written to "
                f"{file_path}; their coordinate labels must be distinct"
            )
        seen[file_path] = tuple(labels.values())
        out.append((dict(zip(dims, combo)), labels, file_path))
    return out


def cog_output_paths(path: str, ds_or_coords: Any) -> list[str]:
    """The files a COG write of ``ds_or_coords`` to ``path`` produces.

    ``ds_or_coords`` is the Dataset to write, or a mapping ``{leading dim: coordinate values}`` (e.g.
    ``{"period": ["2024-06", "2024-07"], "quantile": [0.1, 0.9]}``), so callers can know the names before a graph
    exists. No leading dims → ``[path]``; ``period`` → ``<stem>_<period><suffix>``; ``quantile`` →
    ``<stem>_q<q><suffix>``; both → ``<stem>_<period>_q<q><suffix>``; ``time`` → ``<stem>_<YYYY-MM-DD><suffix>``.
    """
    return [p for _pos, _labels, p in cog_entries(path, ds_or_coords)]


# --------------------------------------------------------------------------------------------------------------------
# the pre-flight check


def check_output_target(
    path: str,
    fmt: str,
    *,
    overwrite: bool,
    fingerprint: str | None = None,
    paths: Sequence[str] | None = None,
) -> None:
    """Refuse to start when the output exists and ``overwrite`` is false. Call it before any work.

    Parameters
    ----------
    path : str
        The output as the spec names it (a Zarr store, or the COG path before per-entry suffixes).
    fmt : {"zarr", "cog"}
    overwrite : bool
        ``output.overwrite``: when true, nothing is refused (the writers replace the output once the new one is
        complete).
    fingerprint : str, optional
        The run's fingerprint. An unfinished rasterflow Zarr store at ``path`` with this fingerprint (a previous
        in-place run that was interrupted) is not refused: the write resumes it.
    paths : sequence of str, optional
        For COG: every file the write would produce (:func:`cog_output_paths`); default ``[path]``.

    Raises
    ------
    OutputExistsError
        Naming the existing path(s).
    """
    fmt = fmt.lower()
    if fmt not in ("zarr", "cog"):
        raise ValueError(f"unknown output format {fmt!r}; expected 'zarr' or 'cog'")
    if overwrite:
        return
    if fmt == "zarr":
        if not exists(path):
            return
        state = read_zarr_state(path)
        if fingerprint is not None and state is not None and not state.complete and state.fingerprint == fingerprint:
            return  # an interrupted in-place write of this very job: resume it
        raise OutputExistsError(f"output {path} already exists; {_OVERWRITE_HINT}")
    existing = [p for p in (list(paths) if paths is not None else [path]) if exists(p)]
    if existing:
        shown = ", ".join(existing[:5]) + (f" and {len(existing) - 5} more" if len(existing) > 5 else "")
        what = "output" if len(existing) == 1 else "outputs"
        raise OutputExistsError(f"{what} {shown} already exist{'s' if len(existing) == 1 else ''}; {_OVERWRITE_HINT}")


# --------------------------------------------------------------------------------------------------------------------
# compression names


def compression_name(compression: str | None, fmt: str) -> str:
    """Normalise ``output.compression`` for a format; warns and substitutes when the format lacks the codec.

    Zarr has no LZW codec (deflate is used instead); GeoTIFF has no LZ4 (zstd is used instead).
    """
    name = (compression or "none").lower()
    aliases = {"zlib": "deflate", "gzip": "deflate", "zstandard": "zstd", "": "none", "null": "none"}
    name = aliases.get(name, name)
    if name not in ("zstd", "deflate", "lzw", "lz4", "none"):
        raise ValueError(f"unknown compression {compression!r}; expected zstd, deflate, lzw, lz4 or none")
    if fmt == "zarr" and name == "lzw":
        warnings.warn("Zarr has no LZW codec; writing with deflate (zlib) instead", UserWarning, stacklevel=3)
        return "deflate"
    if fmt == "cog" and name == "lz4":
        warnings.warn("GeoTIFF has no LZ4 compression; writing with zstd instead", UserWarning, stacklevel=3)
        return "zstd"
    return name


# --------------------------------------------------------------------------------------------------------------------
# output encoding: stored dtype, scale, offset, nodata

#: Integer dtypes an output may be stored as, and the floats.
ENCODING_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "float64")


@dataclasses.dataclass(frozen=True)
class Encoding:
    """How physical values are stored: ``stored = round((physical - offset) / scale)``, NaN -> ``nodata``.

    Readers get the physical values back as ``stored * scale + offset`` (CF ``scale_factor``/``add_offset`` in Zarr,
    GDAL's band scale/offset in a GeoTIFF), the same convention in both.
    """

    dtype: str | None = None
    """The stored data type; None = the computed one (float32, or float64 when ``grid.dtype`` asks)."""
    scale: float = 1.0
    """Stored units per physical unit are ``1 / scale``; e.g. 0.0001 stores NDVI 0.1234 as 1234."""
    offset: float = 0.0
    """Added after scaling when reading."""
    nodata: float | None = None
    """The stored value of a missing pixel; None = NaN for floats, the dtype's minimum (signed) or maximum
    (unsigned) for integers."""

    def resolved(self, computed_dtype: Any) -> Encoding:
        """This encoding with ``dtype`` and ``nodata`` filled in for data computed as ``computed_dtype``."""
        import numpy as np

        dtype = np.dtype(self.dtype or computed_dtype)
        if dtype.name not in ENCODING_DTYPES:
            raise ValueError(f"cannot store outputs as {dtype.name}; use one of {', '.join(ENCODING_DTYPES)}")
        if not self.scale or not np.isfinite(self.scale):
            raise ValueError(f"encoding scale must be a finite non-zero number (got {self.scale})")
        nodata = self.nodata
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            if nodata is None:
                nodata = float(info.min if dtype.kind == "i" else info.max)
            elif not (float(nodata).is_integer() and info.min <= nodata <= info.max):
                raise ValueError(f"encoding nodata {nodata} is not a valid {dtype.name} value ({info.min}..{info.max})")
        elif nodata is None:
            nodata = float("nan")
        return Encoding(dtype=dtype.name, scale=float(self.scale), offset=float(self.offset), nodata=float(nodata))

    @property
    def is_scaled(self) -> bool:
        return self.scale != 1.0 or self.offset != 0.0

    def valid_range(self) -> tuple[float, float]:
        """The physical values the stored dtype holds (nodata excluded when it is at an end of the range)."""
        import numpy as np

        dtype = np.dtype(self.dtype)
        if dtype.kind == "f":
            lo, hi = float(np.finfo(dtype).min), float(np.finfo(dtype).max)
        else:
            info = np.iinfo(dtype)
            lo, hi = float(info.min), float(info.max)
            if self.nodata == lo:
                lo += 1
            elif self.nodata == hi:
                hi -= 1
        ends = sorted((lo * self.scale + self.offset, hi * self.scale + self.offset))
        return ends[0], ends[1]


def encode_block(values: Any, encoding: Encoding, name: str = "") -> Any:
    """Physical values (NaN = missing) -> the stored array of a resolved ``encoding``.

    Raises
    ------
    ValueError
        A valid value does not fit the stored dtype (or would be stored as the nodata value): saying which band,
        the value and the range the encoding holds, so the user can choose another scale, offset or dtype. Values are
        never clipped silently.
    """
    import numpy as np

    values = np.asarray(values)
    dtype = np.dtype(encoding.dtype)
    missing = np.isnan(values) if values.dtype.kind == "f" else np.zeros(values.shape, dtype=bool)
    if encoding.is_scaled:
        with np.errstate(invalid="ignore"):
            stored = (values.astype(np.float64) - encoding.offset) / encoding.scale
    else:
        stored = values
    what = f"band {name!r}" if name else "a band"
    if dtype.kind == "f":
        out = stored.astype(dtype)
        if encoding.nodata is not None and not np.isnan(encoding.nodata):
            if np.any(out[~missing] == encoding.nodata):
                raise ValueError(f"{what} has valid values equal to the output nodata {encoding.nodata:g}; choose "
                                 "another output.encoding.nodata")
            out[missing] = encoding.nodata
        return out
    stored = np.rint(stored)
    valid = stored[~missing]
    if valid.size:
        info = np.iinfo(dtype)
        lo, hi = float(valid.min()), float(valid.max())
        clash = np.any(valid == encoding.nodata)
        if not (np.isfinite(lo) and np.isfinite(hi)) or lo < info.min or hi > info.max or clash:
            plo, phi = encoding.valid_range()
            raise ValueError(
                f"{what} has values that {dtype.name} with scale {encoding.scale:g} and offset {encoding.offset:g} "
                f"cannot hold apart from nodata {encoding.nodata:g} (it holds {plo:g} .. {phi:g}); change "
                "output.encoding (a larger scale, another offset or dtype)"
            )
    out = np.asarray(np.where(missing, encoding.nodata, stored))
    return out.astype(dtype)

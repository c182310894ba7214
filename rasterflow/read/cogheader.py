"""A COG's header, parsed once per file and process from its first bytes: the tile index, the data type, the grid
(CRS and transform from the GeoTIFF keys) and the nodata value. Remote files: :func:`parse_header`, from the bytes
of a range request; local files: :func:`parse_local`, from the file (no GDAL: a worker that reads only local tiled
COGs never loads rasterio).

A COG keeps its IFDs and tile arrays at the front, so one request of :data:`HEADER_BYTES` usually holds everything
tifffile needs; a header that runs past it is read on in blocks (one more request each). What tifffile cannot
place bit for bit as GDAL reads it (strips, JPEG, several samples, a CRS that is not an EPSG code, a rotated or
pixel-is-point grid) gets ``index`` None: GDAL reads that file, as before.
"""

from __future__ import annotations

import collections
import io
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rasterflow.read.tiles import TileIndex, page_index

if TYPE_CHECKING:  # pragma: no cover
    from _typeshed import WriteableBuffer
    from tifffile import TiffFile, TiffPage

__all__ = ["HEADER_BYTES", "RemoteTiff", "parse_header", "FileFacts", "parse_local", "local_header", "is_local_path",
           "clear_local_headers", "MAX_LOCAL_HEADERS"]

HEADER_BYTES = 64 * 1024
"""Bytes of the first request to a file: a COG's header (IFDs, tile offsets and byte counts of every level) for
images up to ~20k² pixels in 512² tiles. GDAL starts with 16 KB and reads on; one request of 64 KB costs the same
round trip."""

_BLOCK = 64 * 1024


@dataclass(frozen=True)
class FileFacts:
    """What a file's header says of it, in the terms :func:`rasterflow.read.datasets.check_against_metadata`
    checks against the item's metadata."""

    count: int
    dtype: str
    crs: str | None
    """``EPSG:nnnn``, None when the file has no CRS rasterflow reads itself."""
    height: int
    width: int
    transform: tuple[float, float, float, float, float, float] | None
    nodata: float | None
    tile_shape: tuple[int, int] | None = None
    """``(rows, cols)`` of the tiles, None for a striped file."""
    codec: str | None = None
    """The codec as GDAL names it (``ZSTD``, ``DEFLATE``, ``LZW``, ``NONE``...)."""
    compressed_bytes_per_pixel: float | None = None
    """The full-resolution image's tiles, in bytes per pixel (what a read of it costs on the network)."""


@dataclass(frozen=True, eq=False)
class RemoteTiff:
    """One remote file's header: its facts and, when rasterflow decodes its tiles itself, the tile index."""

    href: str
    size: int | None
    facts: FileFacts | None
    """None when the header could not be parsed (then GDAL opens the file, and reports what is wrong with it)."""
    index: TileIndex | None
    why_gdal: str = ""
    """Why GDAL reads this file (``index`` None), for the report and the tests."""


class _RangeFile(io.RawIOBase):
    """A read-only file over the bytes of a remote file fetched so far; reads past them fetch more (in blocks of
    :data:`_BLOCK`) with ``fetch(start, length) -> bytes``."""

    def __init__(self, first: bytes, size: int | None, fetch: Callable[[int, int], bytes]):
        super().__init__()
        self.blocks: dict[int, bytes] = {}
        self.size = size if size is not None else len(first)
        self.fetch = fetch
        self.position = 0
        self.first = first

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.position, 2: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        wanted = min(len(view), max(0, self.size - self.position))
        done = 0
        while done < wanted:
            at = self.position + done
            if at < len(self.first):
                piece = self.first[at:at + wanted - done]
            else:
                start = (at - len(self.first)) // _BLOCK * _BLOCK + len(self.first)
                block = self.blocks.get(start)
                if block is None:
                    block = self.blocks[start] = self.fetch(start, min(_BLOCK, self.size - start))
                    if not block:
                        break
                piece = block[at - start:at - start + wanted - done]
            if not piece:
                break
            view[done:done + len(piece)] = piece
            done += len(piece)
        self.position += done
        return done


def parse_header(href: str, first: bytes, size: int | None, fetch: Callable[[int, int], bytes]) -> RemoteTiff:
    """The :class:`RemoteTiff` of ``href`` from its first bytes (``size``: the file's length, from the answer's
    ``Content-Range``); ``fetch`` reads on where the header is longer. Errors of ``fetch`` propagate (a network
    failure is the caller's to classify); a header tifffile cannot parse gives ``facts`` None."""
    import tifffile

    handle = _RangeFile(first, size, fetch)
    try:
        # tifffile reads any seekable binary file, which typeshed's RawIOBase is, though not an IO[bytes]
        with tifffile.TiffFile(handle, name=href.rsplit("/", 1)[-1] or "remote.tif") as tif:  # type: ignore[arg-type]
            page = tif.pages.first
            facts = _facts(tif, page)
            index = page_index(tif, href)
    except Exception as err:
        from rasterflow.read.remote import ReadFailedError

        if isinstance(err, ReadFailedError):
            raise
        return RemoteTiff(href=href, size=size, facts=None, index=None, why_gdal=f"tifffile: {err}")
    why = _why_gdal(facts, index)
    return RemoteTiff(href=href, size=size, facts=facts, index=None if why else index, why_gdal=why)


def _why_gdal(facts: FileFacts, index: TileIndex | None) -> str:
    """Why GDAL must read a file whose header tifffile parsed ("" when rasterflow decodes it)."""
    if index is None:
        return "not a tiled image with a lossless codec rasterflow decodes"
    if facts.crs is None or facts.transform is None:
        return "no EPSG CRS or north-up transform in its GeoTIFF keys"
    return ""


def _facts(tif: TiffFile, page: TiffPage) -> FileFacts:
    import numpy as np

    count = int(page.samplesperpixel)
    nodata_text = page.tags.valueof(42113)  # GDAL_NODATA
    nodata = None
    if nodata_text not in (None, ""):
        try:
            nodata = float(str(nodata_text).strip("\x00 "))
        except ValueError:
            nodata = None
    crs, transform = _georeference(tif, page)
    from rasterflow.read.tiles import LOSSLESS_CODECS

    codes = {7: "JPEG", 34887: "LERC", 50001: "WEBP", 32773: "PACKBITS", 34925: "LZMA", 50002: "JXL"}
    codec = LOSSLESS_CODECS.get(int(page.compression)) or codes.get(int(page.compression)) or str(page.compression)
    pixels = int(page.imagelength) * int(page.imagewidth)
    packed = sum(int(n) for n in page.databytecounts) / pixels if pixels else None
    return FileFacts(count=count, dtype=str(np.dtype(page.dtype)) if page.dtype is not None else "",
                     crs=crs, height=int(page.imagelength), width=int(page.imagewidth), transform=transform,
                     nodata=nodata, tile_shape=(int(page.tilelength), int(page.tilewidth)) if page.is_tiled else None,
                     codec=codec, compressed_bytes_per_pixel=packed)


def _georeference(tif: TiffFile, page: TiffPage) -> tuple[str | None, tuple[float, float, float, float, float, float] | None]:
    """``EPSG:nnnn`` and the affine transform (GDAL's order, pixel corners) from the GeoTIFF keys, or None where
    they say something GDAL would interpret further (pixel-is-point, a user-defined CRS, a rotation)."""
    if not page.is_geotiff:
        return None, None
    keys = tif.geotiff_metadata or {}
    raster_type = int(keys.get("GTRasterTypeGeoKey", 1) or 1)
    code = keys.get("ProjectedCSTypeGeoKey")
    if code is None and int(keys.get("GTModelTypeGeoKey", 0) or 0) == 2:
        code = keys.get("GeographicTypeGeoKey")
    code = int(code) if code is not None else None
    crs = f"EPSG:{code}" if code is not None and 1024 <= code < 32767 else None
    if raster_type != 1:
        return crs, None  # pixel-is-point: GDAL shifts the grid by half a pixel; leave that to GDAL
    scale, tiepoint = keys.get("ModelPixelScale"), keys.get("ModelTiepoint")
    if keys.get("ModelTransformation") is not None or scale is None or tiepoint is None or len(tiepoint) < 6:
        return crs, None
    sx, sy = float(scale[0]), float(scale[1])
    i, j, x, y = float(tiepoint[0]), float(tiepoint[1]), float(tiepoint[3]), float(tiepoint[4])
    return crs, (sx, 0.0, x - i * sx, 0.0, -sy, y + j * sy)


# ---- local files ------------------------------------------------------------------------------------------------

MAX_LOCAL_HEADERS = 4096
"""Parsed local headers one process keeps (least recently used dropped first; ~10 KB each, see
:data:`rasterflow.read.prefetch.MAX_HEADERS`)."""

_LOCAL: collections.OrderedDict[tuple[str, int, int, int], RemoteTiff] = collections.OrderedDict()
"""``(path, inode, size, mtime_ns)`` -> header: a file replaced or rewritten is parsed again, never decoded with
its old tile index."""
_LOCAL_LOCK = threading.Lock()


def is_local_path(href: str) -> bool:
    """Whether ``href`` is a plain file path (no URL scheme, no GDAL ``/vsi`` path): what :func:`parse_local` reads."""
    return bool(href) and "://" not in href and not href.startswith("/vsi")


def parse_local(path: str) -> RemoteTiff:
    """The :class:`RemoteTiff` of the local file ``path``, parsed by tifffile from the file (no GDAL).

    ``index`` is None (GDAL reads the file, as before) where tifffile cannot place the pixels bit for bit as GDAL
    reads them (see the module docstring) and where a side-car file could change what GDAL says of it (a
    ``.aux.xml`` can carry a nodata value or a georeference that override the TIFF's). A file that cannot be
    opened raises ``OSError`` (GDAL then opens it and names the failure); one tifffile cannot parse gives ``facts``
    None."""
    import tifffile

    size = os.path.getsize(path)
    try:
        with tifffile.TiffFile(path) as tif:
            page = tif.pages.first
            facts = _facts(tif, page)
            index = page_index(tif, path)
    except OSError:
        raise
    except Exception as err:
        return RemoteTiff(href=path, size=size, facts=None, index=None, why_gdal=f"tifffile: {err}")
    why = _why_gdal(facts, index) or (
        "a .aux.xml side-car file (GDAL reads its metadata)" if os.path.exists(path + ".aux.xml") else "")
    return RemoteTiff(href=path, size=size, facts=facts, index=None if why else index, why_gdal=why)


def local_header(path: str) -> RemoteTiff:
    """:func:`parse_local` of ``path``, once per file (and version of it) and process."""
    stat = os.stat(path)
    key = (path, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    with _LOCAL_LOCK:
        known = _LOCAL.get(key)
        if known is not None:
            _LOCAL.move_to_end(key)
            return known
    parsed = parse_local(path)
    with _LOCAL_LOCK:
        _LOCAL[key] = parsed
        while len(_LOCAL) > MAX_LOCAL_HEADERS:
            _LOCAL.popitem(last=False)
    return parsed


def clear_local_headers() -> None:
    """Forget every parsed local header of this process (tests)."""
    with _LOCAL_LOCK:
        _LOCAL.clear()

"""Header probes of source rasters (``rasterio`` is imported lazily; headers only, never pixels).

:func:`source_header` reads one file's data type, nodata, band count and tile shape; :func:`undeclared_headers`
does so for the assets whose items declare no data type (the planner then loads their source integers and knows
their nodata, see :func:`rasterflow.sources.resolve_sources`); :func:`source_tile_shape` is the tile-shape advice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rasterflow.sources import FileHeader, compression_name, declares_data_type

__all__ = ["HeaderReader", "source_header", "source_tile_shape", "undeclared_headers"]

HeaderReader = Callable[[Mapping[str, Any], str], "FileHeader | None"]
"""``read(item, asset_key)``: the header of that item's file, None when it cannot be read. The run passes
:func:`rasterflow.read.header_reader`, which opens files as the reader does (signed, the run's GDAL options,
retries); without one, :func:`source_header` opens local paths and URLs plainly."""


def source_header(items: Sequence[Mapping[str, Any]], asset_key: str,
                  read_header: HeaderReader | None = None) -> FileHeader | None:
    """The header of the first item's ``asset_key`` file, or None.

    Unreadable files give None here: the reader names them when the run needs their pixels.
    """
    for item in items:
        if read_header is not None:
            if ((item.get("assets") or {}).get(asset_key) or {}).get("href"):
                return read_header(item, asset_key)
            continue
        href = ((item.get("assets") or {}).get(asset_key) or {}).get("href")
        if not href:
            continue
        try:
            import rasterio

            with rasterio.Env(GDAL_DISABLE_READDIR_ON_OPEN="EMPTY_DIR"), rasterio.open(href) as src:
                tile = tuple(src.block_shapes[0]) if src.profile.get("tiled", False) else None
                nodata = None if src.nodata is None else float(src.nodata)
                return FileHeader(href=str(href), data_type=str(src.dtypes[0]), nodata=nodata,
                                  band_count=int(src.count), tile_shape=tile,
                                  compression=compression_name(src))
        except Exception:  # noqa: BLE001 - a header that cannot be read only costs the probe
            return None
    return None


def undeclared_headers(items: Sequence[Mapping[str, Any]], asset_keys: Iterable[str],
                       read_header: HeaderReader | None = None) -> dict[str, FileHeader]:
    """For each asset key that some item declares no data type for: the header of the first such item's file."""
    headers: dict[str, FileHeader] = {}
    for key in dict.fromkeys(asset_keys):
        lacking = [item for item in items
                   if key in (item.get("assets") or {}) and not declares_data_type(item, key)]
        header = source_header(lacking, key, read_header) if lacking else None
        if header is not None:
            headers[key] = header
    return headers


def source_tile_shape(items: Sequence[Mapping[str, Any]], asset_key: str,
                      read_header: HeaderReader | None = None) -> tuple[int, int] | None:
    """The internal tile shape of the first item's ``asset_key`` file (its header only; no pixels), or None.

    ``plan`` uses it to warn when chunks cut through source tiles. Unreadable or untiled files give None: this is
    advice, never a reason to fail.
    """
    header = source_header(items[:1], asset_key, read_header)
    return None if header is None else header.tile_shape

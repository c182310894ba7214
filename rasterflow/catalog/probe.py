"""Header probes of source rasters: :func:`source_tile_shape` (``rasterio`` is imported lazily)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["source_tile_shape"]


def source_tile_shape(items: Sequence[Mapping[str, Any]], asset_key: str) -> tuple[int, int] | None:
    """The internal tile shape of the first item's ``asset_key`` file (its header only; no pixels), or None.

    ``plan`` uses it to warn when chunks cut through source tiles. Unreadable or untiled files give None: this is
    advice, never a reason to fail.
    """
    for item in items[:1]:
        href = (item.get("assets", {}).get(asset_key) or {}).get("href")
        if not href:
            return None
        try:
            import rasterio

            with rasterio.Env(GDAL_DISABLE_READDIR_ON_OPEN="EMPTY_DIR"), rasterio.open(href) as src:
                if not src.profile.get("tiled", False):
                    return None
                return tuple(src.block_shapes[0])  # type: ignore[return-value]
        except Exception:  # noqa: BLE001 - any failure to read a header only costs the advice
            return None
    return None

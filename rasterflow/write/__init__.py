"""Writers: stream a lazy Dataset to Zarr or to Cloud-Optimized GeoTIFFs, chunk by chunk, atomically.

``check_output_target``, ``cog_output_paths``, ``is_complete_zarr``, ``path_size`` and ``WriteResult`` are light (no Dask, xarray
or rasterio import), so the orchestrator can check the output before building a graph; ``write_zarr`` and
``write_cog`` load their modules (and the pixel libraries) on first use. :mod:`rasterflow.write.stac` (the STAC
Items and Collection of a run's outputs, written after the data, and the description the writers record) is light
too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rasterflow.write.common import (
    WriteResult,
    check_output_target,
    cog_output_paths,
    is_complete_zarr,
    path_size,
)

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.write.cog import write_cog
    from rasterflow.write.zarr import write_zarr

__all__ = [
    "WriteResult",
    "check_output_target",
    "cog_output_paths",
    "is_complete_zarr",
    "path_size",
    "write_cog",
    "write_zarr",
]


def __getattr__(name: str) -> Callable[..., WriteResult]:
    if name == "write_zarr":
        from rasterflow.write.zarr import write_zarr

        return write_zarr
    if name == "write_cog":
        from rasterflow.write.cog import write_cog

        return write_cog
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

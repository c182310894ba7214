"""A sample on disk: its manifest (written last, its presence marks a complete sample), the reuse of a complete one,
the removal of a previous one, the lock that serialises generations in one directory, and the writing of COGs and
JSON files (each written beside its place and moved there).

NumPy at import; rasterio and filelock when used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rasterflow.atomic import atomic_path, write_text_atomic
from rasterflow.sample.grid import (
    ASSETS,
    CRS,
    RESOLUTION,
    X0,
    Y0,
    SampleParams,
    item_plan,
)

if TYPE_CHECKING:
    from affine import Affine
    from filelock import FileLock

MANIFEST = "sample.json"
LOCKFILE = ".sample.lock"


@dataclasses.dataclass(frozen=True)
class SampleCatalog:
    """A generated sample on disk."""

    directory: Path
    """The sample directory (absolute)."""
    items_json: Path
    """``items.json``: an ItemCollection (GeoJSON FeatureCollection) with every item."""
    items_ndjson: Path
    """``items.ndjson``: the same items, one JSON object per line."""
    collection_json: Path
    """``collection.json``: the STAC Collection ``sentinel-2-l2a-sample``."""
    item_ids: tuple[str, ...]
    """Item ids, sorted by date, then tile (row-major)."""
    crs: str
    """CRS of every asset: ``"EPSG:32633"``."""
    bounds: tuple[float, float, float, float]
    """Union of all tiles in ``crs``: (minx, miny, maxx, maxy)."""
    bbox_wgs84: tuple[float, float, float, float]
    """Union lon/lat bbox (west, south, east, north); contains every item's bbox."""

    def items(self) -> list[dict[str, Any]]:
        """The items as plain STAC dicts (read from ``items.ndjson``; ``proj:epsg`` kept as written)."""
        with open(self.items_ndjson, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]


# --------------------------------------------------------------------------------------------------------------
# Manifest, reuse, lock
# --------------------------------------------------------------------------------------------------------------


def sample_lock(directory: Path) -> FileLock:
    """An exclusive lock on ``directory/.sample.lock`` (an OS lock: ``flock`` on POSIX), to use as ``with``.

    Concurrent generations in one directory, from threads or processes, run one after the other; the lock is waited
    for without a timeout. The lock file stays, empty (filelock truncates it on each acquire, so its mtime moves;
    unlinking a lock file others may hold would break mutual exclusion).
    """
    from filelock import FileLock

    return FileLock(str(directory / LOCKFILE))


def _read_manifest(directory: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _manifest_files(directory: Path, manifest: dict[str, Any]) -> list[Path]:
    files = [directory / name for name in ("items.json", "items.ndjson", "collection.json")]
    for item_id in manifest.get("item_ids", []):
        files.extend(directory / item_id / f"{asset}.tif" for asset in ASSETS)
    return files


def _four(values: list[Any]) -> tuple[float, float, float, float]:
    a, b, c, d = (float(v) for v in values)
    return a, b, c, d


def catalog_from_manifest(directory: Path, manifest: dict[str, Any]) -> SampleCatalog:
    return SampleCatalog(
        directory=directory,
        items_json=directory / "items.json",
        items_ndjson=directory / "items.ndjson",
        collection_json=directory / "collection.json",
        item_ids=tuple(manifest["item_ids"]),
        crs=manifest["crs"],
        bounds=_four(manifest["bounds"]),
        bbox_wgs84=_four(manifest["bbox_wgs84"]),
    )


def load_if_complete(directory: Path, params: SampleParams) -> SampleCatalog | None:
    manifest = _read_manifest(directory)
    if manifest is None or manifest.get("params") != params or manifest.get("directory") != str(directory):
        return None
    try:
        if not all(p.is_file() and p.stat().st_size > 0 for p in _manifest_files(directory, manifest)):
            return None
        return catalog_from_manifest(directory, manifest)
    except (KeyError, TypeError, ValueError):
        return None


def remove_previous(directory: Path, params: SampleParams) -> None:
    """Remove the manifest first (an interrupted run is then incomplete), then the previous sample's files."""
    manifest = _read_manifest(directory)
    with contextlib.suppress(FileNotFoundError):
        (directory / MANIFEST).unlink()
    old_ids = manifest.get("item_ids", []) if manifest else []
    new_ids = [item_id for item_id, *_ in item_plan(params)]
    for item_id in {*old_ids, *new_ids}:
        if isinstance(item_id, str) and item_id and "/" not in item_id and not item_id.startswith("."):
            shutil.rmtree(directory / item_id, ignore_errors=True)
    for name in ("items.json", "items.ndjson", "collection.json"):
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()


# --------------------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------------------


def cog_compression() -> str:
    """ZSTD when this GDAL has it, else DEFLATE."""
    import rasterio
    from rasterio.io import MemoryFile
    from rasterio.transform import Affine

    def probe(compress: str) -> None:
        with MemoryFile() as mem:
            with mem.open(driver="GTiff", width=16, height=16, count=1, dtype="uint8", compress=compress,
                          crs=CRS, transform=Affine(RESOLUTION, 0.0, X0, 0.0, -RESOLUTION, Y0)) as ds:
                ds.write(np.zeros((1, 16, 16), dtype=np.uint8))

    try:
        with rasterio.Env(CPL_LOG=os.devnull):
            probe("ZSTD")
        return "ZSTD"
    except Exception:  # noqa: BLE001 - GDAL without the ZSTD codec
        probe("DEFLATE")  # a failure here is a real error: let it surface
        return "DEFLATE"


def write_cog(path: Path, data: npt.NDArray[np.uint8 | np.uint16], transform: Affine, blocksize: int, compress: str, resampling: str,
               description: str) -> None:
    import rasterio

    profile = {
        "driver": "COG",
        "width": data.shape[1],
        "height": data.shape[0],
        "count": 1,
        "dtype": data.dtype.name,
        "crs": CRS,
        "transform": transform,
        "nodata": 0,
        "blocksize": blocksize,
        "compress": compress,
        "predictor": 2 if data.dtype == np.uint16 else 1,
        "level": 1,  # ZSTD/DEFLATE level 1: ~3x faster than the default, files ~10 % larger
        "overviews": "AUTO",
        "overview_resampling": resampling,
        "resampling": resampling,
    }
    with atomic_path(path, suffix=".tif") as tmp, rasterio.open(tmp, "w", **profile) as ds:
        ds.write(data, 1)
        ds.set_band_description(1, description)


def writer_threads() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def write_text(path: Path, text: str) -> None:
    write_text_atomic(path, text, fsync=False)


def write_json(path: Path, obj: object, indent: int | None = None) -> None:
    write_text(path, json.dumps(obj, indent=indent) + "\n")

"""The STAC documents of a sample: item geometry (the valid-data footprint in WGS84), the SCL statistics an item
carries, the item and collection dicts. NumPy only; the caller passes the pyproj transformer.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rasterflow.sample.grid import (
    ACQUISITION_TIME,
    ASSETS,
    CLOUD_CLASSES,
    COLLECTION_ID,
    CRS,
    EPSG,
    OFFSET,
    RESOLUTION,
    SCALE,
    X0,
    Y0,
    SampleParams,
    cut_col,
    platform_for_date,
    tile_bounds,
)

if TYPE_CHECKING:
    from pyproj import Transformer

STAC_VERSION = "1.0.0"
# v1.2.0 is the one projection version that defines both proj:epsg (read by stackstac 0.5.1) and proj:code
# (v1.0/v1.1 schemas reject proj:code, v2.0 rejects proj:epsg).
EXT_PROJ = "https://stac-extensions.github.io/projection/v1.2.0/schema.json"
EXT_RASTER = "https://stac-extensions.github.io/raster/v1.1.0/schema.json"
EXT_EO = "https://stac-extensions.github.io/eo/v1.1.0/schema.json"
STAC_EXTENSIONS = [EXT_EO, EXT_PROJ, EXT_RASTER]
COG_MEDIA_TYPE = "image/tiff; application=geotiff; profile=cloud-optimized"


# --------------------------------------------------------------------------------------------------------------
# Geometry
# --------------------------------------------------------------------------------------------------------------


def tile_footprint(params: SampleParams, row: int, col: int, cut: bool) -> list[tuple[float, float]]:
    """Valid-data polygon of a tile in EPSG:32633, counter-clockwise, closed."""
    minx, miny, maxx, maxy = tile_bounds(params, row, col)
    ring = [(minx, miny), (maxx, miny), (maxx, maxy), (minx, maxy)]
    if cut:

        def keep(pt: tuple[float, float]) -> float:  # signed distance (in pixels) east of the cut line
            grow = (Y0 - pt[1]) / RESOLUTION
            gcol = (pt[0] - X0) / RESOLUTION
            return gcol - float(cut_col(params, grow))

        clipped = []
        for i, cur in enumerate(ring):
            prev = ring[i - 1]
            kc, kp = keep(cur), keep(prev)
            if (kc >= 0) != (kp >= 0):
                t = kp / (kp - kc)
                clipped.append((prev[0] + t * (cur[0] - prev[0]), prev[1] + t * (cur[1] - prev[1])))
            if kc >= 0:
                clipped.append(cur)
        ring = clipped
    return [*ring, ring[0]]


def ring_to_wgs84(transformer: Transformer, ring: list[tuple[float, float]],
              densify: int = 8) -> tuple[list[list[float]], tuple[float, float, float, float]]:
    """Transform a closed ring; returns (vertices in lon/lat, bbox of the densified edges)."""
    xs, ys = [], []
    for (x1, y1), (x2, y2) in zip(ring[:-1], ring[1:]):
        t = np.linspace(0.0, 1.0, densify, endpoint=False)
        xs.append(x1 + t * (x2 - x1))
        ys.append(y1 + t * (y2 - y1))
    lon, lat = transformer.transform(np.concatenate(xs), np.concatenate(ys))
    vx, vy = transformer.transform(np.array([p[0] for p in ring]), np.array([p[1] for p in ring]))
    vertices = [[float(a), float(b)] for a, b in zip(vx, vy)]
    vertices[-1] = vertices[0]
    bbox = (
        min(float(lon.min()), min(v[0] for v in vertices)),
        min(float(lat.min()), min(v[1] for v in vertices)),
        max(float(lon.max()), max(v[0] for v in vertices)),
        max(float(lat.max()), max(v[1] for v in vertices)),
    )
    return vertices, bbox


# --------------------------------------------------------------------------------------------------------------
# Item and collection
# --------------------------------------------------------------------------------------------------------------


def scl_statistics(scl: npt.NDArray[np.uint8]) -> dict[str, float]:
    counts = np.bincount(scl.ravel(), minlength=256)
    total = int(scl.size)
    valid = total - int(counts[0])

    def pct(*classes: int) -> float:
        return round(100.0 * sum(int(counts[c]) for c in classes) / valid, 2) if valid else 0.0

    return {
        "eo:cloud_cover": pct(*CLOUD_CLASSES),
        "s2:nodata_pixel_percentage": round(100.0 * int(counts[0]) / total, 2),
        "s2:cloud_shadow_percentage": pct(3),
        "s2:vegetation_percentage": pct(4),
        "s2:not_vegetated_percentage": pct(5),
        "s2:water_percentage": pct(6),
        "s2:medium_proba_clouds_percentage": pct(8),
        "s2:high_proba_clouds_percentage": pct(9),
        "s2:thin_cirrus_percentage": pct(10),
    }


def item_dict(*, item_id: str, date: _dt.date, date_index: int, mgrs: str, geometry: list[list[float]],
               bbox: tuple[float, ...], bounds: tuple[float, float, float, float], transform: list[float], size: int,
               item_dir: Path, stats: dict[str, float], collection_href: str) -> dict[str, Any]:
    proj = {
        "proj:epsg": EPSG,
        "proj:code": CRS,
        "proj:shape": [size, size],
        "proj:transform": transform,
        "proj:bbox": [float(b) for b in bounds],
    }
    assets = {}
    for key, (band, wavelength, fwhm, title) in ASSETS.items():
        asset = {
            "href": str(item_dir / f"{key}.tif"),
            "type": COG_MEDIA_TYPE,
            "title": title,
            "roles": ["data"],
            "gsd": RESOLUTION,
            **proj,
        }
        if wavelength is not None:
            asset["eo:bands"] = [{"name": band, "common_name": "swir16" if key == "swir16" else key,
                                  "center_wavelength": wavelength, "full_width_half_max": fwhm}]
            asset["raster:bands"] = [{"nodata": 0, "data_type": "uint16", "bits_per_sample": 15,
                                      "spatial_resolution": RESOLUTION, "scale": SCALE, "offset": OFFSET}]
        else:
            asset["raster:bands"] = [{"nodata": 0, "data_type": "uint8", "spatial_resolution": RESOLUTION}]
        assets[key] = asset
    return {
        "type": "Feature",
        "stac_version": STAC_VERSION,
        "stac_extensions": list(STAC_EXTENSIONS),
        "id": item_id,
        "collection": COLLECTION_ID,
        "geometry": {"type": "Polygon", "coordinates": [geometry]},
        "bbox": [float(b) for b in bbox],
        "properties": {
            "datetime": f"{date.isoformat()}T{ACQUISITION_TIME}Z",
            "platform": platform_for_date(date_index),
            "constellation": "sentinel-2",
            "instruments": ["msi"],
            "gsd": RESOLUTION,
            **stats,
            "s2:mgrs_tile": mgrs,
            "s2:processing_baseline": "05.10",
            "s2:product_type": "S2MSI2A",
            **proj,
        },
        "links": [{"rel": "collection", "href": collection_href, "type": "application/json"}],
        "assets": assets,
    }


def collection_dict(items: list[dict[str, Any]], bbox: tuple[float, ...], href: str) -> dict[str, Any]:
    datetimes = sorted(i["properties"]["datetime"] for i in items)
    return {
        "type": "Collection",
        "stac_version": STAC_VERSION,
        "stac_extensions": list(STAC_EXTENSIONS),
        "id": COLLECTION_ID,
        "title": "Sentinel-2 L2A (synthetic sample)",
        "description": (
            "Synthetic Sentinel-2 L2A-like scenes generated by rasterflow.sample: uint16 reflectance "
            "(DN * 0.0001 - 0.1) for red/green/nir/swir16 at 10 m and an SCL band (0 nodata, 3 cloud shadow, "
            "4 vegetation, 5 not vegetated, 6 water, 8/9 cloud medium/high probability, 10 thin cirrus)."
        ),
        "license": "CC0-1.0",
        "keywords": ["sentinel-2", "synthetic", "sample"],
        "extent": {
            "spatial": {"bbox": [[float(b) for b in bbox]]},
            "temporal": {"interval": [[datetimes[0], datetimes[-1]]]},
        },
        "summaries": {
            "platform": sorted({i["properties"]["platform"] for i in items}),
            "constellation": ["sentinel-2"],
            "instruments": ["msi"],
            "gsd": [RESOLUTION],
            "proj:epsg": [EPSG],
        },
        "links": [
            {"rel": "self", "href": href, "type": "application/json"},
            {"rel": "root", "href": href, "type": "application/json"},
        ],
    }

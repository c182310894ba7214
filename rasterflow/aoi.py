"""An area of interest (``source.stac.intersects``): a polygon the search uses, the grid's bounds come from when
``grid.bounds`` is not given, and the output is clipped to (pixels outside are nodata, chunks outside are not
computed).

Light to import: shapely and pyproj load when a geometry is parsed or projected, rasterio where a task clips.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["parse_geometry", "geometry_bounds", "project", "outside", "window_meets"]

_AREAL = ("Polygon", "MultiPolygon")


def parse_geometry(value: Any) -> dict[str, Any]:
    """A GeoJSON Polygon or MultiPolygon (WGS84 lon/lat) from a Geometry, a Feature or a FeatureCollection (their
    polygons' union), checked to be a valid area.

    Raises
    ------
    ValueError
        Not GeoJSON, not an area (a point or a line), or not valid (a self-intersection: shapely's explanation).
    """
    from shapely.geometry import mapping, shape
    from shapely.ops import unary_union
    from shapely.validation import explain_validity

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"not GeoJSON: {err.msg} at line {err.lineno}") from None
    if not isinstance(value, Mapping) or "type" not in value:
        raise ValueError("expected a GeoJSON geometry (a mapping with type and coordinates), a Feature or a "
                         "FeatureCollection")
    kind = value["type"]
    if kind == "FeatureCollection":
        geometries = [f.get("geometry") for f in value.get("features") or [] if isinstance(f, Mapping)]
    elif kind == "Feature":
        geometries = [value.get("geometry")]
    else:
        geometries = [value]
    shapes = []
    for geometry in geometries:
        if not isinstance(geometry, Mapping) or geometry.get("type") not in _AREAL:
            found = geometry.get("type") if isinstance(geometry, Mapping) else type(geometry).__name__
            raise ValueError(f"an area of interest is a Polygon or MultiPolygon, not a {found}")
        try:
            polygon = shape(geometry)
        except Exception as err:  # shapely's own words on malformed coordinates
            raise ValueError(f"not a valid {geometry.get('type')}: {err}") from None
        if not polygon.is_valid:
            raise ValueError(f"not a valid polygon: {explain_validity(polygon)}; fix the ring (e.g. in QGIS: "
                             "Vector > Geometry Tools > Fix Geometries)")
        if polygon.is_empty or polygon.area == 0:
            raise ValueError("the polygon has no area")
        shapes.append(polygon)
    if not shapes:
        raise ValueError("the FeatureCollection has no polygon")
    merged = unary_union(shapes)
    west, south, east, north = merged.bounds
    if not (-180 <= west <= east <= 180 and -90 <= south <= north <= 90):
        raise ValueError(f"coordinates out of WGS84 lon/lat range (bounds {[west, south, east, north]}); GeoJSON "
                         "is longitude, latitude in degrees")
    return dict(mapping(merged))


def geometry_bounds(geometry: Mapping[str, Any]) -> tuple[float, float, float, float]:
    """``(west, south, east, north)`` of a GeoJSON geometry."""
    from shapely.geometry import shape

    return tuple(float(v) for v in shape(geometry).bounds)  # type: ignore[return-value]


def project(geometry: Mapping[str, Any], crs: str) -> dict[str, Any]:
    """A WGS84 GeoJSON geometry in ``crs`` (edges densified to 1/8 of a degree so they follow the projection)."""
    import numpy as np
    import shapely
    from pyproj import Transformer
    from shapely.geometry import mapping, shape

    transformer = Transformer.from_crs("EPSG:4326", crs, always_xy=True)
    dense = shape(geometry).segmentize(0.125)

    def to_crs(coords: np.ndarray) -> np.ndarray:
        x, y = transformer.transform(coords[:, 0], coords[:, 1])
        return np.column_stack([x, y])

    return dict(mapping(shapely.transform(dense, to_crs)))


def window_meets(geometry: Mapping[str, Any], bounds: tuple[float, float, float, float]) -> bool:
    """Whether the geometry (in the grid's CRS) meets the rectangle ``(minx, miny, maxx, maxy)``."""
    from shapely.geometry import box, shape

    return bool(shape(geometry).intersects(box(*bounds)))


def outside(geometry: Mapping[str, Any], transform: tuple[float, ...], shape: tuple[int, int]) -> Any:
    """``(y, x)`` boolean: the pixels of a window (its affine ``transform``) whose centre lies outside the geometry
    (in the grid's CRS): rasterio's ``geometry_mask``."""
    from affine import Affine
    from rasterio.features import geometry_mask

    return geometry_mask([geometry], out_shape=shape, transform=Affine(*transform[:6]), invert=False)

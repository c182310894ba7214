"""The STAC documents of a run's outputs, built (not written): an Item per output file (projection, ``raster:bands``
with the statistics of the stored values, the processing extension, ``derived_from`` links to the inputs, ``file:``
size and checksum) and the run's Collection.

:mod:`rasterflow.write.stac` writes them, in order. Standard library at import time; numpy and pyproj load inside
the functions, the statistics' libraries in :mod:`rasterflow.write.stacstats`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rasterflow.write.describe import PeriodInfo, RunDescription, rfc3339
from rasterflow.write.encoding import Encoding
from rasterflow.write.files import is_remote, path_size
from rasterflow.write.stacfiles import absolute_href, file_checksum, item_path, stac_paths
from rasterflow.write.stacstats import ChunkStatistics, cog_statistics, tile_statistics, zarr_statistics

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.planning import JobPlan

__all__ = ["STAC_VERSION", "STAC_EXTENSIONS", "COG_MEDIA_TYPE", "ZARR_MEDIA_TYPE", "TileGeometry", "StacContext",
           "footprint", "output_item", "collection_document"]

STAC_VERSION = "1.1.0"
STAC_EXTENSIONS = {
    "proj": "https://stac-extensions.github.io/projection/v2.0.0/schema.json",
    "raster": "https://stac-extensions.github.io/raster/v1.1.0/schema.json",
    "processing": "https://stac-extensions.github.io/processing/v1.2.0/schema.json",
    "file": "https://stac-extensions.github.io/file/v2.1.0/schema.json",
}
COG_MEDIA_TYPE = "image/tiff; application=geotiff; profile=cloud-optimized"
ZARR_MEDIA_TYPE = "application/vnd+zarr"


@dataclasses.dataclass(frozen=True)
class TileGeometry:
    """Where one output file lies: its bounds in the grid's CRS, its shape and its affine transform."""

    bounds: tuple[float, ...]
    shape: tuple[int, int]
    transform: tuple[float, ...]
    tile: tuple[int, int] | None = None
    """``(row, col)`` of a tile of a tiled output (``rasterflow:tile_row`` / ``rasterflow:tile_col``)."""


@dataclasses.dataclass(frozen=True)
class StacContext:
    """What every Item of one run shares (the arguments of :func:`rasterflow.write.stac.write_stac`)."""

    plan: JobPlan
    description: RunDescription
    output_path: str
    encoding: Encoding
    software: Mapping[str, str | None]
    catalog: str | None = None


def output_item(context: StacContext, fmt: str, path: str, labels: Mapping[str, Any], where: TileGeometry,
                checksums: Mapping[str, str],
                statistics: Mapping[str, ChunkStatistics] | None = None) -> dict[str, Any]:
    """The STAC Item of one output file.

    Parameters
    ----------
    context : StacContext
        What the run's Items share.
    fmt : {"cog", "zarr"}
    path : str
        The output file (or store).
    labels : mapping
        Its leading coordinates (``period``, ``quantile``), empty for a single output.
    where : TileGeometry
        Where the file lies (the whole grid, or one tile).
    checksums : mapping
        ``file:checksum`` per path that the writer already knows; other COGs are hashed here.
    statistics : mapping, optional
        What the write tasks computed (:attr:`rasterflow.write.result.WriteResult.statistics`): a Zarr store's per
        chunk (chunks they did not write are read back), a COG's per tile (without them, the file is read back).

    Returns
    -------
    dict
        The Item, ready for ``json.dumps``.
    """
    import numpy as np

    plan, description, encoding = context.plan, context.description, context.encoding
    grid = plan.grid
    names = list(plan.program.output_names) if plan.program is not None else []
    geometry, bbox = footprint(grid.crs, where.bounds)
    if plan.output.aoi:  # source.stac.intersects: the output holds data only inside it
        geometry, bbox = within_aoi(geometry, plan.output.aoi, bbox)
    collection_path, _items_path = stac_paths(context.output_path)
    now = rfc3339(dt.datetime.now(dt.timezone.utc))
    if fmt == "cog":
        known = (statistics or {}).get(path)
        stats = tile_statistics(known, len(names)) if known else cog_statistics(path)
    else:
        stats = zarr_statistics(path, names, statistics, nodata=encoding.nodata)
    bands = []
    for name, stat in zip(names, stats):
        band: dict[str, Any] = {"name": name, "nodata": _nodata_value(encoding.nodata),
                                "data_type": np.dtype(encoding.dtype).name, "statistics": stat}
        if encoding.is_scaled:
            band["scale"] = encoding.scale
            band["offset"] = encoding.offset
        bands.append(band)
    asset: dict[str, Any] = {
        "href": absolute_href(path), "type": COG_MEDIA_TYPE if fmt == "cog" else ZARR_MEDIA_TYPE,
        "title": ", ".join(names), "roles": ["data"], "raster:bands": bands, "file:size": path_size(path),
    }
    if fmt == "cog":  # an uploaded COG's checksum was taken (and checked against the object) by the writer
        asset["file:checksum"] = checksums.get(path) or file_checksum(path)
    info = description.range_of(labels)
    properties: dict[str, Any] = {
        # the period's start: readers that need one instant (rasterflow's own planner among them) get one
        "datetime": rfc3339(info.start),
        "start_datetime": rfc3339(info.start),
        "end_datetime": rfc3339(info.end),
        "created": now,
        "proj:code": grid.crs,
        "proj:shape": [int(where.shape[0]), int(where.shape[1])],
        "proj:transform": [float(v) for v in where.transform],
        "proj:bbox": [float(v) for v in where.bounds],
        "processing:software": {"rasterflow": description.version,
                                **{k: v for k, v in context.software.items() if v and k != "rasterflow"}},
        "processing:datetime": now,
        "processing:lineage": _lineage(description, labels, info),
        "processing:expression": {"format": "rasterflow", "expression": dict(description.expressions)},
        "rasterflow:method": description.method or "none",
        "rasterflow:item_count": info.n_items,
    }
    if labels.get("period") is not None:
        properties["rasterflow:period"] = str(labels["period"])
    if labels.get("quantile") is not None:
        properties["rasterflow:quantile"] = float(labels["quantile"])
    elif len(description.quantiles) == 1:
        properties["rasterflow:quantile"] = float(description.quantiles[0])
    if where.tile is not None:
        properties["rasterflow:tile_row"], properties["rasterflow:tile_col"] = (int(v) for v in where.tile)
    item_id = os.path.basename(str(path).rstrip("/"))  # with its extension: a Zarr and a COG of one job differ
    return {
        "type": "Feature",
        "stac_version": STAC_VERSION,
        "stac_extensions": list(STAC_EXTENSIONS.values()),
        "id": item_id,
        "collection": description.name,
        "geometry": geometry,
        "bbox": bbox,
        "properties": properties,
        "links": [
            {"rel": "self", "href": absolute_href(item_path(path)), "type": "application/geo+json"},
            {"rel": "collection", "href": absolute_href(collection_path), "type": "application/json"},
            {"rel": "parent", "href": absolute_href(collection_path), "type": "application/json"},
            {"rel": "root", "href": absolute_href(collection_path), "type": "application/json"},
            *(_input_link(item, context.catalog) for item in plan.items),
        ],
        "assets": {"data": asset},
    }


def within_aoi(geometry: dict[str, Any], aoi: str, bbox: list[float]) -> tuple[dict[str, Any], list[float]]:
    """A footprint (WGS84 GeoJSON) cut to the area of interest (WGS84 GeoJSON text), and its bbox; the footprint as
    it is where they do not meet."""
    import json

    from shapely.geometry import mapping, shape

    cut = shape(geometry).intersection(shape(json.loads(aoi)))
    if cut.is_empty:
        return geometry, bbox
    return dict(mapping(cut)), [float(v) for v in cut.bounds]


def footprint(crs: str, bounds: Sequence[float]) -> tuple[dict[str, Any], list[float]]:
    """The WGS84 footprint of a rectangle of the output grid.

    Parameters
    ----------
    crs : str
        The grid's CRS.
    bounds : sequence of float
        ``(minx, miny, maxx, maxy)`` in ``crs``.

    Returns
    -------
    (dict, list of float)
        A GeoJSON polygon (edges densified, 8 points each) and its bbox.
    """
    from pyproj import Transformer

    minx, miny, maxx, maxy = bounds
    transformer = Transformer.from_crs(crs, "EPSG:4326", always_xy=True)
    n = 8
    ring = ([(minx + (maxx - minx) * i / n, maxy) for i in range(n)]
            + [(maxx, maxy - (maxy - miny) * i / n) for i in range(n)]
            + [(maxx - (maxx - minx) * i / n, miny) for i in range(n)]
            + [(minx, miny + (maxy - miny) * i / n) for i in range(n)])
    xs, ys = transformer.transform([p[0] for p in ring], [p[1] for p in ring])
    coords = [[round(float(x), 9), round(float(y), 9)] for x, y in zip(xs, ys)]
    coords.append(coords[0])
    bbox = [min(c[0] for c in coords), min(c[1] for c in coords), max(c[0] for c in coords),
            max(c[1] for c in coords)]
    return {"type": "Polygon", "coordinates": [coords]}, bbox


def _nodata_value(value: float | None) -> int | float | str | None:
    import math

    if value is None:
        return None
    if math.isnan(value):
        return "nan"
    return int(value) if float(value).is_integer() else float(value)


def _input_link(item: Mapping[str, Any], catalog: str | None) -> dict[str, str]:
    """A ``derived_from`` link: the input item's self link, else where it was found."""
    for link in item.get("links") or []:
        if isinstance(link, Mapping) and link.get("rel") == "self" and link.get("href"):
            return {"rel": "derived_from", "href": str(link["href"]), "type": "application/geo+json",
                    "title": str(item.get("id"))}
    href = catalog or ""
    if href.startswith(("http://", "https://")) and item.get("collection"):
        href = f"{href.rstrip('/')}/collections/{item['collection']}/items/{item.get('id')}"
    elif href and not is_remote(href):
        href = os.path.abspath(href)
    return {"rel": "derived_from", "href": href, "type": "application/geo+json", "title": str(item.get("id"))}


def collection_document(context: StacContext, items: Sequence[Mapping[str, Any]], item_files: Sequence[str],
                        bbox: Sequence[float]) -> dict[str, Any]:
    """The run's STAC Collection: its extent and one ``item`` link per Item file.

    Parameters
    ----------
    context : StacContext
        What the run's Items share.
    items : sequence of mapping
        The Items (their ``start_datetime`` / ``end_datetime`` make the temporal extent).
    item_files : sequence of str
        Where the Items are written, for the ``item`` links.
    bbox : sequence of float
        The spatial extent (WGS84).

    Returns
    -------
    dict
        The Collection, ready for ``json.dumps``.
    """
    description = context.description
    collection_path, _items_path = stac_paths(context.output_path)
    starts = [item["properties"]["start_datetime"] for item in items]
    ends = [item["properties"]["end_datetime"] for item in items]
    window = [rfc3339(description.window.start), rfc3339(description.window.end)]
    return {
        "type": "Collection",
        "stac_version": STAC_VERSION,
        "stac_extensions": [],
        "id": description.name,
        "title": description.name,
        "description": f"Outputs of the rasterflow pipeline {description.name!r}: "
                       f"{_lineage(description, {}, description.window)}",
        "license": "other",
        "extent": {"spatial": {"bbox": [list(bbox)]},
                   "temporal": {"interval": [[min(starts), max(ends)] if items else window]}},
        "links": [
            {"rel": "self", "href": absolute_href(collection_path), "type": "application/json"},
            {"rel": "root", "href": absolute_href(collection_path), "type": "application/json"},
            *({"rel": "item", "href": absolute_href(f), "type": "application/geo+json"} for f in item_files),
        ],
    }


def _lineage(description: RunDescription, labels: Mapping[str, Any], info: PeriodInfo) -> str:
    method = description.method or "time series"
    if labels.get("quantile") is not None:
        method = f"quantile {float(labels['quantile']):g}"
    elif description.quantiles:
        method = "quantile " + ", ".join(f"{q:g}" for q in description.quantiles)
    bands = "; ".join(f"{name} = {expr}" for name, expr in description.expressions)
    text = f"{method} of {info.n_items} items from {rfc3339(info.start)} to {rfc3339(info.end)}: {bands}"
    if description.mask:
        text += f" (pixels where {description.mask} dropped)"
    return text

"""The output grid: its CRS, bounds and shape, the area of interest on it, and whether tiles meet chunk edges."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from rasterflow.sources import SourceTable

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.spec import Spec


@dataclass(frozen=True)
class GridPlan:
    """The output grid: CRS, pixel-aligned bounds and shape."""

    crs: str
    resolution: float
    bounds: tuple[float, float, float, float]
    """minx, miny, maxx, maxy in ``crs``; a multiple of the resolution from the origin when derived from the bbox."""
    shape: tuple[int, int]
    """(height, width) in pixels."""

    @property
    def epsg(self) -> int:
        return int(self.crs.split(":")[1])

    @property
    def transform(self) -> tuple[float, float, float, float, float, float]:
        """GDAL-style affine (a, b, c, d, e, f) of the north-up grid, as ``affine.Affine`` takes it."""
        minx, _, _, maxy = self.bounds
        return (self.resolution, 0.0, minx, 0.0, -self.resolution, maxy)


def resolve_grid(spec: Spec) -> GridPlan:
    """The output grid: ``grid.bounds`` as given, or ``source.stac.bbox`` projected and snapped to the resolution."""
    resolution = float(spec.grid.resolution)
    if spec.grid.bounds is not None:
        minx, miny, maxx, maxy = (float(v) for v in spec.grid.bounds)
    else:
        from pyproj import Transformer

        transformer = Transformer.from_crs("EPSG:4326", spec.grid.crs, always_xy=True)
        west, south, east, north = spec.source.stac.search_bbox
        minx, miny, maxx, maxy = transformer.transform_bounds(west, south, east, north, densify_pts=21)
        minx = math.floor(minx / resolution) * resolution
        miny = math.floor(miny / resolution) * resolution
        maxx = math.ceil(maxx / resolution) * resolution
        maxy = math.ceil(maxy / resolution) * resolution
    width = max(1, int(round((maxx - minx) / resolution)))
    height = max(1, int(round((maxy - miny) / resolution)))
    # Bounds that are not a whole number of pixels are extended, as stackstac does, so transform and shape agree.
    maxx, miny = minx + width * resolution, maxy - height * resolution
    return GridPlan(crs=spec.grid.crs, resolution=resolution, bounds=(minx, miny, maxx, maxy), shape=(height, width))


def plan_aoi(geometry: Mapping[str, Any], grid: GridPlan,
             chunk_yx: tuple[int, int]) -> tuple[str, frozenset[tuple[int, int]]]:
    """The area of interest in the grid's CRS (GeoJSON text, for the tasks to clip with) and the chunks entirely
    outside it (shapely's vectorised intersects over every chunk's box)."""
    import json

    import numpy as np
    import shapely

    from rasterflow.aoi import project

    projected = project(geometry, grid.crs)
    area = shapely.geometry.shape(projected)
    shapely.prepare(area)
    height, width = grid.shape
    cy, cx = chunk_yx
    minx, _, _, maxy = grid.bounds
    res = grid.resolution
    rows = np.arange(0, height, cy)
    cols = np.arange(0, width, cx)
    top, left = np.meshgrid(rows, cols, indexing="ij")
    boxes = shapely.box(minx + left * res, maxy - np.minimum(top + cy, height) * res,
                        minx + np.minimum(left + cx, width) * res, maxy - top * res)
    meets = shapely.intersects(area, boxes)
    outside = frozenset((int(i), int(j)) for i, j in zip(*np.nonzero(~meets)))
    return json.dumps(projected), outside


def tiles_on_chunk_edges(sources: SourceTable, grid: GridPlan, source_tile: tuple[int, int],
                         chunk_yx: tuple[int, int]) -> bool:
    """Whether every source block is decoded exactly once: every loaded file is read straight into the block (on the
    output grid, :attr:`AssetRead.direct`) with its ``proj:transform`` declared, its tile grid starts on a chunk
    edge (the file's first row and column are a whole number of ``source_tile`` tiles from the grid's origin), and
    the chunks are whole tiles (or the whole grid along an axis). Then no chunk or sub-block edge (sub-blocks are
    whole source tiles, :func:`rasterflow.budget.sub_block`) cuts a tile, and GDAL's block cache cannot help.

    ``source_tile`` is one file's (``plan`` reads one header): the files of a collection share their tiling."""
    tile_y, tile_x = source_tile
    if tile_y <= 0 or tile_x <= 0:
        return False
    height, width = grid.shape
    cy, cx = chunk_yx
    if (cy % tile_y and cy < height) or (cx % tile_x and cx < width):
        return False
    res = grid.resolution
    left, top = grid.bounds[0], grid.bounds[3]
    for reads in sources.reads:
        for read in reads:
            if read is None:
                continue
            if not read.direct or read.transform is None:
                return False
            row = (top - read.transform[5]) / res  # the output row of the file's first row
            col = (read.transform[2] - left) / res
            if round(row) % tile_y or round(col) % tile_x:
                return False
    return True

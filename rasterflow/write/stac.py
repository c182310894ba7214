"""STAC metadata for the outputs of a run, and the description the writers put into COG tags and Zarr attributes.

After the data is complete, :func:`write_stac` writes, next to the output (``out/ndvi.tif`` or ``out/ndvi.zarr``),
named like the run report (``<output>.report.json``), so a Zarr and a COG of one job never collide:

``<file>.stac-item.json``
    One STAC Item per output file (one per period / quantile for COG, one for a Zarr store): ``proj:code``,
    ``proj:shape``, ``proj:transform``; ``raster:bands`` (nodata, data_type, scale, offset and statistics of the
    stored values); ``start_datetime``/``end_datetime`` of the window or of the file's period; the processing
    extension (software versions, lineage, the band expressions); ``derived_from`` links to every input item;
    ``file:size`` and (for files) ``file:checksum`` of each asset.
``<output>.stac-collection.json``
    The run's Collection (id = the pipeline name): extent and one ``item`` link per Item. Written for single-output
    runs too, because an Item that names its collection must link to it, and a next spec selects the items by
    ``collections: [<pipeline name>]``.
``<output>.stac-items.json``
    All Items as a GeoJSON FeatureCollection: a local catalog another rasterflow spec can search directly.

A tiled output (``output.tiling``, :mod:`rasterflow.tiling`) has one Item per tile file, written right after that
tile (:func:`write_tile_items`: the tile's footprint, ``proj:shape``/``proj:transform`` of the tile,
``rasterflow:tile_row``/``rasterflow:tile_col``), and one Collection of all of them written once every tile is
(:func:`write_tile_collection`), with the items file last as for one output.

Each document is written atomically (temporary file, then rename) and only after the data, the items file last,
so the presence of ``<output>.stac-items.json`` means the whole run is complete. Hrefs are absolute (local paths or
the output URL), so the items work from wherever they are read.

This module writes the documents, in that order. The parts live in modules of their own, and the names other modules
import from here are re-exported: :mod:`rasterflow.write.describe` (the run's description, shared with the COG tags
and the Zarr attributes), :mod:`rasterflow.write.stacitems` (building the Items and the Collection),
:mod:`rasterflow.write.stacstats` (the ``raster:bands`` statistics), :mod:`rasterflow.write.stacfiles` (the
documents' names, the atomic write, checksums).

This module is light: stdlib at import time; numpy, rasterio, zarr and pyproj load inside the functions.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rasterflow.write.describe import (
    PeriodInfo,
    RunDescription,
    cog_file_metadata,
    describe_run,
    leading_coords,
)
from rasterflow.write.encoding import Encoding
from rasterflow.write.naming import cog_entries
from rasterflow.write.stacfiles import file_checksum, item_path, read_json, stac_paths, write_text
from rasterflow.write.stacitems import (
    COG_MEDIA_TYPE,
    STAC_EXTENSIONS,
    STAC_VERSION,
    ZARR_MEDIA_TYPE,
    StacContext,
    TileGeometry,
    collection_document,
    footprint,
    output_item,
)
from rasterflow.write.stacstats import STATISTICS_CACHEMAX, BlockStats, ChunkStatistics, chunk_statistics

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.planning import JobPlan
    from rasterflow.write.result import WriteResult

__all__ = [
    "STAC_VERSION",
    "STAC_EXTENSIONS",
    "RunDescription",
    "StacOutputs",
    "describe_run",
    "stac_paths",
    "item_path",
    "write_stac",
    "write_text",
    "TileGeometry",
    "StacContext",
    "write_tile_items",
    "write_tile_collection",
    # imported from here by other modules too (not in this list before the split)
    "COG_MEDIA_TYPE",
    "ZARR_MEDIA_TYPE",
    "PeriodInfo",
    "leading_coords",
    "cog_file_metadata",
    "file_checksum",
    "BlockStats",
    "ChunkStatistics",
    "chunk_statistics",
    "STATISTICS_CACHEMAX",
]


@dataclasses.dataclass(frozen=True)
class StacOutputs:
    """The STAC documents a run wrote."""

    items: tuple[str, ...]
    collection: str
    items_file: str


def write_stac(
    result: WriteResult,
    plan: JobPlan,
    description: RunDescription,
    *,
    output_path: str,
    encoding: Encoding,
    software: Mapping[str, str | None],
    catalog: str | None = None,
) -> StacOutputs:
    """Write an Item per output file, the run's Collection and the items file, after the data is complete.

    Parameters
    ----------
    result : rasterflow.write.WriteResult
        What the writer produced (its ``paths`` exist and are complete).
    plan : rasterflow.planning.JobPlan
        The plan the outputs were computed from (grid, items, bands).
    description : RunDescription
        From :func:`describe_run`.
    output_path : str
        The output as the spec names it (before per-period / per-quantile suffixes).
    encoding : Encoding
        The resolved encoding the writer used (stored dtype, scale, offset, nodata).
    software : mapping
        Library versions for ``processing:software``.
    catalog : str, optional
        The input catalog (file or API root), for ``derived_from`` links of items without a self link.

    Returns
    -------
    StacOutputs
        The files written.
    """
    context = StacContext(plan=plan, description=description, output_path=output_path, encoding=encoding,
                          software=software, catalog=catalog)
    fmt = result.format
    if fmt == "cog":
        entries = [(labels, path) for _pos, labels, path in cog_entries(output_path, leading_coords(plan))]
    else:
        entries = [({}, str(result.paths[0]))]
    grid = plan.grid
    whole = TileGeometry(bounds=tuple(grid.bounds), shape=(int(grid.shape[0]), int(grid.shape[1])),
                         transform=tuple(grid.transform))
    items: list[dict[str, Any]] = []
    item_files: list[str] = []
    for labels, path in entries:
        item = output_item(context, fmt, path, labels, whole, result.checksums, result.statistics)
        item_file = item_path(path)
        write_text(item_file, json.dumps(item, indent=2, allow_nan=False) + "\n")
        items.append(item)
        item_files.append(item_file)
    bbox = items[0]["bbox"] if items else footprint(grid.crs, grid.bounds)[1]
    return _write_collection(context, items, item_files, bbox)


def _write_collection(context: StacContext, items: Sequence[Mapping[str, Any]], item_files: Sequence[str],
                      bbox: Sequence[float]) -> StacOutputs:
    """The run's Collection, then the items file (last: its presence means the run is complete)."""
    collection_path, items_path = stac_paths(context.output_path)
    collection = collection_document(context, items, item_files, bbox)
    write_text(collection_path, json.dumps(collection, indent=2, allow_nan=False) + "\n")
    # last: its presence means every output and every document of the run is complete
    write_text(items_path, json.dumps({"type": "FeatureCollection", "features": list(items)}, indent=2,
                                      allow_nan=False) + "\n")
    return StacOutputs(items=tuple(item_files), collection=collection_path, items_file=items_path)


def write_tile_items(context: StacContext, fmt: str, entries: Sequence[tuple[Mapping[str, Any], str]],
                     where: TileGeometry, checksums: Mapping[str, str] | None = None,
                     statistics: Mapping[str, ChunkStatistics] | None = None) -> list[str]:
    """Write the Items of one tile's files, right after the tile is written. The Collection comes last
    (:func:`write_tile_collection`).

    Parameters
    ----------
    context : StacContext
        What the run's Items share.
    fmt : {"cog", "zarr"}
    entries : sequence of (mapping, str)
        ``(labels, path)`` per period / quantile file of the tile.
    where : TileGeometry
        The tile's bounds, shape, transform and ``(row, col)``.
    checksums : mapping, optional
        ``file:checksum`` per path that the writer already knows.
    statistics : mapping, optional
        A Zarr tile's per-chunk statistics from its write tasks (:attr:`WriteResult.statistics`).

    Returns
    -------
    list of str
        The Item files written.
    """
    files: list[str] = []
    for labels, path in entries:
        item = output_item(context, fmt, path, labels, where, checksums or {}, statistics)
        files.append(item_path(path))
        write_text(files[-1], json.dumps(item, indent=2, allow_nan=False) + "\n")
    return files


def write_tile_collection(context: StacContext, item_files: Sequence[str]) -> StacOutputs:
    """Write the Collection of a tiled output (one ``item`` link per tile x period) and its items file, once every
    tile is written.

    Parameters
    ----------
    context : StacContext
        What the run's Items share.
    item_files : sequence of str
        Every tile's Item files: Items of tiles kept from an interrupted run are read back from them.

    Returns
    -------
    StacOutputs
        The files written.
    """
    items = [read_json(f) for f in item_files]
    grid = context.plan.grid
    _geometry, bbox = footprint(grid.crs, grid.bounds)
    return _write_collection(context, items, item_files, bbox)

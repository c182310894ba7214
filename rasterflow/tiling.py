"""``output.tiling``: the grid written as tiles, each an output of its own, written and resumed independently.

Layout (``output.path: out/ndvi.tif``, ``tiling: {size: 8192}``)
----------------------------------------------------------------
``out/ndvi/<row>_<col>.tif``
    One COG per tile (``<row>_<col>_<period>.tif`` etc. with leading dims, named by the COG writer's rule), row 0 at
    the top (north), column 0 at the left, zero-padded to 3 digits (more when a grid has over 1000 tiles a side).
    A Zarr output is one store per tile, ``out/ndvi/<row>_<col>.zarr``.
``out/ndvi/<file>.stac-item.json``
    The Item of each tile file, written right after the tile (geometry, ``proj:*`` of the tile,
    ``rasterflow:tile_row`` / ``rasterflow:tile_col``).
``out/ndvi/.rasterflow/<row>_<col>.<ext>.json``
    The tile's marker: the job's fingerprint and ``writing`` (written before the tile) or ``done`` with the size of
    each file (after the files and Items). It is what makes tiles *ours* and *finished*: a rerun of the same job
    skips every tile that is done and whose files still have their sizes, and rewrites the others.
``out/ndvi.tif.stac-collection.json`` / ``out/ndvi.tif.stac-items.json``
    The Collection of every tile Item, and the items file (last: its presence means the run is complete).
``out/ndvi.vrt`` (COG only)
    A GDAL VRT mosaic of the tiles (``out/ndvi_<period>.vrt`` per period / quantile), see
    :mod:`rasterflow.write.vrt`.

Empty tiles: a tile that no input file's footprint on the grid touches is not computed and not written (no file, no
Item, a hole in the mosaic that reads as nodata). A tile that inputs touch is written even when every pixel comes
out nodata (masked clouds): it is a result, and its Item's ``statistics`` say ``valid_percent: 0``.

Each tile is written by the ordinary writers on a window of the lazy Dataset (``ds.isel``; Dask culls the other
tiles' tasks), so their atomic publishing, the Zarr writer's block-level resume inside a tile and the COG writer's
bounded streaming are the same as for one output. This module is light: stdlib at import; the pixel libraries load
inside :func:`write_tiles`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import posixpath
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from rasterflow.outputs import Existing, foreign_reason
from rasterflow.write.common import (
    WriteResult,
    cog_entries,
    exists,
    filesystem,
    is_remote,
    path_size,
    remove,
)

if TYPE_CHECKING:  # pragma: no cover
    import dask.array as da
    import xarray as xr

    from rasterflow.layers import Task
    from rasterflow.planning import JobPlan
    from rasterflow.sources import AssetRead
    from rasterflow.write.stac import StacContext

_T = TypeVar("_T")

__all__ = [
    "Tile", "TileLayout", "plan_tiles", "tile_directory", "inspect_tiles", "tiles_to_write", "write_tiles",
    "finish_tiles", "what_is_left", "MARKER_DIR",
]

MARKER_DIR = ".rasterflow"
"""The markers of a tiled output live in ``<tile directory>/.rasterflow/``."""

_MIN_DIGITS = 3


@dataclasses.dataclass(frozen=True)
class Tile:
    """One tile of the grid."""

    row: int
    col: int
    name: str
    """``<row>_<col>``, zero-padded: ``000_001``."""
    rows: tuple[int, int]
    """Grid rows ``[start, stop)``."""
    cols: tuple[int, int]
    """Grid columns ``[start, stop)``."""
    path: str
    """The output the writer is given (``out/ndvi/000_001.tif``)."""
    files: tuple[str, ...]
    """What the writer makes of it: ``path``, or one COG per period / quantile."""
    entries: tuple[tuple[Mapping[str, Any], str], ...]
    """``(labels, file)`` per file (labels: its period / quantile)."""
    bounds: tuple[float, float, float, float]
    """minx, miny, maxx, maxy in the grid's CRS."""
    resolution: float

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows[1] - self.rows[0], self.cols[1] - self.cols[0])

    @property
    def transform(self) -> tuple[float, float, float, float, float, float]:
        """The tile's affine ``(a, b, c, d, e, f)``."""
        minx, _, _, maxy = self.bounds
        return (self.resolution, 0.0, minx, 0.0, -self.resolution, maxy)


@dataclasses.dataclass(frozen=True)
class TileLayout:
    """The tiles of one output."""

    output_path: str
    fmt: str
    size: int
    directory: str
    n_rows: int
    n_cols: int
    tiles: tuple[Tile, ...]
    """The tiles to write (those some input file touches), row-major."""
    empty: tuple[str, ...]
    """Names of the tiles no input touches (not written)."""
    coords: Mapping[str, Sequence[Any]]
    """The leading dims (period, quantile) of every tile."""

    def files(self) -> list[str]:
        """Every file (store) the tiles make."""
        return [f for tile in self.tiles for f in tile.files]

    def marker(self, tile_name: str) -> str:
        """``<directory>/.rasterflow/<name>.<ext>.json``: a COG and a Zarr output of one stem keep theirs apart."""
        suffix = os.path.splitext(self.output_path.rstrip("/"))[1]
        return _join(self.directory, MARKER_DIR, f"{tile_name}{suffix}.json")

    def vrt_entries(self) -> list[tuple[dict[str, int], dict[str, Any], str]]:
        """``(positions, labels, vrt path)`` per leading entry: ``out/ndvi.vrt`` or ``out/ndvi_<period>.vrt``."""
        stem = os.path.splitext(self.output_path.rstrip("/"))[0]
        return cog_entries(stem + ".vrt", dict(self.coords))


def _join(base: str, *parts: str) -> str:
    return posixpath.join(base, *parts) if is_remote(base) else os.path.join(base, *parts)


def tile_directory(output_path: str) -> str:
    """The folder of the tiles: the output path without its extension (``out/ndvi.tif`` -> ``out/ndvi``)."""
    return os.path.splitext(str(output_path).rstrip("/"))[0]


def _touched(n_rows: int, n_cols: int, size: int,
             reads: Sequence[Sequence[AssetRead]] | None) -> set[tuple[int, int]]:
    """The tiles some input file's footprint touches (every tile when a file's footprint is unknown)."""
    if reads is None:
        return {(r, c) for r in range(n_rows) for c in range(n_cols)}
    touched: set[tuple[int, int]] = set()
    for item_reads in reads:
        for read in item_reads:
            if read.footprint is None:
                return {(r, c) for r in range(n_rows) for c in range(n_cols)}
            r0, r1, c0, c1 = read.footprint
            if r1 <= r0 or c1 <= c0:
                continue
            for r in range(r0 // size, min(n_rows, math.ceil(r1 / size))):
                for c in range(c0 // size, min(n_cols, math.ceil(c1 / size))):
                    touched.add((r, c))
    return touched


def plan_tiles(output_path: str, fmt: str, size: int, plan: JobPlan,
               coords: Mapping[str, Sequence[Any]]) -> TileLayout:
    """The tiles of a planned job's output (no I/O).

    Parameters
    ----------
    output_path : str
        The output as the spec names it (``out/ndvi.tif``).
    fmt : {"cog", "zarr"}
    size : int
        ``output.tiling.size``: tile edge in grid pixels.
    plan : rasterflow.planning.JobPlan
        Its grid, and its sources' footprints (which tiles any input touches).
    coords : mapping
        The leading dims of the output (:func:`rasterflow.write.stac.leading_coords`).
    """
    grid = plan.grid
    height, width = (int(v) for v in grid.shape)
    n_rows, n_cols = math.ceil(height / size), math.ceil(width / size)
    digits = max(_MIN_DIGITS, len(str(max(n_rows, n_cols) - 1)))
    directory = tile_directory(output_path)
    suffix = os.path.splitext(str(output_path).rstrip("/"))[1]
    sources = plan.sources
    touched = _touched(n_rows, n_cols, size, sources.reads if sources is not None else None)
    minx, _, _, maxy = (float(v) for v in grid.bounds)
    res = float(grid.resolution)
    tiles: list[Tile] = []
    empty: list[str] = []
    for r in range(n_rows):
        for c in range(n_cols):
            name = f"{r:0{digits}d}_{c:0{digits}d}"
            if (r, c) not in touched:
                empty.append(name)
                continue
            rows = (r * size, min(height, (r + 1) * size))
            cols = (c * size, min(width, (c + 1) * size))
            path = _join(directory, name + suffix)
            entries: tuple[tuple[Mapping[str, Any], str], ...]
            if fmt == "cog":
                entries = tuple((labels, p) for _pos, labels, p in cog_entries(path, dict(coords)))
            else:
                entries = (({}, path),)
            bounds = (minx + cols[0] * res, maxy - rows[1] * res, minx + cols[1] * res, maxy - rows[0] * res)
            tiles.append(Tile(row=r, col=c, name=name, rows=rows, cols=cols, path=path,
                              files=tuple(p for _labels, p in entries), entries=entries, bounds=bounds,
                              resolution=res))
    return TileLayout(output_path=str(output_path), fmt=fmt, size=int(size), directory=directory, n_rows=n_rows,
                      n_cols=n_cols, tiles=tuple(tiles), empty=tuple(empty), coords=dict(coords))


# --------------------------------------------------------------------------------------------------------------------
# markers: which tiles are ours, and which are finished


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        if is_remote(path):
            fs, inner = filesystem(path)
            data = json.loads(fs.cat_file(inner).decode("utf-8"))
        else:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_marker(layout: TileLayout, tile: Tile, fingerprint: str, state: str, **extra: Any) -> None:
    from rasterflow.write.stac import write_text

    write_text(layout.marker(tile.name), json.dumps({"fingerprint": fingerprint, "state": state, **extra},
                                                    indent=1) + "\n")


def _markers(layout: TileLayout) -> dict[str, dict[str, Any]]:
    """Every marker of this output's tiles (the layout's and those of earlier jobs), by tile name."""
    folder = _join(layout.directory, MARKER_DIR)
    suffix = os.path.splitext(layout.output_path.rstrip("/"))[1] + ".json"
    try:
        if is_remote(folder):
            fs, inner = filesystem(folder)
            names = [posixpath.basename(p) for p in fs.ls(inner, detail=False)]
        else:
            names = os.listdir(folder)
    except (OSError, FileNotFoundError):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        if name.endswith(suffix) and not name.startswith("."):
            data = _read_json(_join(folder, name))
            if data is not None:
                out[name[: -len(suffix)]] = data
    return out


def _is_done(marker: Mapping[str, Any] | None, tile: Tile, fingerprint: str | None) -> bool:
    """The marker says this tile is finished (by the job ``fingerprint``, when given) and its files are intact."""
    if not marker or marker.get("state") != "done":
        return False
    if fingerprint is not None and marker.get("fingerprint") != fingerprint:
        return False
    sizes = marker.get("files") or {}
    return all(f in sizes and exists(f) and (sizes[f] is None or path_size(f) == sizes[f]) for f in tile.files)


def inspect_tiles(layout: TileLayout, input_hrefs: Sequence[str] = ()) -> Existing:
    """What is at a tiled output's paths, as :func:`rasterflow.outputs.inspect_existing` says it for one output.

    A tile file is *ours* when its tile has a marker (a kill between the files and the marker leaves ``writing``,
    which still names this output's job); the fingerprint is the markers' when they agree; *complete* when every tile
    is done by that job and its files have the sizes the marker recorded.
    """
    files = layout.files()
    existing = tuple(f for f in files if exists(f))
    if not existing:
        return Existing((), True, None, False)
    reason = foreign_reason(existing, input_hrefs)
    if reason:
        return Existing(existing, False, None, False, reason)
    markers = _markers(layout)
    owner = {f: tile.name for tile in layout.tiles for f in tile.files}
    unmarked = [f for f in existing if owner[f] not in markers]
    if unmarked:
        return Existing(existing, False, None, False,
                        f"{unmarked[0]} has no rasterflow marker in {_join(layout.directory, MARKER_DIR)} (it was "
                        f"not written by rasterflow)")
    prints = {str(markers[owner[f]].get("fingerprint")) for f in existing}
    fingerprint = prints.pop() if len(prints) == 1 else None
    from rasterflow.write.stac import stac_paths

    # the items file is written last (after the mosaic and the Collection): a run killed after its last tile is
    # finished by the next run, not taken for complete
    complete = (fingerprint is not None and all(_is_done(markers.get(t.name), t, fingerprint) for t in layout.tiles)
                and exists(stac_paths(layout.output_path)[1]))
    return Existing(existing, True, fingerprint, complete)


def tiles_to_write(layout: TileLayout, fingerprint: str, *, redo_all: bool = False) -> tuple[list[Tile], list[Tile]]:
    """``(to write, kept)``: a tile done by this job (same fingerprint, files intact) is kept unless ``redo_all``
    (``if_exists: overwrite`` of a complete output)."""
    markers = {} if redo_all else _markers(layout)
    todo: list[Tile] = []
    kept: list[Tile] = []
    for tile in layout.tiles:
        (kept if _is_done(markers.get(tile.name), tile, fingerprint) else todo).append(tile)
    return todo, kept


# --------------------------------------------------------------------------------------------------------------------
# writing


@dataclasses.dataclass(frozen=True)
class TilesResult(WriteResult):
    """A :class:`~rasterflow.write.common.WriteResult` of every tile, and which tiles this run wrote."""

    tiles_written: tuple[str, ...] = ()
    tiles_kept: tuple[str, ...] = ()
    item_files: tuple[str, ...] = ()
    """The STAC Item of every tile file (written now or kept)."""


def _blocks(ds: xr.Dataset, fmt: str) -> int:
    """The progress units a writer reports for ``ds``: COG = leading entries x spatial chunks; Zarr = chunks of
    every variable."""
    names = list(ds.data_vars)
    if fmt == "zarr":
        return sum(math.prod(ds[n].data.numblocks) for n in names)
    data: da.Array = ds[names[0]].data
    leading: tuple[int, ...] = data.shape[:-2]
    spatial: tuple[int, ...] = data.numblocks[-2:]
    return math.prod(leading) * math.prod(spatial)


def _same(block: _T) -> _T:
    return block


class _WindowTasks:
    """Block ``(*lead, i, j)`` of a window: block ``(*lead, i + i0, j + j0)`` of the source."""

    def __init__(self, source: str, i0: int, j0: int):
        self.source, self.i0, self.j0 = source, i0, j0

    def __call__(self, block: tuple[int, ...]) -> Task:
        return (_same, (self.source, *block[:-2], block[-2] + self.i0, block[-1] + self.j0))


def window_of(dataset: xr.Dataset, rows: tuple[int, int], cols: tuple[int, int]) -> xr.Dataset:
    """``dataset.isel(y=slice(*rows), x=slice(*cols))``; a variable of rasterflow's own lazy arrays
    (:func:`rasterflow.layers.lazy_array`) cut on its chunks' edges stays one (a view of its blocks), so the writer
    submits its tasks itself rather than through Dask's slicing."""
    import dask.base
    import numpy as np

    from rasterflow.layers import lazy_array, layer_named

    window = dataset.isel(y=slice(*rows), x=slice(*cols))
    for name in list(dataset.data_vars):
        data = dataset[name].data
        if layer_named(getattr(data, "name", None)) is None:
            continue
        edges = [np.concatenate([[0], np.cumsum(c)]).tolist() for c in data.chunks[-2:]]
        if not all(a in e and b in e for (a, b), e in zip((rows, cols), edges)):
            continue  # not on the chunks' edges: Dask's slicing
        i0, i1, j0, j1 = edges[0].index(rows[0]), edges[0].index(rows[1]), edges[1].index(cols[0]), edges[1].index(cols[1])
        view_name = "rasterflow-window-" + dask.base.tokenize(data.name, rows, cols)
        chunks = data.chunks[:-2] + (data.chunks[-2][i0:i1], data.chunks[-1][j0:j1])
        view = lazy_array(view_name, tuple(len(c) for c in chunks), _WindowTasks(data.name, i0, j0), chunks,
                          data.dtype, [data], inline=True)
        window[name] = window[name].copy(data=view)
    return window


class WriteOne(Protocol):
    """The format's writer with the run's options bound (``write_cog`` / ``write_zarr``), for one tile."""

    def __call__(self, ds: xr.Dataset, path: str, *, overwrite: bool, progress: Callable[[int, int], None],
                 file_metadata: Mapping[str, Mapping[str, Any]] | None) -> WriteResult:
        ...


def write_tiles(dataset: xr.Dataset, layout: TileLayout, todo: Sequence[Tile], kept: Sequence[Tile], *,
                fingerprint: str, write_one: WriteOne, stac: StacContext,
                progress: Callable[[int, int], None] | None = None) -> TilesResult:
    """Write each tile of ``todo`` with ``write_one``, one after the other, each atomically.

    Parameters
    ----------
    dataset : xarray.Dataset
        The lazy output of the whole grid; each tile is a window of it (``isel``), so only its tasks are computed.
    layout : TileLayout
    todo, kept : sequence of Tile
        From :func:`tiles_to_write`.
    fingerprint : str
        The job's identity, recorded in each tile's marker.
    write_one : callable
        ``write_one(ds, path, *, overwrite, progress, file_metadata) -> WriteResult``: the format's writer with the
        run's options bound (``write_cog`` / ``write_zarr``).
    stac : rasterflow.write.stac.StacContext
        What the tiles' Items share.
    progress : callable, optional
        ``progress(done, total)`` over all tiles' blocks (kept tiles count as done).
    """
    from rasterflow.georef import with_transform
    from rasterflow.write.stac import TileGeometry, cog_file_metadata, item_path, stac_paths, write_tile_items

    if todo:  # its presence says the output is complete: not while tiles are rewritten
        remove(stac_paths(layout.output_path)[1])

    windows = {tile.name: with_transform(window_of(dataset, tile.rows, tile.cols), tile.transform)
               for tile in list(todo) + list(kept)}
    sizes = {name: _blocks(ds, layout.fmt) for name, ds in windows.items()}
    total = sum(sizes.values())
    skipped = sum(sizes[t.name] for t in kept)
    done_before = skipped
    written = 0
    if progress is not None and kept:
        progress(done_before, total)
    for tile in todo:
        ds = windows[tile.name]
        tile_total = sizes[tile.name]

        def tile_progress(done: int, of: int, _base: int = done_before, _all: int = tile_total) -> None:
            if progress is not None:  # a resumed Zarr tile reports only its missing blocks: the rest count as done
                progress(_base + max(0, _all - of) + done, total)

        _write_marker(layout, tile, fingerprint, "writing")
        metadata = (cog_file_metadata(stac.description, tile.path, stac.plan) if layout.fmt == "cog" else None)
        result = write_one(ds, tile.path, overwrite=any(exists(f) for f in tile.files), progress=tile_progress,
                           file_metadata=metadata)
        items = write_tile_items(stac, layout.fmt, tile.entries,
                                 TileGeometry(bounds=tile.bounds, shape=tile.shape, transform=tile.transform,
                                              tile=(tile.row, tile.col)), result.checksums, result.statistics)
        _write_marker(layout, tile, fingerprint, "done", files={f: path_size(f) for f in tile.files}, items=items)
        written += result.blocks_written
        skipped += result.blocks_skipped
        done_before += tile_total
    item_files = tuple(item_path(f) for tile in layout.tiles for f in tile.files)
    paths = tuple(layout.files())
    return TilesResult(paths=paths, bytes_written=sum(path_size(p) for p in paths), blocks_written=written,
                       blocks_skipped=skipped, format=layout.fmt, tiles_written=tuple(t.name for t in todo),
                       tiles_kept=tuple(t.name for t in kept), item_files=item_files)


def _remove_stale(layout: TileLayout) -> list[str]:
    """Delete the tiles of earlier jobs at this output that this job does not make (another grid, a tile now empty):
    only files their marker lists, with their Items, then the marker. Returns the files removed."""
    from rasterflow.write.stac import item_path

    current = {t.name for t in layout.tiles}
    removed: list[str] = []
    for name, marker in _markers(layout).items():
        if name in current:
            continue
        for f in (marker.get("files") or {}):
            if str(f).startswith(layout.directory):
                for path in (str(f), item_path(str(f))):
                    if exists(path):
                        remove(path)
                        removed.append(path)
        remove(layout.marker(name))
    return removed


def finish_tiles(layout: TileLayout, result: TilesResult, stac: StacContext, *, band_names: Sequence[str],
                 blocksize: int = 512) -> tuple[str, ...]:
    """After every tile: remove stale tiles of earlier jobs, write the VRT mosaic(s) (COG) and the Collection.

    Returns the VRT files written.
    """
    from rasterflow.write.stac import write_text, write_tile_collection
    from rasterflow.write.vrt import VrtSource, vrt_text

    _remove_stale(layout)
    vrts: list[str] = []
    if layout.fmt == "cog":
        grid = stac.plan.grid
        encoding = stac.encoding
        for positions, _labels, vrt in layout.vrt_entries():
            index = _entry_index(positions, layout.coords)
            sources = [VrtSource(path=tile.files[index], row=tile.rows[0], col=tile.cols[0], height=tile.shape[0],
                                 width=tile.shape[1], block=(blocksize, blocksize)) for tile in layout.tiles]
            text = vrt_text(vrt, width=int(grid.shape[1]), height=int(grid.shape[0]), crs=grid.crs,
                            transform=grid.transform, dtype=str(encoding.dtype), band_names=band_names,
                            sources=sources, nodata=encoding.nodata, scale=encoding.scale, offset=encoding.offset)
            write_text(vrt, text)
            vrts.append(vrt)
    write_tile_collection(stac, result.item_files)
    return tuple(vrts)


def _entry_index(positions: Mapping[str, int], coords: Mapping[str, Sequence[Any]]) -> int:
    """The row-major index of one leading entry (the order :func:`cog_entries` lists a tile's files in)."""
    index = 0
    for dim, values in coords.items():
        index = index * len(values) + int(positions[dim])
    return index


def what_is_left(layout: TileLayout, fingerprint: str) -> str:
    """For an interrupted run: how many tiles are finished and what a rerun does."""
    done = len(tiles_to_write(layout, fingerprint)[1])
    total = len(layout.tiles)
    return (f"{done} of {total} tiles are finished in {layout.directory}; rerunning the same command writes only the "
            f"other {total - done}")

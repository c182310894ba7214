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

This module is light: stdlib at import time; numpy, rasterio, zarr and pyproj load inside the functions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rasterflow.write.common import Encoding, cog_entries, is_remote

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
]

STAC_VERSION = "1.1.0"
STAC_EXTENSIONS = {
    "proj": "https://stac-extensions.github.io/projection/v2.0.0/schema.json",
    "raster": "https://stac-extensions.github.io/raster/v1.1.0/schema.json",
    "processing": "https://stac-extensions.github.io/processing/v1.2.0/schema.json",
    "file": "https://stac-extensions.github.io/file/v2.1.0/schema.json",
}
COG_MEDIA_TYPE = "image/tiff; application=geotiff; profile=cloud-optimized"
ZARR_MEDIA_TYPE = "application/vnd+zarr"


# --------------------------------------------------------------------------------------------------------------------
# what a run computed: shared by the COG tags, the Zarr attributes and the STAC documents


@dataclasses.dataclass(frozen=True)
class PeriodInfo:
    """The time range and the inputs of one period (or of the whole window)."""

    start: dt.datetime
    end: dt.datetime
    n_items: int


@dataclasses.dataclass(frozen=True)
class RunDescription:
    """What produced the outputs, decided by the plan (nothing here reads pixels)."""

    name: str
    method: str | None
    """The reduction (``median``...), None for a time series."""
    quantiles: tuple[float, ...]
    period: str | None
    """``month`` | ``season`` | ``year``, None for the whole window."""
    window: PeriodInfo
    periods: Mapping[str, PeriodInfo]
    """Per period label ("2024-06"): its range, clipped to the window, and how many items fall in it."""
    expressions: tuple[tuple[str, str], ...]
    mask: str | None
    version: str
    item_ids: tuple[str, ...]

    def range_of(self, labels: Mapping[str, Any]) -> PeriodInfo:
        """The time range of one output entry (its period's, else the window's)."""
        label = labels.get("period")
        if label is not None and str(label) in self.periods:
            return self.periods[str(label)]
        return self.window

    def attrs(self) -> dict[str, Any]:
        """JSON-valued attributes (Zarr group attributes; COG tags as text)."""
        out: dict[str, Any] = {
            "rasterflow_version": self.version,
            "rasterflow_pipeline": self.name,
            "rasterflow_method": self.method or "none",
            "rasterflow_start_datetime": _rfc3339(self.window.start),
            "rasterflow_end_datetime": _rfc3339(self.window.end),
            "rasterflow_item_count": self.window.n_items,
            "rasterflow_expressions": dict(self.expressions),
        }
        if self.quantiles:
            out["rasterflow_quantiles"] = list(self.quantiles)
        if self.period:
            out["rasterflow_period"] = self.period
        if self.mask:
            out["rasterflow_mask"] = self.mask
        return out

    def entry_attrs(self, labels: Mapping[str, Any]) -> dict[str, Any]:
        """What differs for one file of a per-period output: its own range and item count."""
        if labels.get("period") is None:
            return {}
        info = self.range_of(labels)
        return {"rasterflow_start_datetime": _rfc3339(info.start), "rasterflow_end_datetime": _rfc3339(info.end),
                "rasterflow_item_count": info.n_items}


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


def _rfc3339(value: dt.datetime) -> str:
    from rasterflow.spec.timeparse import format_rfc3339

    return format_rfc3339(value)


def _period_bounds(label: str, period: str) -> tuple[dt.datetime, dt.datetime]:
    """[first instant, last instant] of a period label as :func:`rasterflow.kernels.period_labels` writes them."""
    utc = dt.timezone.utc
    last = dt.timedelta(microseconds=1)
    if period == "year":
        year = int(label)
        return dt.datetime(year, 1, 1, tzinfo=utc), dt.datetime(year + 1, 1, 1, tzinfo=utc) - last
    if period == "month":
        year, month = (int(p) for p in label.split("-"))
        nxt = dt.datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=utc)
        return dt.datetime(year, month, 1, tzinfo=utc), nxt - last
    if period == "season":
        year_text, season = label.split("-")
        year = int(year_text)
        first_month = {"DJF": 12, "MAM": 3, "JJA": 6, "SON": 9}[season]
        start = dt.datetime(year - 1 if season == "DJF" else year, first_month, 1, tzinfo=utc)
        end_month = first_month + 3
        end = dt.datetime(start.year + (end_month > 12), (end_month - 1) % 12 + 1, 1, tzinfo=utc)
        return start, end - last
    raise ValueError(f"unknown period {period!r}")


def describe_run(plan: Any, *, window: tuple[dt.datetime | None, dt.datetime | None], period: str | None = None,
                 mask: str | None = None, version: str | None = None) -> RunDescription:
    """The description of a planned run.

    Parameters
    ----------
    plan : rasterflow.planning.JobPlan
        A plan made with the searched items.
    window : (start, end)
        The search window (``DatetimeWindow.resolve()``); an open end is replaced by the first / last item's time.
    period : str, optional
        ``reduce.period``.
    mask : str, optional
        The spec's mask expression.
    """
    from rasterflow.kernels import period_labels
    from rasterflow.spec.timeparse import parse_instant

    if version is None:
        from rasterflow import __version__ as version
    times = sorted(_utc(parse_instant(item["properties"].get("datetime") or item["properties"]["start_datetime"]))
                   for item in plan.items)
    start, end = window
    start = _utc(start) if start is not None else (times[0] if times else dt.datetime.now(dt.timezone.utc))
    end = _utc(end) if end is not None else (times[-1] if times else start)
    periods: dict[str, PeriodInfo] = {}
    if period and times:
        import numpy as np

        labels = period_labels([np.datetime64(t.replace(tzinfo=None)) for t in times], period)
        for label in dict.fromkeys(labels):
            first, last = _period_bounds(label, period)
            periods[label] = PeriodInfo(max(first, start), min(last, end), labels.count(label))
    program = plan.program
    return RunDescription(
        name=plan.name, method=program.reduce_method if program is not None else None,
        quantiles=tuple(program.quantiles) if program is not None else (), period=period,
        window=PeriodInfo(start, end, len(plan.items)), periods=periods, expressions=tuple(plan.expressions),
        mask=mask, version=str(version), item_ids=tuple(str(item.get("id")) for item in plan.items),
    )


def leading_coords(plan: Any) -> dict[str, list]:
    """The output's leading dimensions (period, quantile) as the writers name them."""
    coords: dict[str, list] = {}
    if plan.period_labels:
        coords["period"] = list(plan.period_labels)
    if plan.quantile_dim and plan.program is not None:
        coords["quantile"] = list(plan.program.quantiles)
    return coords


def cog_file_metadata(description: RunDescription, output_path: str, plan: Any) -> dict[str, dict[str, Any]]:
    """Per COG file: the tags that differ from the run's (its period's range and item count)."""
    return {path: description.entry_attrs(labels)
            for _pos, labels, path in cog_entries(output_path, leading_coords(plan))}


# --------------------------------------------------------------------------------------------------------------------
# file helpers (local paths and fsspec URLs)


def stac_paths(output_path: str) -> tuple[str, str]:
    """``(collection, items file)`` of an output: ``<output>.stac-collection.json``, ``<output>.stac-items.json``
    (``out/ndvi.tif`` -> ``out/ndvi.tif.stac-items.json``; per-period files keep the name the spec gives)."""
    base = str(output_path).rstrip("/")
    return base + ".stac-collection.json", base + ".stac-items.json"


def item_path(file_path: str) -> str:
    """The Item of one output file: ``out/ndvi_2024-06.tif`` -> ``out/ndvi_2024-06.tif.stac-item.json``."""
    return str(file_path).rstrip("/") + ".stac-item.json"


def _absolute(path: str) -> str:
    return str(path) if is_remote(path) else os.path.abspath(str(path))


def write_text(path: str, text: str) -> None:
    """Atomically: a temporary file beside ``path`` (mode 0666 minus the umask, like any new file), then rename."""
    if is_remote(path):
        import fsspec.core

        fs, target = fsspec.core.url_to_fs(path)
        fs.pipe_file(target, text.encode())
        return
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise


def _open_binary(path: str):
    if is_remote(path):
        import fsspec

        return fsspec.open(path, "rb").open()
    return open(path, "rb")


def file_checksum(path: str) -> str:
    """``file:checksum``: the SHA2-256 multihash (``1220`` + hex digest) of a file."""
    digest = hashlib.sha256()
    with _open_binary(path) as handle:
        for chunk in iter(lambda: handle.read(4 * 2**20), b""):
            digest.update(chunk)
    return "1220" + digest.hexdigest()


# --------------------------------------------------------------------------------------------------------------------
# statistics of what was written


@dataclasses.dataclass
class BlockStats:
    """Streaming minimum, maximum, mean, standard deviation and valid percentage of stored values."""

    count: int = 0
    total: int = 0
    sum: float = 0.0
    sumsq: float = 0.0
    min: float = float("inf")
    max: float = float("-inf")

    @classmethod
    def of(cls, values: Any, nodata: float | None, *, native: bool | None = None) -> BlockStats:
        """The statistics of one block: NaN and ``nodata`` left out, sums in float64 left to right (the compiled
        ``block_stats`` in one pass where installed, ``native``: see :func:`rasterflow.compiled.chosen`; else
        NumPy, the same values)."""
        import numpy as np

        from rasterflow import compiled

        values = np.asarray(values)
        block = cls(total=values.size)
        if nodata is not None and np.isnan(nodata):
            nodata = None
        kernels = compiled.chosen(native)
        if kernels is not None and values.dtype.char in "fdbBhHiI":
            count, total, squares, low, high = kernels.block_stats(np.ascontiguousarray(values), nodata)
            if count:
                block.count, block.sum, block.sumsq, block.min, block.max = count, total, squares, low, high
            return block
        valid = values
        if values.dtype.kind == "f":
            valid = valid[~np.isnan(valid)]
        if nodata is not None:
            valid = valid[valid != nodata]
        if valid.size == 0:
            return block
        as_float = valid.astype(np.float64).ravel()
        block.count = valid.size
        block.sum = float(np.cumsum(as_float)[-1])  # left to right, as the compiled pass adds
        block.sumsq = float(np.cumsum(as_float * as_float)[-1])
        block.min, block.max = float(as_float.min()), float(as_float.max())
        return block

    def add(self, block: BlockStats) -> None:
        """Add a block's statistics (blocks added in one order give the same sums whoever computed them)."""
        self.total += block.total
        if not block.count:
            return
        self.count += block.count
        self.sum += block.sum
        self.sumsq += block.sumsq
        self.min, self.max = min(self.min, block.min), max(self.max, block.max)

    def as_stac(self) -> dict[str, float]:
        percent = 100.0 * self.count / self.total if self.total else 0.0
        if not self.count:
            return {"valid_percent": 0.0}
        mean = self.sum / self.count
        variance = max(0.0, self.sumsq / self.count - mean * mean)
        return {"minimum": self.min, "maximum": self.max, "mean": mean, "stddev": variance ** 0.5,
                "valid_percent": percent}


def _threads() -> int:
    """Threads for the Zarr statistics pass: it runs in the client after the workers are done (decoding and NumPy
    release the GIL); 121 Zarr chunks of 4 MB took 2.1 s on one thread, 1.45 s on two."""
    return max(1, min(4, os.cpu_count() or 1))


STATISTICS_CACHEMAX = 16 * 2**20
"""GDAL's block cache while the statistics pass reads a COG: each block is read once, in order, so a cache only
fills up. With GDAL's default (5% of RAM) the pass over the season's 10980² output held the whole raster: 585 MB
and 3.5 s in a fresh process, 105 MB and 1.6 s with this (2026-12-05); in the run's client it came after the
memory samples and took the process from ~0.7 GB to 1.1 GB."""


def _cog_statistics(path: str) -> list[dict[str, float]]:
    # One handle, one thread: reading the blocks on several threads (a handle each) made the client of a 10980²
    # COG run peak at 1.21 GB instead of 0.81 GB (GDAL's block caches), for 0.2 s less
    import rasterio

    options: dict[str, str] = {}
    if is_remote(path):  # GDAL's names of the endpoint boto users set (AWS_ENDPOINT_URL -> AWS_S3_ENDPOINT...)
        from rasterflow.gdalenv import aws_endpoint_options

        options = aws_endpoint_options()
    with rasterio.Env(GDAL_PAM_ENABLED="NO", GDAL_CACHEMAX=STATISTICS_CACHEMAX, **options), \
            rasterio.open(path) as src:  # no .aux.xml beside the output
        stats = [BlockStats() for _ in range(src.count)]
        for _ij, window in src.block_windows(1):
            block = src.read(window=window)
            for band, acc in enumerate(stats):
                acc.add(BlockStats.of(block[band], src.nodata))
    return [s.as_stac() for s in stats]


def _tile_statistics(known: Mapping[tuple[int, ...], BlockStats], bands: int) -> list[dict[str, float]]:
    """A COG's statistics from its full-resolution tiles' (``(band, tile row, tile column)`` -> BlockStats, what
    the workers computed), added per band in row-major tile order: the order :func:`_cog_statistics` reads the
    file in, so the sums are the same."""
    out = []
    for band in range(bands):
        acc = BlockStats()
        for key in sorted(k for k in known if k[0] == band):
            acc.add(known[key])
        out.append(acc.as_stac())
    return out


ChunkStatistics = Mapping[tuple[int, ...], "BlockStats"]
"""The statistics of Zarr chunks, by chunk index (what a write task returns: :func:`chunk_statistics`)."""


def chunk_statistics(values: Any, start: Sequence[int], chunks: Sequence[int],
                     nodata: float | None) -> dict[tuple[int, ...], BlockStats]:
    """The statistics of each Zarr chunk of ``values``, a region of an array starting at ``start`` on chunk
    boundaries, keyed by chunk index: what :func:`_zarr_statistics` computes reading those chunks back, computed by
    the task that wrote them instead (issue 13: the client read the whole output back, O(output) in one process)."""
    import itertools

    ranges = [range(0, n, c) for n, c in zip(values.shape, chunks)]
    out = {}
    for offsets in itertools.product(*ranges):
        index = tuple((s + o) // c for s, o, c in zip(start, offsets, chunks))
        region = tuple(slice(o, o + c) for o, c in zip(offsets, chunks))
        out[index] = BlockStats.of(values[region], nodata)
    return out


def _zarr_statistics(path: str, names: Sequence[str],
                     known: Mapping[str, ChunkStatistics] | None = None) -> list[dict[str, float]]:
    """Per array: the statistics of every chunk, from ``known`` (what this run's write tasks returned) or read back
    (chunks an earlier, interrupted run wrote), added in chunk order whoever computed them."""
    import concurrent.futures
    import itertools

    import numpy as np
    import zarr

    group = zarr.open_group(str(path), mode="r")
    out = []
    with concurrent.futures.ThreadPoolExecutor(_threads()) as pool:
        for name in names:
            array = group[name]
            assert isinstance(array, zarr.Array), f"{name} in {path} is not an array"
            fill = array.fill_value
            nodata = None if fill is None else float(fill)
            have = (known or {}).get(name, {})
            ranges = [range(0, n, c) for n, c in zip(array.shape, array.chunks)]
            indices = [tuple(s // c for s, c in zip(starts, array.chunks)) for starts in itertools.product(*ranges)]

            def stats(index: tuple[int, ...]) -> BlockStats:
                hit = have.get(index)
                if hit is not None:
                    return hit
                region = tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(index, array.chunks, array.shape))
                return BlockStats.of(np.asarray(array[region]), nodata)

            acc = BlockStats()
            for block in pool.map(stats, indices):
                acc.add(block)  # in chunk order: the sums do not depend on timing or on who computed a chunk
            out.append(acc.as_stac())
    return out


# --------------------------------------------------------------------------------------------------------------------
# the documents


@dataclasses.dataclass(frozen=True)
class StacOutputs:
    """The STAC documents a run wrote."""

    items: tuple[str, ...]
    collection: str
    items_file: str


def _footprint(crs: str, bounds: Sequence[float]) -> tuple[dict, list[float]]:
    """WGS84 polygon (densified edges) and bbox of the output grid."""
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


def _nodata_value(value: float | None) -> Any:
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


def write_stac(
    result: Any,
    plan: Any,
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
    items: list[dict] = []
    item_files: list[str] = []
    for labels, path in entries:
        item = _output_item(context, fmt, path, labels, whole, result.checksums, result.statistics)
        item_file = item_path(path)
        write_text(item_file, json.dumps(item, indent=2, allow_nan=False) + "\n")
        items.append(item)
        item_files.append(item_file)
    bbox = items[0]["bbox"] if items else _footprint(grid.crs, grid.bounds)[1]
    return _write_collection(context, items, item_files, bbox)


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
    """What every Item of one run shares (the arguments of :func:`write_stac`)."""

    plan: Any
    description: RunDescription
    output_path: str
    encoding: Encoding
    software: Mapping[str, str | None]
    catalog: str | None = None


def _output_item(context: StacContext, fmt: str, path: str, labels: Mapping[str, Any], where: TileGeometry,
                 checksums: Mapping[str, str],
                 statistics: Mapping[str, ChunkStatistics] | None = None) -> dict[str, Any]:
    """The STAC Item of one output file (statistics: a Zarr store's from ``statistics``, what its write tasks
    returned, and read back for chunks they did not write; a COG's read back from the file)."""
    import numpy as np

    from rasterflow.write.common import path_size

    plan, description, encoding = context.plan, context.description, context.encoding
    grid = plan.grid
    names = list(plan.program.band_names) if plan.program is not None else []
    geometry, bbox = _footprint(grid.crs, where.bounds)
    collection_path, _items_path = stac_paths(context.output_path)
    now = _rfc3339(dt.datetime.now(dt.timezone.utc))
    if fmt == "cog":
        known = (statistics or {}).get(path)
        stats = _tile_statistics(known, len(names)) if known else _cog_statistics(path)
    else:
        stats = _zarr_statistics(path, names, statistics)
    bands = []
    for name, stat in zip(names, stats):
        band: dict[str, Any] = {"name": name, "nodata": _nodata_value(encoding.nodata),
                                "data_type": np.dtype(encoding.dtype).name, "statistics": stat}
        if encoding.is_scaled:
            band["scale"] = encoding.scale
            band["offset"] = encoding.offset
        bands.append(band)
    asset: dict[str, Any] = {
        "href": _absolute(path), "type": COG_MEDIA_TYPE if fmt == "cog" else ZARR_MEDIA_TYPE,
        "title": ", ".join(names), "roles": ["data"], "raster:bands": bands, "file:size": path_size(path),
    }
    if fmt == "cog":  # an uploaded COG's checksum was taken (and checked against the object) by the writer
        asset["file:checksum"] = checksums.get(path) or file_checksum(path)
    info = description.range_of(labels)
    properties: dict[str, Any] = {
        # the period's start: readers that need one instant (rasterflow's own planner among them) get one
        "datetime": _rfc3339(info.start),
        "start_datetime": _rfc3339(info.start),
        "end_datetime": _rfc3339(info.end),
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
            {"rel": "self", "href": _absolute(item_path(path)), "type": "application/geo+json"},
            {"rel": "collection", "href": _absolute(collection_path), "type": "application/json"},
            {"rel": "parent", "href": _absolute(collection_path), "type": "application/json"},
            {"rel": "root", "href": _absolute(collection_path), "type": "application/json"},
            *(_input_link(item, context.catalog) for item in plan.items),
        ],
        "assets": {"data": asset},
    }


def _write_collection(context: StacContext, items: Sequence[Mapping[str, Any]], item_files: Sequence[str],
                      bbox: Sequence[float]) -> StacOutputs:
    """The run's Collection, then the items file (last: its presence means the run is complete)."""
    description = context.description
    collection_path, items_path = stac_paths(context.output_path)
    starts = [item["properties"]["start_datetime"] for item in items]
    ends = [item["properties"]["end_datetime"] for item in items]
    window = [_rfc3339(description.window.start), _rfc3339(description.window.end)]
    collection = {
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
            {"rel": "self", "href": _absolute(collection_path), "type": "application/json"},
            {"rel": "root", "href": _absolute(collection_path), "type": "application/json"},
            *({"rel": "item", "href": _absolute(f), "type": "application/geo+json"} for f in item_files),
        ],
    }
    write_text(collection_path, json.dumps(collection, indent=2, allow_nan=False) + "\n")
    # last: its presence means every output and every document of the run is complete
    write_text(items_path, json.dumps({"type": "FeatureCollection", "features": list(items)}, indent=2,
                                      allow_nan=False) + "\n")
    return StacOutputs(items=tuple(item_files), collection=collection_path, items_file=items_path)


def write_tile_items(context: StacContext, fmt: str, entries: Sequence[tuple[Mapping[str, Any], str]],
                     where: TileGeometry, checksums: Mapping[str, str] | None = None,
                     statistics: Mapping[str, ChunkStatistics] | None = None) -> list[str]:
    """Write the Items of one tile's files (``entries``: ``(labels, path)`` per period / quantile), right after the
    tile is written; returns the Item files. The Collection comes last (:func:`write_tile_collection`).
    ``statistics``: a Zarr tile's per-chunk statistics from its write tasks (:attr:`WriteResult.statistics`)."""
    files = []
    for labels, path in entries:
        item = _output_item(context, fmt, path, labels, where, checksums or {}, statistics)
        files.append(item_path(path))
        write_text(files[-1], json.dumps(item, indent=2, allow_nan=False) + "\n")
    return files


def write_tile_collection(context: StacContext, item_files: Sequence[str]) -> StacOutputs:
    """The Collection of a tiled output (one ``item`` link per tile x period) and its items file, written once every
    tile is: Items of tiles kept from an interrupted run are read back from their files."""
    items = [_read_json(f) for f in item_files]
    grid = context.plan.grid
    _geometry, bbox = _footprint(grid.crs, grid.bounds)
    return _write_collection(context, items, item_files, bbox)


def _read_json(path: str) -> dict[str, Any]:
    with _open_binary(path) as handle:
        data = json.loads(handle.read().decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a STAC Item (a JSON object)")
    return data


def _lineage(description: RunDescription, labels: Mapping[str, Any], info: PeriodInfo) -> str:
    method = description.method or "time series"
    if labels.get("quantile") is not None:
        method = f"quantile {float(labels['quantile']):g}"
    elif description.quantiles:
        method = "quantile " + ", ".join(f"{q:g}" for q in description.quantiles)
    bands = "; ".join(f"{name} = {expr}" for name, expr in description.expressions)
    text = f"{method} of {info.n_items} items from {_rfc3339(info.start)} to {_rfc3339(info.end)}: {bands}"
    if description.mask:
        text += f" (pixels where {description.mask} dropped)"
    return text

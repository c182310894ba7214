"""Per item and asset, what to read and how to interpret its values: resolved once, in planning, from the items'
STAC metadata and the spec's ``source.overrides``.

Pure: no network, no Dask, no pixels (pyproj only, to place each file's footprint on the output grid). The reader,
the kernels and the budget all take the :class:`SourceTable` made here, so what the plan says was applied is what
runs.

Metadata, per item (Sentinel-2 L2A changed its offset with processing baseline 04.00, so never per collection):

* ``raster:bands[0]`` (raster extension v1): ``scale``, ``offset``, ``nodata``, ``data_type``;
* STAC 1.1 / raster v2 fields on the asset itself, or on its single ``bands[0]``: ``raster:scale``,
  ``raster:offset``, ``nodata``, ``data_type``;
* ``earthsearch:boa_offset_applied: true`` (Earth Search v1): the files are already offset-corrected, so a declared
  offset is *not* applied again;
* ``source.overrides.<asset>``: replaces any of these, or ``ignore_catalog: true`` drops them all.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import gc
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from pyproj import Transformer
    from rasterio.io import DatasetReader

    from rasterflow.planning import GridPlan
    from rasterflow.spec.models import AssetOverride

__all__ = [
    "AssetRead", "AssetSource", "FileHeader", "compression_name", "SourceTable", "MissingAsset", "missing_assets", "resolve_sources",
    "declared_metadata", "declares_data_type", "footprint_on_grid", "grid_offset", "gc_paused",
]

_INTEGER_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64")
_FLOAT_DTYPES = ("float16", "float32", "float64")


@dataclass(frozen=True)
class AssetRead:
    """One asset of one item, resolved: the file to open and how to interpret its values."""

    item_id: str
    name: str
    """The asset's name in the spec (used in expressions)."""
    key: str
    """The asset key in the item."""
    href: str
    data_type: str | None
    """The declared data type of the file's band (None: not declared; read and converted)."""
    nodata: float | None
    """The raw value that means "no data" (None: none)."""
    scale: float
    offset: float
    crs: str | None
    """``EPSG:nnnn`` from ``proj:code`` / ``proj:epsg`` (asset first, then item), None when not declared."""
    transform: tuple[float, float, float, float, float, float] | None
    """``proj:transform`` (a, b, c, d, e, f), None when not declared."""
    shape: tuple[int, int] | None
    """``proj:shape`` (rows, cols), None when not declared."""
    band_count: int | None
    """Bands the metadata declares for the file (length of ``raster:bands`` / ``bands``), None when not said."""
    footprint: tuple[int, int, int, int] | None
    """``(row_start, row_stop, col_start, col_stop)`` of the file on the output grid (clipped; may be empty), None
    when the metadata does not say where the file lies (then every task opens it)."""
    direct: bool
    """True when the declared grid is the output grid's (same CRS and resolution, whole-pixel offset): read straight
    into the block; else through a WarpedVRT. The reader checks the file agrees."""

    def describe(self) -> str:
        """``item 'X' asset 'red' (B04) at href`` for messages."""
        key = f" ({self.key})" if self.key != self.name else ""
        return f"item {self.item_id!r} asset {self.name!r}{key} at {self.href}"

    def intersects(self, rows: tuple[int, int], cols: tuple[int, int]) -> bool:
        """Whether the file may hold pixels of the output window ``rows`` x ``cols``."""
        if self.footprint is None:
            return True
        r0, r1, c0, c1 = self.footprint
        return r0 < rows[1] and rows[0] < r1 and c0 < cols[1] and cols[0] < c1


@dataclass(frozen=True)
class AssetSource:
    """One asset over all items: the dtype its planes are loaded in and what an uncovered pixel holds."""

    name: str
    key: str
    load_dtype: str
    """The source integers (or floats) when every item declares them, else the working dtype."""
    fill: float | None
    """What pixels no file covers hold: the nodata value all items share, NaN for floats; None = no value is free
    to mean "no data", so the task keeps a boolean coverage plane for this asset."""
    kind: str
    """``int`` or ``float``: what the mask sees of this asset."""
    applied: tuple[str, ...]
    """What was applied, for ``plan``: ``"uint16, nodata 0, scale 0.0001, offset -0.1 (raster:bands): 12 items"``."""
    resampling: str = "nearest"
    """How its files are resampled onto the grid where they are warped (:func:`asset_resampling`)."""


@dataclass(frozen=True)
class FileHeader:
    """What one file's header says (read at plan time for assets whose items declare no raster metadata)."""

    href: str
    data_type: str
    nodata: float | None
    band_count: int
    tile_shape: tuple[int, int] | None = None
    compression: str | None = None
    """The file's codec as GDAL names it (``ZSTD``, ``DEFLATE``, ``LZW``...; ``NONE`` uncompressed); None = unknown."""


def compression_name(dataset: DatasetReader) -> str:
    """An open rasterio dataset's codec: ``dataset.compression``'s GDAL name, ``NONE`` when uncompressed."""
    codec = getattr(dataset, "compression", None)
    return str(getattr(codec, "value", codec)).upper() if codec is not None else "NONE"


@dataclass(frozen=True)
class SourceTable:
    """Every asset read of a job: ``reads[item][asset]`` (None where the item lacks the asset)."""

    assets: tuple[AssetSource, ...]
    reads: tuple[tuple[AssetRead, ...], ...]
    warnings: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.assets)

    def kinds(self) -> dict[str, str]:
        return {a.name: a.kind for a in self.assets}


@dataclass(frozen=True)
class MissingAsset:
    """An asset key of the spec that some or all items lack."""

    name: str
    key: str
    n_missing: int
    n_items: int
    example_ids: tuple[str, ...]
    keys_present: tuple[str, ...]
    suggestion: str | None

    def message(self) -> str:
        """What is wrong and what to change."""
        which = "none of the" if self.n_missing == self.n_items else f"{self.n_missing} of the"
        text = (f"asset key {self.key!r} (for {self.name!r}) is in {which} {self.n_items} items found "
                f"(e.g. {', '.join(self.example_ids)})")
        if self.n_missing == self.n_items:
            text += f"; did you mean {self.suggestion!r}?" if self.suggestion else ""
            text += f" The items have: {', '.join(self.keys_present)}"
        else:
            text += ("; those items would be holes in the result: narrow the search (query/filter) to items that "
                     "have it, or use another asset")
        return text


def _band_name_matches(asset: Mapping[str, Any], wanted: str) -> bool:
    wanted = wanted.lower()
    for field in ("eo:bands", "bands"):
        for band in asset.get(field) or []:
            if isinstance(band, Mapping):
                names = (band.get("name"), band.get("common_name"), band.get("eo:common_name"))
                if any(isinstance(n, str) and n.lower() == wanted for n in names):
                    return True
    return False


def missing_assets(items: Sequence[Mapping[str, Any]], assets: Mapping[str, str]) -> list[MissingAsset]:
    """Asset keys of ``assets`` (name -> key) that items lack, with the keys they do have and a did-you-mean
    (an asset whose band name is the key asked for, e.g. ``B04`` -> ``red`` on Earth Search v1, else the closest
    spelling)."""
    problems = []
    present = Counter(key for item in items for key in (item.get("assets") or {}))
    for name, key in assets.items():
        lacking = [str(item.get("id")) for item in items if key not in (item.get("assets") or {})]
        if not lacking:
            continue
        suggestion = None
        for item in items:
            for candidate, asset in (item.get("assets") or {}).items():
                if isinstance(asset, Mapping) and _band_name_matches(asset, key):
                    suggestion = candidate
                    break
            if suggestion:
                break
        if suggestion is None:
            close = difflib.get_close_matches(key, list(present), n=1, cutoff=0.6)
            suggestion = close[0] if close else None
        problems.append(MissingAsset(name, key, len(lacking), len(items), tuple(lacking[:3]),
                                     tuple(sorted(present)), suggestion))
    return problems


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("nan", "inf", "-inf"):
        return float(value)
    return None


def declared_metadata(item: Mapping[str, Any], key: str) -> dict[str, Any]:
    """What an item's metadata declares for one asset: data_type, nodata, scale, offset, band_count, each with
    the field it came from (``source``), before overrides and the Earth Search flag."""
    asset = (item.get("assets") or {}).get(key) or {}
    found: dict[str, Any] = {}
    sources: list[str] = []
    raster_bands = asset.get("raster:bands")
    bands = asset.get("bands")
    layers: list[tuple[str, Mapping[str, Any], dict[str, str]]] = []
    if isinstance(raster_bands, list) and raster_bands and isinstance(raster_bands[0], Mapping):
        layers.append(("raster:bands", raster_bands[0], {"scale": "scale", "offset": "offset"}))
    v2 = {"scale": "raster:scale", "offset": "raster:offset"}
    layers.append(("asset fields", asset, v2))
    if isinstance(bands, list) and len(bands) == 1 and isinstance(bands[0], Mapping):
        layers.append(("bands[0]", bands[0], v2))
    for label, fields, names in layers:
        used = False
        for wanted, field in (("scale", names["scale"]), ("offset", names["offset"]), ("nodata", "nodata"),
                              ("data_type", "data_type")):
            if wanted in found or field not in fields:
                continue
            value = fields[field]
            if wanted == "data_type":
                if isinstance(value, str):
                    found[wanted], used = value, True
            elif wanted == "nodata" and value is None:
                continue
            else:
                number = _number(value)
                if number is not None:
                    found[wanted], used = number, True
        if used:
            sources.append(label)
    count = None
    if isinstance(raster_bands, list) and raster_bands:
        count = len(raster_bands)
    elif isinstance(bands, list) and bands:
        count = len(bands)
    found["band_count"] = count
    found["source"] = " + ".join(sources)
    return found


def declares_data_type(item: Mapping[str, Any], key: str) -> bool:
    """Whether :func:`declared_metadata` finds a ``data_type`` for the asset (the same three places), without
    collecting the rest: the header probe asks this of every item and asset."""
    asset = (item.get("assets") or {}).get(key) or {}
    raster_bands = asset.get("raster:bands")
    if isinstance(raster_bands, list) and raster_bands and isinstance(raster_bands[0], Mapping) \
            and isinstance(raster_bands[0].get("data_type"), str):
        return True
    if isinstance(asset.get("data_type"), str):
        return True
    bands = asset.get("bands")
    return isinstance(bands, list) and len(bands) == 1 and isinstance(bands[0], Mapping) \
        and isinstance(bands[0].get("data_type"), str)


def _crs_of(item: Mapping[str, Any], asset: Mapping[str, Any]) -> str | None:
    for fields in (asset, item.get("properties") or {}):
        code = fields.get("proj:code")
        if isinstance(code, str) and code:
            return code.upper()
        epsg = fields.get("proj:epsg")
        if isinstance(epsg, int) and not isinstance(epsg, bool):
            return f"EPSG:{epsg}"
    return None


def _proj_field(item: Mapping[str, Any], asset: Mapping[str, Any], name: str) -> Any:
    value = asset.get(name)
    return value if value is not None else (item.get("properties") or {}).get(name)


def footprint_on_grid(crs: str, transform: Sequence[float], shape: Sequence[int],
                      grid: GridPlan) -> tuple[int, int, int, int]:
    """The file's bounding window on the output grid, clipped to it: ``(row0, row1, col0, col1)``."""
    a, b, c, d, e, f = (float(v) for v in transform[:6])
    rows, cols = int(shape[0]), int(shape[1])
    xs = [c + a * col + b * row for row in (0, rows) for col in (0, cols)]
    ys = [f + d * col + e * row for row in (0, rows) for col in (0, cols)]
    bounds = (min(xs), min(ys), max(xs), max(ys))
    if crs.upper() != grid.crs.upper():
        bounds = _transformer(crs.upper(), grid.crs.upper()).transform_bounds(*bounds, densify_pts=21)
    minx, _, _, maxy = grid.bounds
    res = grid.resolution
    height, width = grid.shape
    col0 = max(0, math.floor((bounds[0] - minx) / res) - 1)  # a pixel of margin for resampling kernels
    col1 = min(width, math.ceil((bounds[2] - minx) / res) + 1)
    row0 = max(0, math.floor((maxy - bounds[3]) / res) - 1)
    row1 = min(height, math.ceil((maxy - bounds[1]) / res) + 1)
    return (row0, max(row0, row1), col0, max(col0, col1))


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while building many acyclic objects (parsed items, the
    per-item-per-asset reads). Each allocation burst otherwise triggers full collections that walk every item
    already held: at 73,000 items (219,000 files) they cost 2.9 s of an 8 s parse and ~3 s of planning.
    Reference counting still frees everything; the collector's previous state is restored."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@functools.lru_cache(maxsize=256)
def _transformer(src: str, dst: str) -> Transformer:
    """One pyproj ``Transformer`` per CRS pair: creating one costs ~35 ms (PROJ database lookups), which made a
    plan over 219,000 files (1,000 tiles × 73 dates × 3 assets) take two hours; a continent spans a few dozen
    UTM zones. Planning is single-threaded (a Transformer must not be shared between threads)."""
    from pyproj import Transformer

    return Transformer.from_crs(src, dst, always_xy=True)


def grid_offset(crs: str | None, transform: Sequence[float] | None, grid: GridPlan) -> tuple[int, int] | None:
    """``(row, col)`` of a file's first pixel on the output grid when its grid is the output grid (same CRS and
    resolution, north-up, whole-pixel offset); None when it needs warping."""
    if crs is None or transform is None or crs.upper() != grid.crs.upper():
        return None
    a, b, c, d, e, f = (float(v) for v in transform[:6])
    res = grid.resolution
    if b != 0 or d != 0 or not math.isclose(a, res, rel_tol=1e-9) or not math.isclose(e, -res, rel_tol=1e-9):
        return None
    minx, _, _, maxy = grid.bounds
    col, row = (c - minx) / res, (maxy - f) / res
    if abs(col - round(col)) > 1e-6 or abs(row - round(row)) > 1e-6:
        return None
    return int(round(row)), int(round(col))


def _format_value(value: float | None) -> str:
    if value is None:
        return "none"
    return f"{value:g}"


def resolve_sources(items: Sequence[Mapping[str, Any]], assets: Mapping[str, str], grid: GridPlan, *,
                    overrides: Mapping[str, AssetOverride] | None = None, working_dtype: str = "float32",
                    headers: Mapping[str, FileHeader] | None = None) -> SourceTable:
    """Resolve every item's assets: href, declared grid, data type, nodata, scale and offset, and per asset the
    dtype its planes load in.

    Parameters
    ----------
    items : sequence of item dicts
        The searched items, in time order; each must have every asset (see :func:`missing_assets`).
    assets : mapping
        Name in the spec -> asset key in the items, for the assets the job loads.
    grid : GridPlan
        The output grid (for footprints and whether a file needs warping).
    overrides : mapping of name -> AssetOverride, optional
        ``source.overrides`` of the spec.
    working_dtype : str
        ``grid.dtype``: what assets of undeclared data type load in (when no header says otherwise).
    headers : mapping of asset key -> FileHeader, optional
        The header of one file per asset key (see :func:`rasterflow.catalog.source_header`). For an item that
        declares no data type for the asset (Planetary Computer's Sentinel-2 items carry no ``raster:bands``), the
        header's data type and, unless declared, its nodata stand in for the catalog's; each file is still checked
        against them when it is opened.
    """
    import numpy as np

    overrides = overrides or {}
    reads: list[list[AssetRead]] = [[] for _ in items]
    sources: list[AssetSource] = []
    warnings: list[str] = []
    placements: dict[tuple[str, tuple[float, ...], tuple[int, int]], tuple[tuple[int, int, int, int], bool]] = {}
    for name, key in assets.items():
        override = overrides.get(name)
        applied: Counter[str] = Counter()
        dtypes: set[str | None] = set()
        nodatas: set[float | None] = set()
        pc_offsetless: list[str] = []
        for t, item in enumerate(items):
            asset = (item.get("assets") or {}).get(key) or {}
            declared = {} if (override is not None and override.ignore_catalog) else declared_metadata(item, key)
            origin = declared.get("source") or "no raster metadata"
            scale = declared.get("scale", 1.0)
            offset = declared.get("offset", 0.0)
            nodata = declared.get("nodata")
            data_type = declared.get("data_type")
            notes = [origin]
            properties = item.get("properties") or {}
            if offset != 0 and properties.get("earthsearch:boa_offset_applied") is True:
                notes.append(f"offset {offset:g} not applied: earthsearch:boa_offset_applied")
                offset = 0.0
            header = (headers or {}).get(key)
            if header is not None and data_type is None:
                data_type = header.data_type
                if nodata is None:
                    nodata = header.nodata
                notes.append("type and nodata from the file header")
            if override is not None:
                if override.scale is not None:
                    scale = float(override.scale)
                if override.offset is not None:
                    offset = float(override.offset)
                if override.nodata is not None:
                    nodata = None if override.nodata == "none" else float(override.nodata)
                if override.data_type is not None:
                    data_type = override.data_type
                if any(v is not None for v in (override.scale, override.offset, override.nodata, override.data_type)) \
                        or override.ignore_catalog:
                    notes.append("source.overrides")
            if (override is None or override.offset is None) and offset == 0 and data_type in ("uint16", None) \
                    and _baseline_needs_offset(properties) and _is_spectral(asset) \
                    and properties.get("earthsearch:boa_offset_applied") is not True:  # already corrected
                pc_offsetless.append(str(item.get("id")))
            if data_type is not None and data_type not in _INTEGER_DTYPES + _FLOAT_DTYPES:
                notes.append(f"data_type {data_type!r} not supported, read as {working_dtype}")
                data_type = None
            crs = _crs_of(item, asset)
            transform = _proj_field(item, asset, "proj:transform")
            shape = _proj_field(item, asset, "proj:shape")
            transform = tuple(float(v) for v in transform[:6]) if isinstance(transform, list) and len(transform) >= 6 \
                else None
            shape = (int(shape[0]), int(shape[1])) if isinstance(shape, list) and len(shape) == 2 else None
            footprint = direct = None
            if crs and transform and shape:
                # one tile's files share their grid over every date and asset: place each grid once
                placed = placements.get((crs, transform, shape))
                if placed is None:
                    placed = placements[(crs, transform, shape)] = (
                        footprint_on_grid(crs, transform, shape, grid), grid_offset(crs, transform, grid) is not None)
                footprint, direct = placed
            reads[t].append(AssetRead(
                item_id=str(item.get("id")), name=name, key=key, href=str(asset.get("href", "")),
                data_type=data_type, nodata=nodata, scale=float(scale), offset=float(offset), crs=crs,
                transform=transform, shape=shape, band_count=declared.get("band_count"), footprint=footprint,
                direct=direct if direct is not None else grid_offset(crs, transform, grid) is not None,
            ))
            dtypes.add(data_type)
            nodatas.add(None if nodata is None or math.isnan(nodata) else nodata)
            applied[f"{data_type or 'undeclared type'}, nodata {_format_value(nodata)}, scale {scale:g}, "
                    f"offset {offset:g} ({'; '.join(notes)})"] += 1
        if None in dtypes or not dtypes:
            load_dtype = working_dtype
        else:
            load_dtype = np.result_type(*(np.dtype(d) for d in dtypes if d)).name
        kind = "float" if np.dtype(load_dtype).kind == "f" else "int"
        if kind == "float":
            fill: float | None = math.nan
        elif len(nodatas) == 1 and None not in nodatas:
            (fill,) = nodatas
        else:
            fill = None
        if pc_offsetless:
            warnings.append(
                f"asset {name!r} ({key}): {len(pc_offsetless)} item(s) of Sentinel-2 processing baseline >= 04.00 "
                f"declare no offset (e.g. {pc_offsetless[0]}), but their values carry the +1000 BOA_ADD_OFFSET: add "
                f"source.overrides: {{{name}: {{offset: -0.1}}}} (with scale: 0.0001 when the catalog declares none), "
                "or select one processing baseline with query"
            )
        sources.append(AssetSource(
            name=name, key=key, load_dtype=load_dtype, fill=fill, kind=kind,
            applied=tuple(f"{text}: {count} item{'s' if count != 1 else ''}" for text, count in applied.items()),
        ))
    return SourceTable(assets=tuple(sources), reads=tuple(tuple(r) for r in reads), warnings=tuple(warnings))


def _baseline_needs_offset(properties: Mapping[str, Any]) -> bool:
    baseline = properties.get("s2:processing_baseline")
    if not isinstance(baseline, str):
        return False
    try:
        return float(baseline) >= 4.0
    except ValueError:
        return False


def _is_spectral(asset: Mapping[str, Any]) -> bool:
    """A reflectance band (it declares a wavelength); SCL, AOT and WVP do not, and carry no offset."""
    for field in ("eo:bands", "bands"):
        for band in asset.get(field) or []:
            if isinstance(band, Mapping) and (band.get("center_wavelength") is not None
                                              or band.get("eo:center_wavelength") is not None):
                return True
    return False

"""Pydantic models of the pipeline spec, version 1 (``shared/design/SPEC.md``).

The models only describe; they validate shape, ranges and cross-field rules, and never touch the network or pixels.
Every field carries a description so the generated JSON Schema documents itself in editors.
"""

from __future__ import annotations

import functools
import keyword
from datetime import date, datetime
import math
import re
from pathlib import PurePosixPath
from collections.abc import Sequence
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from rasterflow.composites import CompositeNames, geomedian_variables
from rasterflow.errors import ExpressionError
from rasterflow.spec.timeparse import parse_datetime_window
from rasterflow.units import parse_bytes

__all__ = [
    "Spec",
    "Source",
    "SourceRetry",
    "StacSource",
    "AssetOverride",
    "Grid",
    "Chunks",
    "Reduce",
    "Output",
    "OutputEncoding",
    "CogOptions",
    "Tiling",
    "Cluster",
    "MemoryThresholds",
    "Budget",
    "REDUCE_METHODS",
    "ReduceMethod",
    "CUBE_DIMS",
]

ReduceMethod = Literal["mean", "median", "min", "max", "std", "sum", "count", "quantile", "geomedian", "best"]
REDUCE_METHODS: tuple[str, ...] = get_args(ReduceMethod)
COMPOSITE_METHODS = ("geomedian", "best")
"""Methods over several bands at once: alone in ``reduce`` (not in a list), time whole."""
CUBE_DIMS = ("time", "band", "y", "x")
RESAMPLING_METHODS = (
    "nearest", "bilinear", "cubic", "cubic_spline", "lanczos", "average", "mode", "max", "min", "med", "q1", "q3",
)
COMPRESSION_CODECS = ("zstd", "deflate", "lzw", "lz4", "none")
_FORMAT_BY_SUFFIX = {".zarr": "zarr", ".tif": "cog", ".tiff": "cog"}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EPSG = re.compile(r"^EPSG:[0-9]{4,6}$")


def _function_names() -> frozenset[str]:
    from rasterflow.expr import ALLOWED_FUNCTIONS

    return frozenset(ALLOWED_FUNCTIONS)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


PositiveFloat = Annotated[StrictFloat, Field(gt=0)]
Size = Annotated[StrictStr | StrictInt, Field(description="A byte size: '4GB', '512MiB', or a number of bytes.")]


class StacSource(_Model):
    """Where the scenes come from: a STAC API or a local file of items."""

    catalog: StrictStr = Field(
        description="A STAC API root (http/https), searched with pystac-client; or a local file of items (an "
        "ItemCollection .json, .ndjson, or stac-geoparquet .parquet), relative to the spec file.",
        min_length=1,
    )
    collections: list[StrictStr] = Field(description="Collection ids to search.", min_length=1)
    bbox: list[StrictFloat] | None = Field(
        default=None, description="WGS84 lon/lat bounding box: west, south, east, north (or give intersects).",
        min_length=4, max_length=4,
    )
    intersects: dict[StrictStr, Any] | StrictStr | None = Field(
        default=None,
        description="An area of interest instead of bbox: a GeoJSON Polygon or MultiPolygon (WGS84 lon/lat; a "
        "Feature or FeatureCollection too) inline, or the path of a GeoJSON file relative to the spec. The search "
        "uses it (STAC API intersects), grid.bounds defaults to its bounds, and the output is clipped to it: pixels "
        "outside are nodata, chunks outside are not computed.",
    )
    datetime: StrictStr = Field(
        description='ISO 8601 interval ("2024-06-01/2024-08-31", open ends as ".."), a single date, or a relative '
        'window ending now ("P30D", "P1Y").'
    )
    query: dict[StrictStr, Any] | None = Field(
        default=None,
        description='STAC query extension, e.g. {"eo:cloud_cover": {"lt": 40}}; applied locally for local files.',
    )
    filter: dict[StrictStr, Any] | StrictStr | None = Field(
        default=None, description="A CQL2 filter, as cql2-json (a mapping) or cql2-text (a string)."
    )
    max_items: Annotated[StrictInt, Field(gt=0)] | None = Field(
        default=None,
        description="Upper bound on items; the static budget check uses it as the time-axis length when time is whole.",
    )

    @field_validator("intersects")
    @classmethod
    def _check_intersects(cls, value: Any) -> Any:
        if isinstance(value, dict):
            from rasterflow.aoi import parse_geometry

            return parse_geometry(value)  # a ValueError says what is wrong with it
        return value  # a file path: the loader reads it, relative to the spec

    @model_validator(mode="after")
    def _bbox_or_intersects(self) -> StacSource:
        if self.bbox is None and self.intersects is None:
            raise _LocatedError(("bbox",), "give the area to search: bbox (west, south, east, north in degrees) or "
                                           "intersects (a GeoJSON polygon, or the path of a GeoJSON file)")
        if self.bbox is not None and self.intersects is not None:
            raise _LocatedError(("intersects",), "give bbox or intersects, not both (a STAC API takes one); the "
                                                 "polygon's bounds are its bbox")
        return self

    @property
    def search_bbox(self) -> tuple[float, float, float, float]:
        """``bbox``, or the bounds of ``intersects`` (once the loader has read a file's geometry)."""
        if self.bbox is not None:
            west, south, east, north = (float(v) for v in self.bbox)
            return west, south, east, north
        if isinstance(self.intersects, dict):
            from rasterflow.aoi import geometry_bounds

            return geometry_bounds(self.intersects)
        raise ValueError("intersects names a file that was not read; load the spec with rasterflow.load_spec")

    @field_validator("bbox")
    @classmethod
    def _check_bbox(cls, bbox: list[float] | None) -> list[float] | None:
        if bbox is None:
            return None
        west, south, east, north = bbox
        problems = []
        if not (-180 <= west <= 180 and -180 <= east <= 180):
            problems.append("longitudes must lie in [-180, 180]")
        if not (-90 <= south <= 90 and -90 <= north <= 90):
            problems.append("latitudes must lie in [-90, 90]")
        if west >= east:
            problems.append(f"west ({west}) must be less than east ({east})")
        if south >= north:
            problems.append(f"south ({south}) must be less than north ({north})")
        if problems:
            raise ValueError("; ".join(problems) + " (order: west, south, east, north in WGS84 degrees)")
        return bbox

    @field_validator("datetime")
    @classmethod
    def _check_datetime(cls, value: str) -> str:
        parse_datetime_window(value)
        return value

    @field_validator("query")
    @classmethod
    def _check_query(cls, query: dict[str, Any] | None) -> dict[str, Any] | None:
        if query is None:
            return None
        known_ops = {"eq", "neq", "lt", "lte", "gt", "gte", "startsWith", "endsWith", "contains", "in"}
        for prop, condition in query.items():
            if not isinstance(condition, dict) or not condition:
                raise ValueError(f"query.{prop} must map operators to values, e.g. {{lt: 40}}")
            unknown = set(condition) - known_ops
            if unknown:
                raise ValueError(
                    f"query.{prop}: unknown operator {sorted(unknown)[0]!r}; use one of {', '.join(sorted(known_ops))}"
                )
        return query


SOURCE_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "float64")


class AssetOverride(_Model):
    """What to use for one asset instead of (or besides) what the catalog's metadata says."""

    scale: StrictFloat | StrictInt | None = Field(
        default=None, description="Multiply the raw values by this (replaces raster:bands scale / raster:scale)."
    )
    offset: StrictFloat | StrictInt | None = Field(
        default=None, description="Then add this (replaces raster:bands offset / raster:offset), e.g. -0.1 for "
        "Sentinel-2 L2A of processing baseline 04.00 or later when the catalog declares no offset."
    )
    nodata: StrictFloat | StrictInt | Literal["none"] | None = Field(
        default=None, description='The raw value that means "no data" (replaces the catalog\'s); "none" = every '
        "value is data."
    )
    data_type: Literal[SOURCE_DTYPES] | None = Field(  # type: ignore[valid-type]
        default=None, description="The files' data type, when the catalog does not declare it (the reader checks it)."
    )
    ignore_catalog: StrictBool = Field(
        default=False, description="Ignore the catalog's scale, offset, nodata and data type for this asset: "
        "raw values as stored (then the fields above, where given)."
    )
    resampling: Literal[RESAMPLING_METHODS] | None = Field(  # type: ignore[valid-type]
        default=None, description="How this asset is resampled onto the grid, instead of grid.resampling. Default: "
        "nearest for a categorical asset (one the mask reads, or that declares classification:classes), so SCL's "
        "classes are never interpolated; grid.resampling for the others."
    )


class SourceRetry(_Model):
    """How requests to the STAC API and to remote files (http/https/s3) are retried when they fail transiently."""

    attempts: Annotated[StrictInt, Field(ge=1, le=20)] = Field(
        default=5, description="Tries in all, the first included (1 = never retry)."
    )
    backoff: Annotated[StrictFloat | StrictInt, Field(ge=0, le=300)] = Field(
        default=0.5, description="Seconds to wait before the second try."
    )
    backoff_factor: Annotated[StrictFloat | StrictInt, Field(ge=1, le=10)] = Field(
        default=2, description="Each further wait is this many times the one before."
    )
    max_delay: Annotated[StrictFloat | StrictInt, Field(ge=0, le=3600)] = Field(
        default=20, description="No wait is longer than this many seconds (a server's Retry-After included)."
    )
    statuses: list[Annotated[StrictInt, Field(ge=400, le=599)]] = Field(
        default_factory=lambda: [408, 429, 500, 502, 503, 504],
        description="HTTP statuses that are transient and retried; connection resets and timeouts always are, "
        "404/403 and files that are not rasters never.",
    )
    timeout: Annotated[StrictFloat | StrictInt, Field(gt=0, le=3600)] = Field(
        default=60, description="Seconds one request may take before it counts as a (transient) timeout."
    )

    @field_validator("statuses")
    @classmethod
    def _check_statuses(cls, statuses: list[int]) -> list[int]:
        permanent = sorted(set(statuses) & {400, 401, 403, 404, 410})
        if permanent:
            raise ValueError(f"{permanent[0]} is not a transient status (retrying cannot fix it); remove it")
        return statuses


class SourceIO(_Model):
    """How remote COGs (http, https, s3) are read: concurrent, coalesced range requests per worker process."""

    concurrency: Literal["auto"] | Annotated[StrictInt, Field(ge=1, le=1024)] = Field(
        default="auto",
        description="Range requests in flight per worker process (shared by its threads, apart from the compute "
        "threads). auto = follows the round trip plan measures (one request per 0.625 ms of latency, 64 to 256: "
        "64 at 40 ms, 160 at 100 ms; 64 when none was measured).",
    )
    buffer: Literal["auto"] | Size = Field(
        default="auto",
        description="Compressed tile bytes one task fetches ahead of its decoder (the budget counts them per "
        "thread, beside the tiles the task still needs). auto = 32MB.",
    )
    reader: Literal["auto", "gdal"] = Field(
        default="auto",
        description="auto = remote tiled COGs with a lossless codec on the output grid are fetched concurrently "
        "and decoded by rasterflow (headers once per file and process, adjacent tiles in one request); every "
        "other remote read (warps, other codecs) goes through GDAL. gdal = every remote read through GDAL.",
    )

    @field_validator("buffer")
    @classmethod
    def _check_buffer(cls, value: str | int) -> str | int:
        if value != "auto" and parse_bytes(value) < 1_000_000:
            raise ValueError(f"must be at least 1MB (got {value!r}); a task fetches at least a tile at a time")
        return value

    @property
    def buffer_bytes(self) -> int:
        """``buffer`` in bytes (auto: 32 MiB)."""
        return 32 * 1024 * 1024 if self.buffer == "auto" else parse_bytes(self.buffer)


class Source(_Model):
    """The input: a STAC search and the assets to load from each item."""

    stac: StacSource = Field(description="The STAC search.")
    assets: dict[StrictStr, StrictStr] = Field(
        description="Name used in expressions -> asset key in the items.", min_length=1
    )
    group_by: Literal["item", "solar_day"] = Field(
        default="item",
        description="item = every item is its own date; solar_day = the tiles of one pass (same solar day) are "
        "masked, then mosaicked per pixel into one date (every asset of a pixel from the first tile that has "
        "it valid), so overlaps are not counted twice (needs chunks.time: -1).",
    )
    overrides: dict[StrictStr, AssetOverride] = Field(
        default_factory=dict,
        description="Per asset name (a key of assets): scale, offset, nodata or data_type to use instead of the "
        "catalog's metadata, or ignore_catalog: true.",
    )
    retry: SourceRetry = Field(
        default_factory=SourceRetry,
        description="Retries of STAC API requests and remote file reads (5xx, 429, resets, timeouts).",
    )
    on_read_error: Literal["fail", "nodata"] = Field(
        default="fail",
        description="A file that cannot be read (after its retries): fail = stop the run naming it; nodata = treat "
        "it as missing and go on (the run report lists it; see max_failed_fraction).",
    )
    max_failed_fraction: Annotated[StrictFloat | StrictInt, Field(ge=0, le=1)] = Field(
        default=0,
        description="With on_read_error: nodata, the share of the job's files that may fail; more stops the run "
        "(exit 1, before the output is committed, every failed file listed); 0 = none may fail.",
    )
    io: SourceIO = Field(
        default_factory=SourceIO,
        description="Remote reads: range requests in flight per worker process, bytes fetched ahead per task, "
        "and which reader (rasterflow's concurrent one, or GDAL).",
    )
    sign: Annotated[StrictStr, Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")] | None = Field(
        default=None,
        description="Sign asset hrefs before opening them: planetary-computer (needs the planetary-computer "
        "package), or a signer a package registers under the rasterflow.signers entry point.",
    )

    @field_validator("assets")
    @classmethod
    def _check_asset_names(cls, assets: dict[str, str]) -> dict[str, str]:
        for name in assets:
            _check_identifier(name, "asset name")
        return assets

    @model_validator(mode="after")
    def _check_overrides(self) -> Source:
        for name in self.overrides:
            if name not in self.assets:
                raise _LocatedError(("overrides", name), f"{name!r} is not an asset name; the assets are "
                                    f"{', '.join(self.assets)}")
        return self

    @model_validator(mode="after")
    def _check_failure_policy(self) -> Source:
        if self.max_failed_fraction and self.on_read_error == "fail":
            raise _LocatedError(("max_failed_fraction",), "applies only with on_read_error: nodata (with fail the "
                                "first unreadable file stops the run); set on_read_error: nodata or remove it")
        return self

    def asset_kind(self, name: str) -> str | None:
        """``int`` or ``float`` when the spec itself says which data type the asset has; None when only the
        catalog knows."""
        override = self.overrides.get(name)
        if override is None or override.data_type is None:
            return None
        return "float" if override.data_type.startswith("float") else "int"


class Grid(_Model):
    """The output grid every scene is resampled onto."""

    crs: StrictStr = Field(description='Output CRS as "EPSG:<code>", e.g. "EPSG:32633".')
    resolution: PositiveFloat = Field(description="Pixel size in CRS units.")
    bounds: list[StrictFloat] | None = Field(
        default=None,
        description="[minx, miny, maxx, maxy] in grid.crs; default: source.stac.bbox projected to grid.crs.",
        min_length=4,
        max_length=4,
    )
    dtype: Literal["float32", "float64"] = Field(
        default="float32",
        description="Working dtype of loaded bands; float32 halves memory, float64 only when asked.",
    )
    resampling: Literal[RESAMPLING_METHODS] = Field(  # type: ignore[valid-type]
        default="nearest", description="Resampling used when warping scenes onto the grid."
    )

    @field_validator("crs")
    @classmethod
    def _check_crs(cls, crs: str) -> str:
        if not _EPSG.match(crs.strip().upper()):
            raise ValueError(f'must be an EPSG code like "EPSG:32633" (got {crs!r})')
        return crs.strip().upper()

    @field_validator("bounds")
    @classmethod
    def _check_bounds(cls, bounds: list[float] | None) -> list[float] | None:
        if bounds is not None:
            minx, miny, maxx, maxy = bounds
            if not all(math.isfinite(b) for b in bounds):
                raise ValueError(f"every bound must be a finite number (got {bounds}); .nan and .inf are not bounds")
            if minx >= maxx or miny >= maxy:
                raise ValueError(f"need minx < maxx and miny < maxy (got {bounds}; order: minx, miny, maxx, maxy)")
        return bounds


ChunkSize = Annotated[
    StrictInt,
    Field(description="Chunk length along this axis; -1 = the whole axis."),
]


class Chunks(_Model):
    """Dask chunk layout; bands are always whole."""

    time: ChunkSize = Field(default=-1, description="Chunk length along time; -1 keeps time whole (needed by median).")
    y: ChunkSize = Field(default=1024, description="Chunk height in pixels; -1 = whole axis.")
    x: ChunkSize = Field(default=1024, description="Chunk width in pixels; -1 = whole axis.")
    band: Literal[-1] = Field(default=-1, description="Always -1: bands stay whole so band math needs no transfer.")

    @field_validator("time", "y", "x")
    @classmethod
    def _check_size(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError(f"must be a positive integer or -1 (got {value})")
        return value


class Reduce(_Model):
    """An optional reduction; without it the time series itself is written."""

    over: StrictStr = Field(default="time", description="The dimension reduced; rasterflow reduces over time.")
    method: ReduceMethod = Field(
        description="mean | median | min | max | std | sum | count | quantile | geomedian (the geometric median "
        "of several bands, with MADs) | best (every band from the date that maximises or minimises `by`)."
    )
    q: Annotated[StrictFloat, Field(ge=0, le=1)] | list[Annotated[StrictFloat, Field(ge=0, le=1)]] | None = Field(
        default=None, description="Quantile(s) in 0..1; required for method quantile, and only for it."
    )
    bands: list[StrictStr] | None = Field(
        default=None, description="geomedian only: the bands (assets or bands of `bands`) of the geometric "
        "median, at least two, e.g. [red, green, nir, swir16]; each is an output variable, named as the band."
    )
    mads: StrictBool = Field(
        default=True, description="geomedian only: also write emad, smad and bcmad (the median Euclidean, cosine "
        "and Bray-Curtis distances to the geomedian); count is always written."
    )
    maxiters: Annotated[StrictInt, Field(ge=1)] = Field(
        default=1000, description="geomedian only: most iterations per pixel (odc-algo's default)."
    )
    eps: Annotated[StrictFloat, Field(gt=0)] = Field(
        default=1e-4, description="geomedian only: convergence tolerance in band units (reflectance: 1e-4; raw "
        "digital numbers: about 0.1-1)."
    )
    by: StrictStr | None = Field(
        default=None, description="best only: the band or asset whose largest (order: max) or smallest (min) value "
        "picks the date of every output band at a pixel, e.g. ndvi."
    )
    order: Literal["max", "min"] = Field(default="max", description="best only: max or min of `by`.")
    period: StrictStr | list[StrictStr | list[StrictStr | date | datetime]] | None = Field(
        default=None,
        description="null = the whole window; else one result per period, every period of the window in the output "
        "(one without data is NaN, count 0): month | season | year | dekad (days 1-10, 11-20, 21-end of each "
        "month) | an ISO 8601 duration anchored at the window's start (P16D, P1W, P3M) | a list of [start, end] "
        "intervals (inclusive dates, as source.stac.datetime).",
    )

    @field_validator("period")
    @classmethod
    def _check_period(cls, period: Any) -> Any:
        from rasterflow.periods import parse_period

        if period is not None:
            parse_period(period)  # a ValueError says what to change
        return period

    @field_validator("over")
    @classmethod
    def _check_over(cls, over: str) -> str:
        if over != "time":
            existing = ", ".join(CUBE_DIMS)
            raise ValueError(f"{over!r} cannot be reduced; the cube has dimensions {existing}, and only time reduces")
        return over

    @model_validator(mode="after")
    def _check_q(self) -> Reduce:
        if self.method == "quantile" and self.q is None:
            raise _LocatedError(("method",), "method quantile needs q (a number in 0..1, or a list of them), e.g. q: 0.9")
        if self.method != "quantile" and self.q is not None:
            raise _LocatedError(("q",), f"q is only used with method: quantile (method is {self.method!r}); remove q")
        if isinstance(self.q, list) and not self.q:
            raise _LocatedError(("q",), "q is an empty list; give at least one quantile")
        if self.method == "geomedian":
            if not self.bands or len(self.bands) < 2:
                raise _LocatedError(("bands",), "a geomedian is over at least two bands, e.g. bands: [red, green, "
                                                "nir, swir16]")
            if len(set(self.bands)) < len(self.bands):
                raise _LocatedError(("bands",), "a band is listed twice; list each once")
        elif self.bands is not None:
            raise _LocatedError(("bands",), f"bands is only used with method: geomedian (method is "
                                            f"{self.method!r}); remove it")
        if self.method == "best" and not self.by:
            raise _LocatedError(("method",), "method best needs by: the band or asset whose maximum (or minimum, "
                                             "order: min) picks the date, e.g. by: ndvi")
        if self.method != "best" and self.by is not None:
            raise _LocatedError(("by",), f"by is only used with method: best (method is {self.method!r}); remove it")
        return self

    @property
    def quantiles(self) -> tuple[float, ...]:
        """The quantiles as a tuple (empty unless method is quantile)."""
        if self.q is None:
            return ()
        return tuple(self.q) if isinstance(self.q, list) else (self.q,)


OUTPUT_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "float64")
COG_RESAMPLINGS = ("nearest", "average", "bilinear", "cubic", "cubicspline", "lanczos", "mode", "rms")


class OutputEncoding(_Model):
    """How values are stored: ``stored = round((value - offset) / scale)``; readers get ``stored * scale + offset``."""

    dtype: Literal[OUTPUT_DTYPES] | None = Field(  # type: ignore[valid-type]
        default=None, description="Stored data type, e.g. int16 (half the size of float32); default: grid.dtype."
    )
    scale: StrictFloat | StrictInt = Field(
        default=1, description="Physical units per stored unit, e.g. 0.0001 stores NDVI 0.1234 as 1234."
    )
    offset: StrictFloat | StrictInt = Field(default=0, description="Added after scaling when reading.")
    nodata: StrictFloat | StrictInt | None = Field(
        default=None, description="Stored value of a missing pixel; default NaN for floats, the minimum (signed) or "
        "maximum (unsigned) of an integer dtype. A valid value that does not fit fails the run (never clipped).",
    )

    @model_validator(mode="after")
    def _check(self) -> OutputEncoding:
        if self.scale == 0:
            raise _LocatedError(("scale",), "scale must not be 0")
        if self.dtype and self.dtype[0] in "ui" and self.nodata is not None:
            bits = int(self.dtype.lstrip("uint"))
            lo, hi = (0, 2**bits - 1) if self.dtype.startswith("u") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
            if not float(self.nodata).is_integer() or not lo <= self.nodata <= hi:
                raise _LocatedError(("nodata",), f"{self.nodata} is not a valid {self.dtype} value ({lo}..{hi})")
        return self


class CogOptions(_Model):
    """Cloud-Optimized GeoTIFF layout."""

    blocksize: Annotated[StrictInt, Field(ge=16, le=4096, multiple_of=16)] = Field(
        default=512, description="Tile edge in pixels, a multiple of 16."
    )
    overview_resampling: Literal[COG_RESAMPLINGS] = Field(  # type: ignore[valid-type]
        default="average", description="Overview resampling: average suits continuous values, nearest/mode classes."
    )
    predictor: Literal["auto", "none", "standard", "floating_point"] = Field(
        default="auto", description="TIFF predictor: auto = standard for integers, floating_point for floats "
        "(none without compression)."
    )


class Tiling(_Model):
    """Split the output grid into square tiles, each written (and resumed) as an output of its own."""

    size: Annotated[StrictInt, Field(gt=0)] = Field(
        description="Tile edge in output grid pixels, a multiple of chunks.y and chunks.x (e.g. 8192 with chunks of "
        "1024); the last row and column of tiles are cut at the grid's edge."
    )


class Output(_Model):
    """Where and how the result is written."""

    path: StrictStr = Field(
        description="Output path, relative to the spec file; s3:// and other fsspec URLs allowed.", min_length=1
    )
    format: Literal["zarr", "cog"] | None = Field(
        default=None, description="zarr | cog; default from the path's extension (.zarr / .tif)."
    )
    overwrite: StrictBool | None = Field(
        default=None, description="Old spelling of if_exists: true = overwrite, false = error."
    )
    if_exists: Literal["error", "skip", "overwrite", "update"] | None = Field(
        default=None,
        description="When the output exists: error (default) = refuse; skip = keep it when up to date (same "
        "fingerprint: spec, items and their updated times, rasterflow version), recompute when not; update = as "
        "skip, but recompute only the periods whose items changed (COG output with reduce.period); overwrite = "
        "always recompute. Only a rasterflow output is ever replaced.",
    )
    compression: Literal[COMPRESSION_CODECS] = Field(  # type: ignore[valid-type]
        default="zstd", description="Compression codec of the written chunks or tiles."
    )
    zarr_format: Literal[2, 3] = Field(
        default=2, description="Zarr format: 2 opens in GDAL/QGIS and xarray; 3 in xarray only (GDAL 3.10 fails)."
    )
    zarr_shards: Annotated[StrictInt, Field(ge=1, le=64)] | None = Field(
        default=None,
        description="Zarr format 3 only: chunks per shard side (a shard object holds zarr_shards x zarr_shards "
        "chunks, each still readable alone; 1 = one object per chunk). null = shard only grids of more than 1,024 "
        "chunks, with shards of at most 8 x 8 chunks and 64 MiB. Each shard is written whole by one task, and "
        "its chunks' results are held until then: the budget counts them.",
    )
    encoding: OutputEncoding = Field(
        default_factory=OutputEncoding, description="Stored dtype, scale, offset and nodata of the bands."
    )
    cog: CogOptions = Field(default_factory=CogOptions, description="COG tile size, overviews and predictor.")
    tiling: Tiling | None = Field(
        default=None,
        description="Write the grid as tiles of size x size pixels instead of one output: out/ndvi.tif becomes "
        "out/ndvi/<row>_<col>.tif (row 0 at the top, col 0 at the left, zero-padded to 3 digits; per period "
        "out/ndvi/<row>_<col>_<period>.tif; .zarr likewise, one store per tile), each written and resumed on its "
        "own; plus a STAC Collection of them and, for COG, a GDAL VRT mosaic out/ndvi.vrt (per period "
        "out/ndvi_<period>.vrt). Tiles no input file touches are not written (the mosaic shows nodata there). "
        "null = one output.",
    )

    @model_validator(mode="after")
    def _check_tiling(self) -> Output:
        if self.tiling is not None and self.policy == "update":
            raise _LocatedError(("if_exists",), "update is not available with tiling (a rerun of the same job "
                                "already skips finished tiles); use skip or overwrite, or remove tiling")
        return self

    @model_validator(mode="after")
    def _check_output_options(self) -> Output:
        fmt = self.format or _FORMAT_BY_SUFFIX.get(PurePosixPath(self.path.rstrip("/")).suffix.lower())
        if "zarr_format" in self.model_fields_set and fmt != "zarr":
            raise _LocatedError(("zarr_format",), "zarr_format applies to Zarr outputs only; remove it")
        if self.zarr_shards is not None and fmt != "zarr":
            raise _LocatedError(("zarr_shards",), "zarr_shards applies to Zarr outputs only; remove it")
        if self.zarr_shards not in (None, 1) and self.zarr_format != 3:
            raise _LocatedError(("zarr_shards",), f"zarr_shards: {self.zarr_shards} needs zarr_format: 3 (format 2, "
                                "the one GDAL opens, has no shards); set zarr_format: 3 or remove zarr_shards")
        if "cog" in self.model_fields_set and fmt != "cog":
            raise _LocatedError(("cog",), "cog options apply to COG outputs (.tif) only; remove them")
        if self.cog.predictor == "floating_point" and self.encoding.dtype and self.encoding.dtype[0] in "ui":
            raise _LocatedError(("cog", "predictor"),
                                f"floating_point needs a float dtype (encoding.dtype is {self.encoding.dtype}); "
                                f"use standard or auto")
        return self

    @model_validator(mode="after")
    def _check_format(self) -> Output:
        suffix = PurePosixPath(self.path.rstrip("/")).suffix.lower()
        implied = _FORMAT_BY_SUFFIX.get(suffix)
        if self.format is None and implied is None:
            raise _LocatedError(("path",),
                f"cannot tell the format from {self.path!r}; end the path in .zarr or .tif, or set format: zarr | cog"
            )
        if self.format is not None and implied is not None and implied != self.format:
            raise _LocatedError(("format",),
                f"format {self.format!r} does not match the path's extension {suffix!r} (which means {implied!r}); "
                f"change one of them"
            )
        fmt = self.format or implied or "zarr"  # one of them is set: checked above
        unsupported = {"zarr": "lzw", "cog": "lz4"}[fmt]
        if self.compression == unsupported:
            other = "zstd, deflate, lz4 or none" if unsupported == "lzw" else "zstd, deflate, lzw or none"
            raise _LocatedError(
                ("compression",), f"{unsupported} is not available for {self.format or implied}; use {other}"
            )
        return self

    @model_validator(mode="after")
    def _check_policy(self) -> Output:
        if self.overwrite is not None and self.if_exists is not None and self.if_exists != self.policy_of_overwrite:
            raise _LocatedError(("if_exists",), f"contradicts overwrite: {str(self.overwrite).lower()}; keep only "
                                                f"if_exists (overwrite is its old spelling)")
        return self

    @property
    def policy_of_overwrite(self) -> str | None:
        return None if self.overwrite is None else ("overwrite" if self.overwrite else "error")

    @property
    def policy(self) -> str:
        """The effective ``if_exists``: given, or from ``overwrite``, else ``error``."""
        return self.if_exists or self.policy_of_overwrite or "error"

    @property
    def resolved_format(self) -> str:
        """The output format, given or implied by the extension."""
        return self.format or _FORMAT_BY_SUFFIX[PurePosixPath(self.path.rstrip("/")).suffix.lower()]


class MemoryThresholds(_Model):
    """Dask worker memory thresholds, as fractions of the worker's memory limit (DOMAIN.md)."""

    target: Annotated[StrictFloat, Field(gt=0, le=1)] = Field(default=0.6, description="Spill managed data to disk.")
    spill: Annotated[StrictFloat, Field(gt=0, le=1)] = Field(default=0.7, description="Spill based on process RSS.")
    pause: Annotated[StrictFloat, Field(gt=0, le=1)] = Field(default=0.8, description="Stop starting new tasks.")
    terminate: Annotated[StrictFloat, Field(gt=0, le=1)] = Field(default=0.95, description="The nanny kills the worker.")

    @model_validator(mode="after")
    def _check_order(self) -> MemoryThresholds:
        if not (self.target <= self.spill <= self.pause <= self.terminate):
            raise ValueError("thresholds must rise: target <= spill <= pause <= terminate")
        return self


class Cluster(_Model):
    """The Dask cluster: a LocalCluster sized from the machine, or an existing scheduler."""

    address: StrictStr | None = Field(
        default=None,
        description="tcp://host:8786 = use that existing Dask cluster (or env DASK_SCHEDULER_ADDRESS); null = LocalCluster.",
    )
    n_workers: Literal["auto"] | Annotated[StrictInt, Field(gt=0)] = Field(
        default="auto", description="LocalCluster worker processes; auto = sized from cores and memory."
    )
    threads_per_worker: Annotated[StrictInt, Field(gt=0)] = Field(
        default=1, description="Threads per worker: tasks a worker runs at once (each holds a working set)."
    )
    memory_limit: Literal["auto"] | Size = Field(
        default="auto", description='Per-worker memory limit: auto = (RAM - reserve) / n_workers; or e.g. "4GB".'
    )
    gdal_cachemax: Literal["auto"] | Size = Field(
        default="auto",
        description="GDAL block cache per worker process, set before GDAL starts. auto = 16MB when plan finds every "
        "source file on the output grid with its tiles on the chunks' edges (each source block is then decoded "
        "once: a cache cannot help, it only fills), else 256MB (warped reads and tiles cut by chunk edges "
        "decode blocks again; the cache keeps them). The COG writer's cache (in the client) is 256MB with auto.",
    )
    memory: MemoryThresholds = Field(
        default_factory=MemoryThresholds, description="Worker memory thresholds (fractions of the memory limit)."
    )
    processes: Literal["auto"] | StrictBool = Field(
        default="auto",
        description=(
            "true = a LocalCluster of n_workers worker processes; false = one process (the run's own) with "
            "n_workers x threads_per_worker threads and memory_limit as its limit: no worker start-up, one "
            "interpreter instead of one per worker, no dashboard; auto = one process when n_workers is auto, the job's budget "
            "fits one process and plan estimates less than 20 s of compute, else worker processes. Ignored when address (or DASK_SCHEDULER_ADDRESS) is set."
        ),
    )

    @field_validator("address")
    @classmethod
    def _check_address(cls, address: str | None) -> str | None:
        if address is not None and not re.match(r"^(tcp|tls|inproc|ucx|ws|wss)://[^\s/]+(:[0-9]+)?/?$", address):
            raise ValueError(f"expected a scheduler address like tcp://host:8786 (got {address!r})")
        return address

    @field_validator("memory_limit")
    @classmethod
    def _check_memory_limit(cls, value: str | int) -> str | int:
        if value != "auto" and parse_bytes(value) <= 0:
            raise ValueError(f"must be a positive size like '4GB' (got {value!r})")
        return value

    @field_validator("gdal_cachemax")
    @classmethod
    def _check_cachemax(cls, value: str | int) -> str | int:
        if value != "auto":
            parse_bytes(value)
        return value


class Budget(_Model):
    """The static memory budget check."""

    max_fraction: Annotated[StrictFloat, Field(gt=0, le=1)] = Field(
        default=0.5, description="Refuse to run when the estimated peak per worker exceeds this fraction of its limit."
    )
    on_exceed: Literal["error", "warn"] = Field(default="error", description="error = refuse; warn = run anyway.")


class MaskStep(_Model):
    """One morphological step of ``mask_cleanup``: exactly one of the operations, with a disk radius in pixels."""

    opening: Annotated[StrictInt, Field(gt=0)] | None = Field(
        default=None, description="Radius of an opening (erosion then dilation): removes specks of the mask "
        "smaller than the disk.")
    closing: Annotated[StrictInt, Field(gt=0)] | None = Field(
        default=None, description="Radius of a closing (dilation then erosion): fills holes smaller than the disk.")
    dilation: Annotated[StrictInt, Field(gt=0)] | None = Field(
        default=None, description="Radius of a dilation: grows the mask (cloud edges, shadows) by the disk.")
    erosion: Annotated[StrictInt, Field(gt=0)] | None = Field(
        default=None, description="Radius of an erosion: shrinks the mask by the disk.")

    @model_validator(mode="after")
    def _one(self) -> MaskStep:
        given = [k for k in ("opening", "closing", "dilation", "erosion") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("each step is one of opening, closing, dilation or erosion with a radius, e.g. "
                             "{opening: 2}" + (f" (got {', '.join(given)})" if given else ""))
        return self

    @property
    def operation(self) -> tuple[str, int]:
        """``(operation, radius)``."""
        for key in ("opening", "closing", "dilation", "erosion"):
            value = getattr(self, key)
            if value is not None:
                return key, int(value)
        raise AssertionError("validated: one operation")



def cleanup_halo(steps: Sequence[tuple[str, int]]) -> int:
    """Pixels around a window that ``mask_cleanup``'s steps look at: the sum of their reach (an opening or a closing
    is two passes of its radius, a dilation or an erosion one), so that the cleaned mask inside the window does not
    depend on where the window ends. The one rule for the tasks' reads (the plan's ``Program.halo``) and the budget.
    """
    return sum((2 if operation in ("opening", "closing") else 1) * radius for operation, radius in steps)

class Spec(_Model):
    """A rasterflow pipeline spec, version 1."""

    version: Literal[1] = Field(description="The spec format version; 1.")
    name: StrictStr = Field(
        description="Pipeline name, [a-z0-9_-]+; used in logs, the run report and the lock file.",
        pattern=r"^[a-z0-9_-]+$",
        max_length=128,
    )
    description: StrictStr | None = Field(default=None, description="Free text.")
    tags: list[Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_.:-]+$")]] = Field(
        default_factory=list, description="Labels for selecting specs in a batch: rasterflow run DIR --select tag:X."
    )
    source: Source = Field(description="The STAC search and the assets to load.")
    grid: Grid = Field(description="The output grid.")
    chunks: Chunks = Field(default_factory=Chunks, description="Dask chunk layout; -1 = whole axis.")
    mask: StrictStr | None = Field(
        default=None, description="Boolean expression over assets; true = drop the pixel (set it to NaN)."
    )
    mask_cleanup: list[MaskStep] | None = Field(
        default=None,
        description="Morphology applied in order to each date's mask before it drops pixels, with disk-shaped "
        "structuring elements of the given radius in pixels (as odc-algo's mask_cleanup; Sentinel-2: "
        "[{opening: 2}, {dilation: 5}] removes speckle and grows cloud edges). Each chunk is read with a halo of the "
        "radii's sum, so the result does not depend on the chunk layout.",
    )
    bands: dict[StrictStr, StrictStr] = Field(
        description="Named expressions, evaluated in order; later ones may use earlier ones.", min_length=1
    )
    reduce: Reduce | Annotated[list[Reduce], Field(min_length=1)] | None = Field(
        default=None,
        description="Optional reduction; without it the time series is written. A list computes several statistics "
        "from one read (every one from the same loaded block, in the same task): each band's outputs are named "
        "{band}_{statistic} (ndvi_median, ndvi_q10, ndvi_count); a period, if any, is given once (on any entry).",
    )
    output: Output = Field(description="Where and how the result is written.")
    cluster: Cluster = Field(default_factory=Cluster, description="The Dask cluster.")
    budget: Budget = Field(default_factory=Budget, description="The static memory budget check.")

    @field_validator("bands")
    @classmethod
    def _check_band_names(cls, bands: dict[str, str]) -> dict[str, str]:
        for name in bands:
            _check_identifier(name, "band name")
        return bands

    @model_validator(mode="after")
    def _check_expressions(self) -> Spec:
        from rasterflow.expr import parse_expression

        assets = list(self.source.assets)
        collisions = sorted(set(assets) & set(self.bands))
        if collisions:
            raise _LocatedError(
                ("bands", collisions[0]),
                f"{collisions[0]!r} is both an asset and a band; rename the band (e.g. {collisions[0]}_out)",
            )
        if self.mask is not None:
            try:
                mask = parse_expression(self.mask, assets, what="mask")
            except ExpressionError as err:
                raise _LocatedError(("mask",), str(err)) from None
            # The mask sees the raw source values: integers unless the spec says otherwise (plan checks again
            # with the data types the items declare).
            try:
                kind = mask.check_kinds({a: self.source.asset_kind(a) or "int" for a in mask.names})
            except ExpressionError as err:
                raise _LocatedError(("mask",), str(err)) from None
            if not mask.is_boolean and not (kind == "int" and mask.is_bit_test):
                raise _LocatedError(
                    ("mask",), f"must be a true/false expression such as \"scl in (3, 8, 9, 10)\" or an integer bit "
                    f"test such as \"(qa >> 3) & 1\" (nonzero = drop) (got {self.mask!r})"
                )
        known = list(assets)
        kinds: dict[str, str] = {a: "float" for a in assets}
        for name, text in self.bands.items():
            try:
                band = parse_expression(text, known, what=f"band {name!r}")
                # Bands see scaled values in the working dtype: every asset is a float there.
                kinds[name] = band.check_kinds(kinds)
            except ExpressionError as err:
                raise _LocatedError(("bands", name), str(err)) from None
            known.append(name)
        if self.source.group_by == "solar_day" and self.chunks.time != -1:
            raise _LocatedError(
                ("chunks", "time"),
                f"source.group_by: solar_day mosaics the tiles of each pass inside one task, so time must be whole; "
                f"set chunks.time: -1 (got {self.chunks.time})",
            )
        if self.output.tiling is not None:
            size = self.output.tiling.size
            for axis in ("y", "x"):
                chunk = getattr(self.chunks, axis)
                if chunk == -1:
                    raise _LocatedError(("output", "tiling", "size"),
                                        f"tiles need chunks.{axis} to be a number of pixels, not -1 (the whole axis); "
                                        f"set chunks.{axis} to a divisor of {size}, e.g. {_divisor_near(size, 1024)}")
                if size % chunk:
                    raise _LocatedError(("output", "tiling", "size"),
                                        f"{size} is not a multiple of chunks.{axis} ({chunk}), so tiles would cut "
                                        f"chunks; use a multiple of {chunk} such as {max(chunk, size - size % chunk)} "
                                        f"or {size - size % chunk + chunk}, or change chunks.{axis}")
        if self.mask_cleanup is not None and self.mask is None:
            raise _LocatedError(("mask_cleanup",), "mask_cleanup cleans the mask, but the spec has none; add mask "
                                                   "(e.g. mask: \"scl in (3, 8, 9, 10)\") or remove mask_cleanup")
        if isinstance(self.reduce, list):
            _check_statistics(self.reduce, self.chunks.time)
        elif self.reduce is not None and self.reduce.method in COMPOSITE_METHODS:
            _check_composite(self.reduce, list(assets), list(self.bands), self.chunks.time)
        if self.output.resolved_format == "cog" and self.reduce is None:
            raise _LocatedError(
                ("output", "format"),
                "a COG holds 2-D bands, so a time series cannot be written to one; add a reduce section or write .zarr",
            )
        return self


    @property
    def reductions(self) -> tuple[Reduce, ...]:
        """The statistics asked for, in order (one for a single ``reduce``, none without)."""
        if self.reduce is None:
            return ()
        return tuple(self.reduce) if isinstance(self.reduce, list) else (self.reduce,)

    @property
    def cleanup_steps(self) -> tuple[tuple[str, int], ...]:
        """``mask_cleanup`` as ``(operation, radius)`` pairs, in order."""
        return tuple(step.operation for step in self.mask_cleanup or ())

    @property
    def cleanup_halo(self) -> int:
        """Pixels read around every task's window for ``mask_cleanup`` (:func:`cleanup_halo`)."""
        return cleanup_halo(self.cleanup_steps)

    @property
    def composite(self) -> CompositeNames | None:
        """A geomedian's or best-pixel composite's bands and variables (None for any other reduction): a geomedian
        reads its ``bands`` and writes them, its MADs and ``count``; a best-pixel composite reads and writes every
        band of ``bands``."""
        reduce = self.reduce if not isinstance(self.reduce, list) else None
        if reduce is None or reduce.method not in COMPOSITE_METHODS:
            return None
        if reduce.method == "geomedian":
            inputs = tuple(reduce.bands or ())
            return CompositeNames("geomedian", inputs, geomedian_variables(inputs, reduce.mads))
        outputs = tuple(self.bands)
        return CompositeNames(str(reduce.method), outputs, outputs)

    @property
    def program_bands(self) -> dict[str, str]:
        """The bands the tasks compute: ``bands``, and an asset a geomedian or best-pixel composite names (its
        masked values, as a band of the same name). A geomedian writes only its own bands: a band it does not
        read, directly or through another band, is not computed (:attr:`unused_bands`)."""
        out = dict(self.bands)
        reduce = self.reduce if not isinstance(self.reduce, list) else None
        if reduce is not None and reduce.method in COMPOSITE_METHODS:
            for name in [*(reduce.bands or ()), *([reduce.by] if reduce.by else [])]:
                if name not in out:
                    out[name] = name
        unused = self.unused_bands
        return {name: text for name, text in out.items() if name not in unused}

    @functools.cached_property
    def unused_bands(self) -> tuple[str, ...]:
        """Bands of ``bands`` that no output needs: with a geomedian, those it does not read (directly or through
        another band's expression); empty otherwise (every band is an output)."""
        reduce = self.reduce if not isinstance(self.reduce, list) else None
        if reduce is None or reduce.method != "geomedian" or not reduce.bands:
            return ()
        from rasterflow.expr import parse_expression

        assets = list(self.source.assets)
        reads: dict[str, frozenset[str]] = {}
        known = list(assets)
        for name, text in self.bands.items():
            try:
                reads[name] = frozenset(parse_expression(text, known, what=f"band {name!r}").names)
            except ExpressionError:  # validation reports it
                return ()
            known.append(name)
        needed: set[str] = set()
        pending = [b for b in reduce.bands if b in self.bands]
        while pending:
            name = pending.pop()
            if name in needed:
                continue
            needed.add(name)
            pending.extend(n for n in reads.get(name, ()) if n in self.bands)
        return tuple(name for name in self.bands if name not in needed)

    @property
    def reduce_period(self) -> Any:
        """``reduce.period`` (of whichever entry of a list gives it): a name, a duration or a list of intervals."""
        return next((r.period for r in self.reductions if r.period), None)

    @property
    def statistics(self) -> tuple[tuple[str, str, float | None], ...]:
        """For a list ``reduce``: per output statistic ``(name, method, q)`` in order (``("q10", "quantile",
        0.1)``), its variables named ``{band}_{name}``; empty for a single ``reduce`` (variables named as the
        bands, a ``quantile`` dimension for a list of ``q``)."""
        if not isinstance(self.reduce, list):
            return ()
        return tuple((statistic_name(r.method, q), r.method, q)
                     for r in self.reduce for q in (r.quantiles or (None,)))


def statistic_name(method: str, q: float | None = None) -> str:
    """The suffix of a statistic's variables: the method (``median``), or ``q`` and the percentage for a quantile
    (0.1 -> ``q10``, 0.9 -> ``q90``, 0.025 -> ``q2_5``: a dot is not allowed in a variable name everywhere)."""
    if q is None:
        return method
    percent = f"{q * 100:.6f}".rstrip("0").rstrip(".")
    return "q" + percent.replace(".", "_")


def _check_composite(reduce: Reduce, assets: list[str], bands: list[str], chunk_time: int) -> None:
    """A geomedian's bands and a best-pixel's ``by`` name assets or bands; time is whole (every date of a pixel
    is looked at together)."""
    known = assets + bands
    if reduce.method == "geomedian":
        for index, name in enumerate(reduce.bands or ()):
            if name not in known:
                raise _LocatedError(("reduce", "bands", index),
                                    f"{name!r} is neither an asset nor a band; use one of {', '.join(known)}")
    elif reduce.by not in known:
        raise _LocatedError(("reduce", "by"), f"by: {reduce.by!r} names nothing; use an asset or a band: "
                                              f"{', '.join(known)}")
    if chunk_time != -1:
        raise _LocatedError(("chunks", "time"),
                            f"a {reduce.method} looks at every date of a pixel at once, so time must be whole; set "
                            f"chunks.time: -1 (got {chunk_time})")


def _check_statistics(entries: list[Reduce], chunk_time: int) -> None:
    """A list ``reduce``: each statistic once, one period, time whole (the statistics share the task's series)."""
    seen: dict[str, int] = {}
    periods = {str(r.period) for r in entries if r.period}
    first_period = next((r.period for r in entries if r.period), None)
    for index, entry in enumerate(entries):
        if entry.method in COMPOSITE_METHODS:
            raise _LocatedError(("reduce", index, "method"),
                                f"a {entry.method} makes variables of its own and is not combined with other "
                                f"statistics; give it alone: reduce: {{method: {entry.method}, ...}}")
        for q in entry.quantiles or (None,):
            name = statistic_name(entry.method, q)
            if name in seen:
                what = f"quantile {q:g}" if q is not None else entry.method
                raise _LocatedError(("reduce", index, "method" if q is None else "q"),
                                    f"{what} is listed twice (entries {seen[name]} and {index}); remove one")
            seen[name] = index
        if len(periods) > 1 and entry.period and str(entry.period) != str(first_period):
            raise _LocatedError(("reduce", index, "period"),
                                f"the statistics of one run share one period; entries ask for "
                                f"{' and '.join(sorted(periods))}: give period once")
    if chunk_time != -1:
        raise _LocatedError(("chunks", "time"),
                            f"several statistics are computed from one read of every date of a chunk, so time must be "
                            f"whole; set chunks.time: -1 (got {chunk_time})")


class _LocatedError(ValueError):
    """A cross-field error that knows which field it is about (the loader maps it to a line)."""

    def __init__(self, loc: tuple[str | int, ...], message: str):
        self.loc = loc
        super().__init__(message)

    def __reduce__(self) -> tuple[type[_LocatedError], tuple[Any, str]]:  # pydantic deep-copies ctx; keep it picklable
        return (_LocatedError, (self.loc, str(self)))


def _divisor_near(size: int, wanted: int) -> int:
    """The divisor of ``size`` closest to ``wanted`` (a chunk edge to suggest for a tile size)."""
    divisors = [d for d in range(1, int(math.isqrt(size)) + 1) if size % d == 0]
    divisors += [size // d for d in divisors]
    return min(divisors, key=lambda d: (abs(d - wanted), d))


def _check_identifier(name: str, what: str) -> None:
    if not _IDENTIFIER.match(name) or keyword.iskeyword(name):
        raise ValueError(f"{what} {name!r} must be an identifier (letters, digits, _; not starting with a digit)")
    if name.startswith("__"):
        raise ValueError(f"{what} {name!r} must not start with '__'")
    if name in _function_names() or name in ("and", "or", "not", "in"):
        raise ValueError(f"{what} {name!r} is a function of the expression language; choose another name")

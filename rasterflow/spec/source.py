"""The spec's source section: the STAC search, asset overrides, retries and remote-read settings."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator, model_validator

from rasterflow.spec.common import RESAMPLING_METHODS, Size, check_identifier, LocatedError, SpecModel
from rasterflow.spec.timeparse import parse_datetime_window
from rasterflow.units import parse_bytes


class StacSource(SpecModel):
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
            raise LocatedError(("bbox",), "give the area to search: bbox (west, south, east, north in degrees) or "
                                           "intersects (a GeoJSON polygon, or the path of a GeoJSON file)")
        if self.bbox is not None and self.intersects is not None:
            raise LocatedError(("intersects",), "give bbox or intersects, not both (a STAC API takes one); the "
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


class AssetOverride(SpecModel):
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


class SourceRetry(SpecModel):
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


class SourceIO(SpecModel):
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
        "thread, beside the tiles the task still needs). auto = follows the round trip plan measures: 32MiB "
        "per 100 ms, 16MiB to 64MiB (32MiB when nothing was measured).",
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
        """``buffer`` in bytes (auto: 32 MiB, what ``readplan.io_buffer`` takes when no round trip was measured)."""
        return 32 * 1024 * 1024 if self.buffer == "auto" else parse_bytes(self.buffer)


class Source(SpecModel):
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
            check_identifier(name, "asset name")
        return assets

    @model_validator(mode="after")
    def _check_overrides(self) -> Source:
        for name in self.overrides:
            if name not in self.assets:
                raise LocatedError(("overrides", name), f"{name!r} is not an asset name; the assets are "
                                    f"{', '.join(self.assets)}")
        return self

    @model_validator(mode="after")
    def _check_failure_policy(self) -> Source:
        if self.max_failed_fraction and self.on_read_error == "fail":
            raise LocatedError(("max_failed_fraction",), "applies only with on_read_error: nodata (with fail the "
                                "first unreadable file stops the run); set on_read_error: nodata or remove it")
        return self

    def asset_kind(self, name: str) -> str | None:
        """``int`` or ``float`` when the spec itself says which data type the asset has; None when only the
        catalog knows."""
        override = self.overrides.get(name)
        if override is None or override.data_type is None:
            return None
        return "float" if override.data_type.startswith("float") else "int"

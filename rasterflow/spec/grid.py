"""The spec's output grid and chunk layout."""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import Field, StrictFloat, StrictInt, StrictStr, field_validator

from rasterflow.spec.common import RESAMPLING_METHODS, PositiveFloat, SpecModel

EPSG_PATTERN = re.compile(r"^EPSG:[0-9]{4,6}$")


class Grid(SpecModel):
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
        if not EPSG_PATTERN.match(crs.strip().upper()):
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


class Chunks(SpecModel):
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

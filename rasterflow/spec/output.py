"""The spec's output section: path and format, encoding, COG options and tiling."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

from rasterflow.spec.common import LocatedError, SpecModel

COMPRESSION_CODECS = ("zstd", "deflate", "lzw", "lz4", "none")
FORMAT_BY_SUFFIX = {".zarr": "zarr", ".tif": "cog", ".tiff": "cog"}


OUTPUT_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "float64")
COG_RESAMPLINGS = ("nearest", "average", "bilinear", "cubic", "cubicspline", "lanczos", "mode", "rms")


class OutputEncoding(SpecModel):
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
            raise LocatedError(("scale",), "scale must not be 0")
        if self.dtype and self.dtype[0] in "ui" and self.nodata is not None:
            bits = int(self.dtype.lstrip("uint"))
            lo, hi = (0, 2**bits - 1) if self.dtype.startswith("u") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
            if not float(self.nodata).is_integer() or not lo <= self.nodata <= hi:
                raise LocatedError(("nodata",), f"{self.nodata} is not a valid {self.dtype} value ({lo}..{hi})")
        return self


class CogOptions(SpecModel):
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


class Tiling(SpecModel):
    """Split the output grid into square tiles, each written (and resumed) as an output of its own."""

    size: Annotated[StrictInt, Field(gt=0)] = Field(
        description="Tile edge in output grid pixels, a multiple of chunks.y and chunks.x (e.g. 8192 with chunks of "
        "1024); the last row and column of tiles are cut at the grid's edge."
    )


class Output(SpecModel):
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
            raise LocatedError(("if_exists",), "update is not available with tiling (a rerun of the same job "
                                "already skips finished tiles); use skip or overwrite, or remove tiling")
        return self

    @model_validator(mode="after")
    def _check_output_options(self) -> Output:
        fmt = self.format or FORMAT_BY_SUFFIX.get(PurePosixPath(self.path.rstrip("/")).suffix.lower())
        if "zarr_format" in self.model_fields_set and fmt != "zarr":
            raise LocatedError(("zarr_format",), "zarr_format applies to Zarr outputs only; remove it")
        if self.zarr_shards is not None and fmt != "zarr":
            raise LocatedError(("zarr_shards",), "zarr_shards applies to Zarr outputs only; remove it")
        if self.zarr_shards not in (None, 1) and self.zarr_format != 3:
            raise LocatedError(("zarr_shards",), f"zarr_shards: {self.zarr_shards} needs zarr_format: 3 (format 2, "
                                "the one GDAL opens, has no shards); set zarr_format: 3 or remove zarr_shards")
        if "cog" in self.model_fields_set and fmt != "cog":
            raise LocatedError(("cog",), "cog options apply to COG outputs (.tif) only; remove them")
        if self.cog.predictor == "floating_point" and self.encoding.dtype and self.encoding.dtype[0] in "ui":
            raise LocatedError(("cog", "predictor"),
                                f"floating_point needs a float dtype (encoding.dtype is {self.encoding.dtype}); "
                                f"use standard or auto")
        return self

    @model_validator(mode="after")
    def _check_format(self) -> Output:
        suffix = PurePosixPath(self.path.rstrip("/")).suffix.lower()
        implied = FORMAT_BY_SUFFIX.get(suffix)
        if self.format is None and implied is None:
            raise LocatedError(("path",),
                f"cannot tell the format from {self.path!r}; end the path in .zarr or .tif, or set format: zarr | cog"
            )
        if self.format is not None and implied is not None and implied != self.format:
            raise LocatedError(("format",),
                f"format {self.format!r} does not match the path's extension {suffix!r} (which means {implied!r}); "
                f"change one of them"
            )
        fmt = self.format or implied or "zarr"  # one of them is set: checked above
        unsupported = {"zarr": "lzw", "cog": "lz4"}[fmt]
        if self.compression == unsupported:
            other = "zstd, deflate, lz4 or none" if unsupported == "lzw" else "zstd, deflate, lzw or none"
            raise LocatedError(
                ("compression",), f"{unsupported} is not available for {self.format or implied}; use {other}"
            )
        return self

    @model_validator(mode="after")
    def _check_policy(self) -> Output:
        if self.overwrite is not None and self.if_exists is not None and self.if_exists != self.policy_of_overwrite:
            raise LocatedError(("if_exists",), f"contradicts overwrite: {str(self.overwrite).lower()}; keep only "
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
        return self.format or FORMAT_BY_SUFFIX[PurePosixPath(self.path.rstrip("/")).suffix.lower()]

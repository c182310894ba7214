"""How an output stores its values: the compression codec of a format, and the encoding (stored dtype, scale,
offset, nodata) with the function that turns physical values into stored ones.

Standard library at import time; numpy loads inside the functions.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import numpy.typing as npt

__all__ = ["compression_name", "ENCODING_DTYPES", "Encoding", "encode_block"]


def compression_name(compression: str | None, fmt: str) -> str:
    """Normalise ``output.compression`` for a format; warns and substitutes when the format lacks the codec.

    Zarr has no LZW codec (deflate is used instead); GeoTIFF has no LZ4 (zstd is used instead).

    Parameters
    ----------
    compression : str or None
        As the spec gives it (aliases such as ``zlib``, ``gzip``, ``zstandard`` accepted); None = ``none``.
    fmt : {"zarr", "cog"}

    Returns
    -------
    str
        One of ``zstd``, ``deflate``, ``lzw``, ``lz4``, ``none``.

    Raises
    ------
    ValueError
        An unknown compression.
    """
    name = (compression or "none").lower()
    aliases = {"zlib": "deflate", "gzip": "deflate", "zstandard": "zstd", "": "none", "null": "none"}
    name = aliases.get(name, name)
    if name not in ("zstd", "deflate", "lzw", "lz4", "none"):
        raise ValueError(f"unknown compression {compression!r}; expected zstd, deflate, lzw, lz4 or none")
    if fmt == "zarr" and name == "lzw":
        warnings.warn("Zarr has no LZW codec; writing with deflate (zlib) instead", UserWarning, stacklevel=3)
        return "deflate"
    if fmt == "cog" and name == "lz4":
        warnings.warn("GeoTIFF has no LZ4 compression; writing with zstd instead", UserWarning, stacklevel=3)
        return "zstd"
    return name


#: Integer dtypes an output may be stored as, and the floats.
ENCODING_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "float64")


@dataclasses.dataclass(frozen=True)
class Encoding:
    """How physical values are stored: ``stored = round((physical - offset) / scale)``, NaN -> ``nodata``.

    Readers get the physical values back as ``stored * scale + offset`` (CF ``scale_factor``/``add_offset`` in Zarr,
    GDAL's band scale/offset in a GeoTIFF), the same convention in both.
    """

    dtype: str | None = None
    """The stored data type; None = the computed one (float32, or float64 when ``grid.dtype`` asks)."""
    scale: float = 1.0
    """Stored units per physical unit are ``1 / scale``; e.g. 0.0001 stores NDVI 0.1234 as 1234."""
    offset: float = 0.0
    """Added after scaling when reading."""
    nodata: float | None = None
    """The stored value of a missing pixel; None = NaN for floats, the dtype's minimum (signed) or maximum
    (unsigned) for integers."""

    def resolved(self, computed_dtype: npt.DTypeLike) -> Encoding:
        """This encoding with ``dtype`` and ``nodata`` filled in for data computed as ``computed_dtype``."""
        import numpy as np

        dtype = np.dtype(self.dtype or computed_dtype)
        if dtype.name not in ENCODING_DTYPES:
            raise ValueError(f"cannot store outputs as {dtype.name}; use one of {', '.join(ENCODING_DTYPES)}")
        if not self.scale or not np.isfinite(self.scale):
            raise ValueError(f"encoding scale must be a finite non-zero number (got {self.scale})")
        nodata = self.nodata
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            if nodata is None:
                nodata = float(info.min if dtype.kind == "i" else info.max)
            elif not (float(nodata).is_integer() and info.min <= nodata <= info.max):
                raise ValueError(f"encoding nodata {nodata} is not a valid {dtype.name} value ({info.min}..{info.max})")
        elif nodata is None:
            nodata = float("nan")
        return Encoding(dtype=dtype.name, scale=float(self.scale), offset=float(self.offset), nodata=float(nodata))

    @property
    def is_scaled(self) -> bool:
        """Whether stored values differ from physical ones (a scale other than 1 or an offset other than 0)."""
        return self.scale != 1.0 or self.offset != 0.0

    def valid_range(self) -> tuple[float, float]:
        """The physical values the stored dtype holds (nodata excluded when it is at an end of the range)."""
        import numpy as np

        dtype = np.dtype(self.dtype)
        if dtype.kind == "f":
            lo, hi = float(np.finfo(dtype).min), float(np.finfo(dtype).max)
        else:
            info = np.iinfo(dtype)
            lo, hi = float(info.min), float(info.max)
            if self.nodata == lo:
                lo += 1
            elif self.nodata == hi:
                hi -= 1
        ends = sorted((lo * self.scale + self.offset, hi * self.scale + self.offset))
        return ends[0], ends[1]


def encode_block(values: npt.ArrayLike, encoding: Encoding, name: str = "") -> npt.NDArray[Any]:
    """Physical values (NaN = missing) -> the stored array of a resolved ``encoding``.

    Parameters
    ----------
    values : array_like
        Physical values, NaN where missing.
    encoding : Encoding
        A resolved encoding (:meth:`Encoding.resolved`).
    name : str, optional
        The band, for the error message.

    Returns
    -------
    numpy.ndarray
        Of ``encoding.dtype``, missing values set to ``encoding.nodata``.

    Raises
    ------
    ValueError
        A valid value does not fit the stored dtype (or would be stored as the nodata value): saying which band,
        the value and the range the encoding holds, so the user can choose another scale, offset or dtype. Values are
        never clipped silently.
    """
    import numpy as np

    physical = np.asarray(values)
    dtype = np.dtype(encoding.dtype)
    missing = np.isnan(physical) if physical.dtype.kind == "f" else np.zeros(physical.shape, dtype=bool)
    stored: npt.NDArray[Any]
    if encoding.is_scaled:
        with np.errstate(invalid="ignore"):
            stored = (physical.astype(np.float64) - encoding.offset) / encoding.scale
    else:
        stored = physical
    what = f"band {name!r}" if name else "a band"
    if dtype.kind == "f":
        out = stored.astype(dtype)
        if encoding.nodata is not None and not np.isnan(encoding.nodata):
            if np.any(out[~missing] == encoding.nodata):
                raise ValueError(f"{what} has valid values equal to the output nodata {encoding.nodata:g}; choose "
                                 "another output.encoding.nodata")
            out[missing] = encoding.nodata
        return out
    stored = np.rint(stored)
    valid = stored[~missing]
    if valid.size:
        info = np.iinfo(dtype)
        lo, hi = float(valid.min()), float(valid.max())
        clash = np.any(valid == encoding.nodata)
        if not (np.isfinite(lo) and np.isfinite(hi)) or lo < info.min or hi > info.max or clash:
            plo, phi = encoding.valid_range()
            raise ValueError(
                f"{what} has values that {dtype.name} with scale {encoding.scale:g} and offset {encoding.offset:g} "
                f"cannot hold apart from nodata {encoding.nodata:g} (it holds {plo:g} .. {phi:g}); change "
                "output.encoding (a larger scale, another offset or dtype)"
            )
    # a resolved encoding's nodata is a number (numpy's stubs take no None, which would make an object array)
    out = np.asarray(np.where(missing, encoding.nodata, stored))  # type: ignore[arg-type]
    return out.astype(dtype)

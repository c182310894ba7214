"""How an output stores its values: the compression codec of a format, and the encoding (stored dtype, scale,
offset, nodata) with the function that turns physical values into stored ones.

Standard library at import time; numpy loads inside the functions. :func:`compression_name`,
:data:`ENCODING_DTYPES` and :class:`Encoding` are defined in :mod:`rasterflow.writeplan` (the budget sizes an output
with them too) and re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rasterflow.writeplan import ENCODING_DTYPES, Encoding, compression_name

if TYPE_CHECKING:  # pragma: no cover
    import numpy.typing as npt

__all__ = ["compression_name", "ENCODING_DTYPES", "Encoding", "encode_block"]


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

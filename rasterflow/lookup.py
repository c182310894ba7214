"""Per-value tables for small-integer rasters: a per-pixel function evaluated once for every value the dtype has.

Most sources are 8- or 16-bit integers (Sentinel-2 reflectances are uint16, its SCL uint8, Landsat's QA uint16).
Turning one into working values (scale, offset, nodata -> NaN) or a cloud mask (``scl in (3, 8, 9, 10)``) is a
function of the raw value alone, so it is computed once over the dtype's whole domain (256 or 65,536 values) and a
plane is then one gather (``table.take(raw)``) instead of a chain of NumPy passes. The tables are built by the same
arithmetic the planes would see, element by element, so the values are the same bit for bit.

NaN is set by *adding* an addend plane of ``-0.0`` (keep) or NaN (drop) instead of ``np.copyto(..., where=mask)``:
a masked copy branches on every pixel and a cloud mask is a random pattern (1 ms vs 0.1 ms per 512² plane,
measured), while ``x + (-0.0)`` is ``x`` exactly for every float (``+0.0`` and ``-0.0`` included) and ``x + NaN``
is NaN. The gathers run in the compiled kernel where it is installed (:func:`gather`), else in NumPy.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from rasterflow import compiled
from rasterflow.expr import Expression

__all__ = ["TABLE_DTYPES", "gather", "table_index", "scaled", "working_table", "mask_addend_table", "nan_addend"]

TABLE_DTYPES = frozenset({"uint8", "int8", "uint16", "int16"})
"""Raw dtypes small enough for a table (at most 65,536 entries: 256 KB of float32)."""


def table_index(raw: np.ndarray) -> np.ndarray:
    """``raw`` as indices into a table of its dtype's domain (signed values as their unsigned bit patterns)."""
    if raw.dtype.kind == "i":  # the same bytes as unsigned, in the array's own byte order
        return raw.view(np.dtype(f"u{raw.dtype.itemsize}").newbyteorder(raw.dtype.byteorder))
    return raw


def gather(table: np.ndarray, raw: np.ndarray, *, addend: tuple[np.ndarray, np.ndarray] | None = None,
           native: bool | None = None) -> np.ndarray:
    """``table.take(table_index(raw))``: each raw value's entry of a table of its dtype's whole domain; with
    ``addend = (addend_table, addend_raw)`` (a mask's table of NaN / ``-0.0`` and its raw plane) plus that gather,
    the dtype's own addition as ``+=`` gives it.

    With the compiled kernel (``native`` None: where installed; True: required) each is one pass over the plane (np.take
    first casts the index to intp and checks every element's bounds; the addend needs no plane of its own).
    """
    kernels = compiled.chosen(native)
    pairs = [(table, table_index(raw))]
    if addend is not None:
        pairs.append((addend[0], table_index(addend[1])))
    fits = all(array.flags.c_contiguous and array.dtype.isnative for pair in pairs for array in pair)
    if kernels is None or not fits or pairs[-1][1].shape != pairs[0][1].shape:
        values = table.take(pairs[0][1])
        if addend is not None:
            values += addend[0].take(pairs[1][1])
        return values
    out = np.empty(pairs[0][1].shape, dtype=table.dtype)
    if addend is None:
        kernels.take(table, pairs[0][1], out)
    else:
        kernels.take_add(table, pairs[0][1], addend[0], pairs[1][1], out)
    return out


def _domain(dtype: np.dtype) -> np.ndarray:
    """Every value of ``dtype``, at the position :func:`table_index` gives it."""
    return np.arange(2 ** (8 * dtype.itemsize), dtype=np.dtype(f"u{dtype.itemsize}")).view(dtype)


def scaled(raw: np.ndarray, dtype: np.dtype, scale: float, offset: float, nodata: float) -> np.ndarray:
    """``raw`` in ``dtype``: multiply by ``scale``, then add ``offset`` (in ``dtype``, as the float reference does);
    NaN where ``raw == nodata`` (``nodata`` NaN: none). A new array."""
    values = raw.astype(dtype, copy=True)
    if scale != 1:
        values *= dtype.type(scale)
    if offset != 0:
        values += dtype.type(offset)
    if not math.isnan(nodata):
        values += nan_addend(raw == nodata, dtype)
    return values


@functools.lru_cache(maxsize=32)
def _working_table(raw_dtype: str, dtype: str, scale: float, offset: float, nodata: float | None) -> np.ndarray:
    table = scaled(_domain(np.dtype(raw_dtype)), np.dtype(dtype), scale, offset,
                   math.nan if nodata is None else nodata)
    table.setflags(write=False)  # shared by every task of this process
    return table


def working_table(raw_dtype: np.dtype, dtype: np.dtype, scale: float, offset: float,
                  nodata: float) -> np.ndarray | None:
    """The table of :func:`scaled` over ``raw_dtype``'s domain (cached), or None when ``raw_dtype`` is too wide.

    ``working_table(...).take(table_index(raw))`` equals ``scaled(raw, ...)`` bit for bit."""
    if raw_dtype.name not in TABLE_DTYPES:
        return None
    return _working_table(raw_dtype.name, dtype.name, float(scale), float(offset),
                          None if math.isnan(nodata) else float(nodata))


@functools.lru_cache(maxsize=16)
def _mask_addend_table(mask: Expression, name: str, raw_dtype: str, dtype: str) -> np.ndarray:
    domain = _domain(np.dtype(raw_dtype))
    drop = np.broadcast_to(np.asarray(mask.evaluate({name: domain})) != 0, domain.shape)  # true or nonzero = drop
    table = nan_addend(np.ascontiguousarray(drop), np.dtype(dtype))
    table.setflags(write=False)
    return table


def mask_addend_table(mask: Expression, raw_dtype: np.dtype, dtype: np.dtype) -> np.ndarray | None:
    """For a mask that reads one asset of a small integer dtype: per raw value, ``-0.0`` where the mask keeps the
    pixel and NaN where it drops it (cached); None for any other mask.

    The mask is evaluated on every value of the dtype, so a gather of this table is the mask's own result on each
    pixel (every operation of the expression language is elementwise)."""
    if len(mask.names) != 1 or raw_dtype.name not in TABLE_DTYPES:
        return None
    (name,) = mask.names
    return _mask_addend_table(mask, name, raw_dtype.name, dtype.name)


_ADDENDS: dict[str, np.ndarray] = {}


def nan_addend(bad: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A new plane of ``dtype``: NaN where ``bad`` (boolean) is true, ``-0.0`` elsewhere; adding it sets NaN there
    and changes nothing else."""
    pair = _ADDENDS.get(dtype.name)
    if pair is None:
        pair = _ADDENDS[dtype.name] = np.array([-0.0, np.nan], dtype=dtype)
    return pair.take(bad.view(np.uint8))

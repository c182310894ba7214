"""Byte sizes and dtype sizes: ``"2GB"`` <-> bytes (stdlib + NumPy only)."""

from __future__ import annotations

import re

__all__ = ["parse_bytes", "format_bytes", "dtype_itemsize"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: str | int | float) -> int:
    """Parse a byte size such as ``"4GB"``, ``"512 MiB"`` or ``1e9`` into bytes.

    Raises
    ------
    ValueError
        If the text is not a non-negative number with a known unit.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size like '4GB', got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"a size cannot be negative (got {value})")
        return int(value)
    match = _SIZE_RE.match(str(value))
    if not match:
        raise ValueError(f"expected a size like '4GB' or '512MiB', got {value!r}")
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(f"unknown size unit {unit!r} in {value!r}; use B, KB, MB, GB, TB or KiB, MiB, GiB, TiB")
    return int(float(number) * factor)


def format_bytes(n: float) -> str:
    """Format bytes in decimal units with three significant digits: ``format_bytes(84e6) == '84 MB'``."""
    n = float(n)
    for unit, factor in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= factor:
            value = n / factor
            text = f"{value:.3g}" if value < 100 else f"{value:.0f}"
            return f"{text} {unit}"
    return f"{n:.0f} B"


def dtype_itemsize(dtype: str) -> int:
    """Bytes per element of a NumPy dtype name (``"float32"`` -> 4)."""
    import numpy as np

    return int(np.dtype(dtype).itemsize)

"""Zarr v3 shard layout: how many chunks one shard object holds, and how many shards a writer keeps in flight.

Defined in :mod:`rasterflow.writeplan` (standard library only), so the static budget check (``rasterflow validate``)
sizes a sharded write without importing a writer, zarr or xarray; :mod:`rasterflow.write.zarr` writes with the same
numbers, re-exported here.
"""

from __future__ import annotations

from rasterflow.writeplan import (
    MAX_SHARD_SIDE,
    SHARD_ABOVE_CHUNKS,
    SHARD_BYTES,
    SHARDS_IN_FLIGHT,
    shard_side,
)

__all__ = ["MAX_SHARD_SIDE", "SHARDS_IN_FLIGHT", "SHARD_ABOVE_CHUNKS", "SHARD_BYTES", "shard_side"]

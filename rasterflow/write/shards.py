"""Zarr v3 shard layout: how many chunks one shard object holds, and how many shards a writer keeps in flight.

Standard library only, so the static budget check (``rasterflow validate``) sizes a sharded write without importing
zarr or xarray; :mod:`rasterflow.write.zarr` writes with the same numbers.
"""

from __future__ import annotations

__all__ = ["SHARD_BYTES", "MAX_SHARD_SIDE", "SHARD_ABOVE_CHUNKS", "SHARDS_IN_FLIGHT", "shard_side"]

#: At most this many bytes (stored dtype) and this many chunks per side in one shard. A write task holds one shard
#: (its Dask blocks, then the assembled shard): 64 MiB keeps that within a few chunks of the usual size.
SHARD_BYTES = 64 * 2**20
MAX_SHARD_SIDE = 8
#: By default only arrays of more chunks than this are sharded: a few hundred objects list and copy quickly, and an
#: unsharded store is what more readers open.
SHARD_ABOVE_CHUNKS = 1024
#: Shard positions a writer keeps in flight at once: one being finished and written while the next one's chunks are
#: computed, so no worker idles at a shard's end; each finished chunk is held until its whole shard is written.
SHARDS_IN_FLIGHT = 2


def shard_side(chunk_yx: tuple[int, int], itemsize: int, numblocks_yx: tuple[int, int],
               requested: int | None = None) -> int:
    """Chunks per shard side for a Zarr v3 store.

    Parameters
    ----------
    chunk_yx : (int, int)
        The Zarr chunk's rows and columns.
    itemsize : int
        Bytes per stored value.
    numblocks_yx : (int, int)
        Chunks of the array per axis.
    requested : int, optional
        ``output.zarr_shards``: used as given (1: no sharding).

    Returns
    -------
    int
        ``requested``, else 1 (no sharding) for an array of at most :data:`SHARD_ABOVE_CHUNKS` chunks, else the
        largest power of two up to :data:`MAX_SHARD_SIDE` whose square shard holds at most :data:`SHARD_BYTES` and
        does not exceed the array.
    """
    if requested is not None:
        if int(requested) < 1:
            raise ValueError(f"shards must be a positive number of chunks per shard side, got {requested}")
        return int(requested)
    side = 1
    if numblocks_yx[0] * numblocks_yx[1] <= SHARD_ABOVE_CHUNKS:
        return side
    chunk_bytes = chunk_yx[0] * chunk_yx[1] * itemsize
    while (side * 2 <= MAX_SHARD_SIDE and (side * 2) ** 2 * chunk_bytes <= SHARD_BYTES
           and side < max(numblocks_yx)):
        side *= 2
    return side

"""The record of what a writer produced: :class:`WriteResult` (paths, sizes, blocks written and kept, checksums and
statistics the writer already knows, for the STAC Items).

Standard library only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.write.stacstats import BlockStats

__all__ = ["WriteResult"]


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """What a writer produced."""

    paths: tuple[str, ...]
    """The outputs written: one Zarr store, or one COG per entry of the leading dimensions."""
    bytes_written: int
    """Total size on disk of ``paths`` after the write (compressed bytes, overviews included)."""
    blocks_written: int
    """Dask blocks computed and written by this run (for COG: one block = all bands of one chunk of one file; for a
    sharded Zarr store, the blocks of the shards written)."""
    blocks_skipped: int
    """Blocks found finished by an earlier, interrupted run with the same fingerprint and not recomputed."""
    format: str
    """``"zarr"`` or ``"cog"``."""
    checksums: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Per path: its ``file:checksum`` (SHA2-256 multihash) when the writer already knows it (an uploaded COG,
    checked against the object), so the STAC item need not download the file again."""
    statistics: Mapping[str, Mapping[tuple[int, ...], BlockStats]] = dataclasses.field(default_factory=dict)
    """Statistics (:class:`rasterflow.write.stacstats.BlockStats`) as the write tasks computed them: a Zarr store's by
    array name and chunk index (chunks not written by this run are read back); a COG's by file path and ``(band,
    tile row, tile column)`` of its full-resolution tiles, when the workers made the tiles
    (:mod:`rasterflow.write.cogtiles`; otherwise the file is read back)."""

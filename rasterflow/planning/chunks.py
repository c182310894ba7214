"""The chunk index: per spatial chunk, the items whose files meet it, and the depth of a chunk at other sizes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from rasterflow import budget
from rasterflow.sources import SourceTable


MAX_RECOUNT_CHUNKS = 4_000_000
"""Above this many chunks of a candidate size (the budget's fix solver tries smaller chunks), :meth:`ChunkIndex.depth`
bounds the items per chunk from the planned chunks instead of counting them (the count is an array per chunk)."""


@dataclass(frozen=True, eq=False)
class ChunkIndex:
    """Per spatial chunk of the plan, the items (time indices) with a file whose footprint meets it: what its task
    reads (:func:`rasterflow.graph.build_dataset` gives each task only these; the others would only be NaN there).

    Built once per plan from the declared footprints (:attr:`rasterflow.sources.AssetRead.footprint`; a file
    without one meets every chunk) in O(files + chunks touched × items per footprint), a footprint placed once per
    distinct box, one chunk row at a time; no file is opened. Chunk ``(i, j)`` is ``i * n_x + j``; its items are
    ``items[offsets[c]:offsets[c + 1]]``, ascending.
    """

    grid_shape: tuple[int, int]
    chunk_yx: tuple[int, int]
    n_items: int
    n_dates: int
    """Output dates of the plan (passes with ``group_by: solar_day``)."""
    offsets: Any
    """``(n_chunks + 1,)`` int64: where each chunk's items start in :attr:`items`."""
    items: Any
    """int32 item indices, ascending within each chunk."""
    most_items: int
    """The most items meeting one chunk (a task's time depth on the fused path)."""
    most_dates: int
    """The most output dates with an item meeting one chunk (a fused task's series; every date when
    ``dates_kept``)."""
    most_files: int
    """The most files (item × asset) meeting one chunk, a footprint's pixel of margin off (what a task reads, not
    only opens; ``budget.BudgetInputs.files_per_chunk``)."""
    dates_kept: bool
    """True when the band math gives a value other than NaN where no item is (``where(isnan(red), 0, red)``): a
    fused task's periods then take every date, the absent ones at that value (:func:`rasterflow.kernels.reduce_block`),
    so the budget counts every date."""
    item_boxes: Any
    """``(k, 4)`` distinct bounding boxes of the items' files on the grid and ``item_box_counts`` items each: the
    recount at other chunk sizes (an upper bound for an item whose files lie apart)."""
    item_box_counts: Any
    file_boxes: Any
    """``(k, 4)`` distinct file footprints without their margin, and ``file_box_counts`` files each."""
    file_box_counts: Any
    _depths: dict[tuple[int, int], budget.ChunkDepth] = field(default_factory=dict, repr=False)

    @property
    def n_chunks(self) -> tuple[int, int]:
        return _n_chunks(self.grid_shape, self.chunk_yx)

    def items_of(self, i: int, j: int) -> Any:
        """The item indices (ascending int32 array) with a file meeting chunk ``(i, j)``."""
        c = i * self.n_chunks[1] + j
        return self.items[self.offsets[c]:self.offsets[c + 1]]

    def counts(self) -> Any:
        """``(n_y, n_x)`` items meeting each chunk."""
        import numpy as np

        return np.diff(self.offsets).reshape(self.n_chunks)

    def depth(self, chunk_y: int, chunk_x: int) -> budget.ChunkDepth:
        """The most items, dates and files of one chunk at chunk size ``chunk_y`` × ``chunk_x``: exact at the plan's
        size; at another (the budget's fix candidates) counted from the distinct boxes, or bounded from the planned
        chunks when there would be more than :data:`MAX_RECOUNT_CHUNKS`. Dates there are at most the items."""
        key = (chunk_y, chunk_x)
        if key == self.chunk_yx:
            return budget.ChunkDepth(self.most_items, self.most_dates, self.most_files)
        if key not in self._depths:
            ny, nx = _n_chunks(self.grid_shape, key)
            if ny * nx <= MAX_RECOUNT_CHUNKS:
                items = _most_boxes(self.item_boxes, self.item_box_counts, self.grid_shape, key)
                files = _most_boxes(self.file_boxes, self.file_box_counts, self.grid_shape, key)
            else:  # a window of the candidate size spans at most this many planned chunks per axis
                span = (chunk_y + self.chunk_yx[0] - 1) // self.chunk_yx[0] + 1
                span *= (chunk_x + self.chunk_yx[1] - 1) // self.chunk_yx[1] + 1
                items, files = span * self.most_items, span * self.most_files
            items = min(items, self.n_items)
            dates = self.n_dates if self.dates_kept else min(items, self.n_dates)
            self._depths[key] = budget.ChunkDepth(items, dates, files)
        return self._depths[key]


def _n_chunks(grid_shape: tuple[int, int], chunk_yx: tuple[int, int]) -> tuple[int, int]:
    return -(-grid_shape[0] // chunk_yx[0]), -(-grid_shape[1] // chunk_yx[1])


def _most_boxes(boxes: Any, weights: Any, grid_shape: tuple[int, int], chunk_yx: tuple[int, int]) -> int:
    """The largest sum of ``weights`` of the boxes ``(row0, row1, col0, col1)`` meeting one chunk (a difference
    array over the chunks: O(boxes + chunks))."""
    import numpy as np

    ny, nx = _n_chunks(grid_shape, chunk_yx)
    if not len(boxes):
        return 0
    cy, cx = chunk_yx
    a, b = boxes[:, 0] // cy, (boxes[:, 1] - 1) // cy + 1
    c, d = boxes[:, 2] // cx, (boxes[:, 3] - 1) // cx + 1
    diff = np.zeros((ny + 1, nx + 1), dtype=np.int64)
    np.add.at(diff, (a, c), weights)
    np.add.at(diff, (a, d), -weights)
    np.add.at(diff, (b, c), -weights)
    np.add.at(diff, (b, d), weights)
    return int(diff.cumsum(axis=0).cumsum(axis=1)[:ny, :nx].max())


def build_chunk_index(sources: SourceTable, grid_shape: tuple[int, int], chunk_yx: tuple[int, int], *,
                      steps: Sequence[Sequence[int]] = (), dates_kept: bool = False) -> ChunkIndex:
    """The :class:`ChunkIndex` of ``sources`` on a grid of ``grid_shape`` cut in ``chunk_yx`` chunks.

    ``steps``: the items of each output date (``source.group_by: solar_day``), to count the dates of a chunk;
    empty = every item its own date.
    """
    import numpy as np

    height, width = grid_shape
    cy, cx = chunk_yx
    ny, nx = _n_chunks(grid_shape, chunk_yx)
    n_items = len(sources.reads)
    # every file as (item, row0, row1, col0, col1): the footprint test of AssetRead.intersects, None = the grid
    item_of: list[int] = []
    boxes: list[tuple[int, int, int, int]] = []
    for t, item_reads in enumerate(sources.reads):
        for read in item_reads:
            if read is None:
                continue
            item_of.append(t)
            boxes.append((0, height, 0, width) if read.footprint is None else read.footprint)
    files = np.array(boxes, dtype=np.int64).reshape(-1, 4)
    file_items = np.array(item_of, dtype=np.int64)
    meets = (files[:, 0] < files[:, 1]) & (files[:, 2] < files[:, 3])

    # the files a task reads: footprints are rounded out by a pixel, and a file that meets a chunk only with that
    # pixel has just its header read, which costs little next to a file that is read (budget.OPEN_FILE_BYTES)
    shrunk = files[meets].copy()
    tall, wide = shrunk[:, 1] - shrunk[:, 0] > 2, shrunk[:, 3] - shrunk[:, 2] > 2
    shrunk[tall, 0] += 1
    shrunk[tall, 1] -= 1
    shrunk[wide, 2] += 1
    shrunk[wide, 3] -= 1
    file_boxes, file_box_counts = np.unique(shrunk, axis=0, return_counts=True) if len(shrunk) else (shrunk, shrunk[:, 0])

    # (item, box) pairs over the distinct boxes: a tile's files share one box across dates and assets
    files, file_items = files[meets], file_items[meets]
    if len(files):
        box_list, box_of = np.unique(files, axis=0, return_inverse=True)
        box_of = box_of.reshape(-1)
        pairs = _sorted_unique(file_items * len(box_list) + box_of)
        pair_item, pair_box = pairs // len(box_list), pairs % len(box_list)
    else:
        box_list = files
        pair_item = pair_box = np.zeros(0, dtype=np.int64)
    # each item's bounding box (for the recount at other chunk sizes)
    item_bounds = np.tile(np.array([height, -1, width, -1], dtype=np.int64), (n_items, 1))
    placed_boxes = box_list[pair_box]
    for k, extreme in enumerate((np.minimum, np.maximum, np.minimum, np.maximum)):
        extreme.at(item_bounds[:, k], pair_item, placed_boxes[:, k])
    placed = item_bounds[:, 1] > 0
    item_boxes, item_box_counts = (np.unique(item_bounds[placed], axis=0, return_counts=True) if placed.any()
                                   else (item_bounds[:0], item_bounds[:0, 0]))

    step_of = None
    n_dates = n_items
    if steps:
        step_of = np.empty(n_items, dtype=np.int64)
        for d, indices in enumerate(steps):
            step_of[list(indices)] = d
        n_dates = len(steps)

    # per chunk row: the (col, item) pairs of the boxes that meet it, deduplicated and sorted
    row0, row1 = box_list[:, 0] // cy, (box_list[:, 1] - 1) // cy + 1
    col0, col1 = box_list[:, 2] // cx, (box_list[:, 3] - 1) // cx + 1
    order = np.argsort(pair_box, kind="stable")  # the items of each box, ascending, contiguous
    box_items = pair_item[order]
    box_start = np.searchsorted(pair_box[order], np.arange(len(box_list) + 1))
    per_row_items: list[Any] = []
    counts = np.zeros((ny, nx), dtype=np.int64)
    most_dates = 0
    for i in range(ny):
        here = np.flatnonzero((row0 <= i) & (i < row1))
        if not len(here):
            per_row_items.append(np.zeros(0, dtype=np.int32))
            continue
        n_of = box_start[here + 1] - box_start[here]  # items per box
        width_of = col1[here] - col0[here]  # chunks per box in this row
        # every (box, col) of the row, then every item of that box
        box_rep = np.repeat(here, width_of)
        col = np.repeat(col0[here], width_of) + _ramp(width_of)
        reps = np.repeat(n_of, width_of)
        item = box_items[np.repeat(box_start[box_rep], reps) + _ramp(reps)]
        keys = _sorted_unique(np.repeat(col, reps) * n_items + item)
        cols_of = keys // n_items
        counts[i] = np.bincount(cols_of, minlength=nx)
        per_row_items.append((keys % n_items).astype(np.int32))
        if step_of is not None:
            dated = _sorted_unique(cols_of * n_dates + step_of[keys % n_items])
            most_dates = max(most_dates, int(np.bincount(dated // n_dates, minlength=nx).max()))
    offsets = np.zeros(ny * nx + 1, dtype=np.int64)
    np.cumsum(counts.reshape(-1), out=offsets[1:])
    items = np.concatenate(per_row_items) if per_row_items else np.zeros(0, dtype=np.int32)
    most_items = int(counts.max()) if counts.size else 0
    if step_of is None:
        most_dates = most_items
    if dates_kept:
        most_dates = n_dates
    most_files = _most_boxes(file_boxes, file_box_counts, grid_shape, chunk_yx)
    return ChunkIndex(grid_shape=grid_shape, chunk_yx=chunk_yx, n_items=n_items, n_dates=n_dates, offsets=offsets,
                      items=items, most_items=most_items, most_dates=most_dates, most_files=most_files,
                      dates_kept=dates_kept, item_boxes=item_boxes, item_box_counts=item_box_counts,
                      file_boxes=file_boxes, file_box_counts=file_box_counts)


def _sorted_unique(values: Any) -> Any:
    """``np.unique`` of a 1-D integer array by a sort (NumPy 2's hash-based ``np.unique`` is ~8x slower here)."""
    import numpy as np

    values = np.sort(values)
    if len(values) < 2:
        return values
    keep = np.empty(len(values), dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def _ramp(lengths: Any) -> Any:
    """``[0, 1, .., n0 - 1, 0, 1, .., n1 - 1, ...]`` for ``lengths`` ``[n0, n1, ...]``."""
    import numpy as np

    total = int(lengths.sum())
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.arange(total, dtype=np.int64) - starts

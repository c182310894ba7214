"""Graph layers whose tasks are made when a writer's batch asks for them (issue 13, step 4: the client holds
O(batch) of the graph, not O(job)).

:class:`TaskLayer` is a read-only ``Mapping`` of keys to tasks that builds a task on lookup; ``graph.build_dataset``
gives each of its arrays one, and the COG writer stacks bands with :func:`stack_blocks`. The writers' bounded
submission (``write.submit.BlockTasks``) looks up only the keys of the batch it builds.
"""

from __future__ import annotations

import collections
import itertools
import weakref
import math
import numbers
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # pragma: no cover
    import dask.array as da
    import numpy as np
    import numpy.typing as npt
    from dask.typing import DaskCollection, Key

#: A task in Dask's graph specification: a tuple with a callable first, then its arguments.
Task = tuple[Any, ...]

__all__ = ["TaskLayer", "lazy_array", "layer_named", "stack_blocks", "prefetch_with", "prefetch", "starts_reads", "prefetch_here", "drop_here"]

#: Our layers by name, alive as long as an array holds them: how the writers' bounded submission
#: (:class:`rasterflow.write.submit.BlockTasks`) finds a block's task without looking into Dask's graphs.
_LAYERS: weakref.WeakValueDictionary[str, TaskLayer] = weakref.WeakValueDictionary()


#: Task functions whose reads can start before the task does, and how (:func:`prefetch_with`): ``(ahead, starts)``.
_PREFETCH: dict[Callable[..., Any], tuple[Callable[..., Callable[[], None] | None], Callable[..., bool] | None]] = {}

#: In a worker process: per writer's run token, what drops the reads :func:`prefetch_here` started there (the
#: latest :data:`KEEP_STARTED`).
_STARTED_HERE: dict[str, collections.deque[Callable[[], None]]] = {}

KEEP_STARTED = 64
"""Reads started ahead in a worker process whose drops are kept per run: a run keeps about one chunk waiting per
worker thread, so an older one's task has run (its drop is then a no-op) or never will here. Older drops are called
at once, so that a long run's worker keeps neither their handles nor a stale start's bytes."""


def prefetch_with(function: Callable[..., Any], ahead: Callable[..., Callable[[], None] | None],
                  starts: Callable[..., bool] | None = None) -> None:
    """Register ``ahead(*args)``: start the reads of the task ``(function, *args)`` in this process before a thread
    runs it (the task takes them over when it starts), returning a callable that drops them if it never does (or
    None when there is nothing to start); and ``starts(*args)``: whether ``ahead`` would start anything, answered
    without reading (None: it may) (the writer asks it before sending a task to a worker process with its reads started there).
    The writers call them through :func:`prefetch`, :func:`starts_reads` and :func:`prefetch_here`."""
    _PREFETCH[function] = (ahead, starts)


def prefetch(function: Callable[..., Any], args: tuple[Any, ...]) -> Callable[[], None] | None:
    """Start the reads of the task ``(function, *args)`` ahead if its function registered how
    (:func:`prefetch_with`); the callable that drops them, or None."""
    registered = _PREFETCH.get(function)
    return registered[0](*args) if registered is not None else None


def starts_reads(function: Callable[..., Any], args: tuple[Any, ...]) -> bool:
    """Whether :func:`prefetch` of the task ``(function, *args)`` would start reads (nothing is read here)."""
    registered = _PREFETCH.get(function)
    return registered is not None and (registered[1] is None or bool(registered[1](*args)))


def prefetch_here(token: str, calls: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]) -> int:
    """Start the reads of ``calls`` (tasks ``(function, args)``) in the process this runs in: a worker process, by
    the writer's ``Client.run`` before it sends those tasks there. What their tasks do not take over is dropped by
    :func:`drop_here` with the same ``token``. Returns how many tasks' reads started."""
    started = 0
    for function, args in calls:
        try:
            drop = prefetch(function, args)
        except Exception:  # noqa: BLE001 - only a head start: the task plans its reads itself and meets the error
            drop = None
        if drop is not None:
            kept = _STARTED_HERE.setdefault(token, collections.deque())
            kept.append(drop)
            while len(kept) > KEEP_STARTED:
                kept.popleft()()
            started += 1
    return started


def drop_here(token: str) -> None:
    """Drop the reads :func:`prefetch_here` started in this process under ``token`` that no task took over."""
    for drop in _STARTED_HERE.pop(token, ()):
        drop()


def layer_named(name: object) -> TaskLayer | None:
    """The :class:`TaskLayer` called ``name`` while an array holds it, else None."""
    return _LAYERS.get(name) if isinstance(name, str) else None


def lazy_array(name: str, numblocks: tuple[int, ...], make: Callable[[tuple[int, ...]], Task],
               chunks: tuple[tuple[int, ...], ...], dtype: npt.DTypeLike, dependencies: Sequence[da.Array] = (), *,
               inline: bool = False) -> da.Array:
    """A Dask array whose blocks are ``make(block)`` (a :class:`TaskLayer`), through Dask's documented high-level
    graph constructor: the lazy view a notebook computes with Dask, and whose tasks the writers submit themselves."""
    import dask.array as da
    import numpy as np
    from dask.highlevelgraph import HighLevelGraph

    layer = TaskLayer(name, numblocks, make, inline=inline)
    layer.inputs = {getattr(d, "name", str(id(d))): d for d in dependencies}
    # a Dask array is a Dask collection; dask's annotations disagree (Array.__dask_scheduler__ is not the
    # staticmethod its DaskCollection protocol declares)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=cast("list[DaskCollection]", list(dependencies)))
    return da.Array(graph, name, chunks, meta=np.empty((0,) * len(chunks), dtype=dtype))


class TaskLayer(Mapping["Key", Task]):  # Key: dask.typing's, imported when type checking
    """A read-only graph layer whose tasks are made when they are asked for, not held.

    Keys are ``(name, *block)`` for every block index of ``numblocks`` (C order, as a dict built by nested loops
    would hold them); ``layer[key]`` is ``make(block)``, a task in Dask's graph specification (a tuple with a
    callable first). Membership, iteration and length are arithmetic, so the layer costs O(1) whatever the number
    of chunks: :class:`~rasterflow.write.submit.BlockTasks` looks up only the keys of the batch it is asked for, so a task exists in the
    client only while its batch's graph is built (``graph.build_dataset``'s layers are of this kind). Passed to
    :meth:`~dask.highlevelgraph.HighLevelGraph.from_collections` like a dict (Dask wraps any ``Mapping`` in a
    ``MaterializedLayer`` without copying it).
    """

    def __init__(self, name: str, numblocks: tuple[int, ...], make: Callable[[tuple[int, ...]], Task], *,
                 inline: bool = False):
        self.name = name
        self.numblocks = tuple(int(n) for n in numblocks)
        self.make = make
        self.inline = inline
        """A cheap view (a selection, a stack of blocks): computed inside the task that uses it, never alone."""
        self.inputs: dict[str, da.Array] = {}
        """The arrays its tasks take blocks of, by name (:func:`lazy_array`'s ``dependencies``)."""
        _LAYERS[name] = self

    def __getstate__(self) -> dict[str, Any]:
        # the input arrays are for this process's writers; a pickled copy (a graph shipped whole) needs only tasks
        return {**self.__dict__, "inputs": {}}

    def _block(self, key: object) -> tuple[int, ...] | None:
        if not (isinstance(key, tuple) and len(key) == len(self.numblocks) + 1 and isinstance(key[0], str)
                and key[0] == self.name):
            return None
        block = []
        for index, count in zip(key[1:], self.numblocks):
            if isinstance(index, bool) or not isinstance(index, numbers.Integral):
                return None
            value = int(index)
            if not 0 <= value < count:
                return None
            block.append(value)
        return tuple(block)

    def __contains__(self, key: object) -> bool:
        return self._block(key) is not None

    def __getitem__(self, key: Key) -> Task:
        block = self._block(key)
        if block is None:
            raise KeyError(key)
        return self.make(block)

    def __iter__(self) -> Iterator[Key]:
        for block in itertools.product(*(range(n) for n in self.numblocks)):
            yield (self.name, *block)

    def __len__(self) -> int:
        return math.prod(self.numblocks)


def stack_blocks(arrays: Sequence[da.Array], nlead: int, dtype: npt.DTypeLike) -> da.Array:
    """``da.stack([a.astype(dtype) for a in arrays], axis=nlead)`` chunked 1 along the ``nlead`` leading dims and
    whole along the new axis (what the COG writer's cube is), as one :class:`TaskLayer`: block ``(*lead, 0, i, j)``
    stacks block ``(i, j)`` of every array at that leading index. Dask's stack and rechunk would hold a task per
    block and array in two materialised layers (~3.6 KB per spatial chunk for three bands, measured).

    Parameters
    ----------
    arrays : sequence of dask arrays
        Of one shape ``(*leading, y, x)`` and the same chunks along ``y`` and ``x`` (any along the leading dims).
    nlead : int
        Leading dims.
    dtype
        Of the result; each block is cast before stacking.

    Raises
    ------
    ValueError
        No arrays, or arrays of different shapes or spatial chunks.
    """
    import dask
    import numpy as np

    if not arrays:
        raise ValueError("stack_blocks needs at least one array")
    first = arrays[0]
    if any(a.shape != first.shape or a.chunks[-2:] != first.chunks[-2:] or a.ndim != nlead + 2 for a in arrays):
        raise ValueError("stack_blocks needs arrays of one shape (leading dims, y, x) and the same y and x chunks")
    out_dtype = np.dtype(dtype)
    # per array and leading axis: output index -> (its block, the offset in that block)
    places: list[list[list[tuple[int, int]]]] = []
    for array in arrays:
        axes: list[list[tuple[int, int]]] = []
        for chunks in array.chunks[:nlead]:
            axes.append([(k, offset) for k, size in enumerate(chunks) for offset in range(size)])
        places.append(axes)
    name = "rasterflow-stack-" + dask.base.tokenize([a.name for a in arrays], nlead, out_dtype.str)
    make = _StackTasks([a.name for a in arrays], places, out_dtype)
    numblocks = first.shape[:nlead] + (1,) + first.numblocks[-2:]
    chunks = tuple((1,) * n for n in first.shape[:nlead]) + ((len(arrays),),) + first.chunks[-2:]
    return lazy_array(name, numblocks, make, chunks, out_dtype, arrays, inline=True)


class _StackTasks:
    """The task of block ``(*lead, 0, i, j)`` of :func:`stack_blocks`."""

    def __init__(self, names: list[str], places: list[list[list[tuple[int, int]]]], dtype: np.dtype[Any]):
        self.names, self.places, self.dtype = names, places, dtype

    def __call__(self, block: tuple[int, ...]) -> Task:
        lead, (i, j) = block[:-3], block[-2:]
        keys: list[tuple[str | int, ...]] = []
        indices: list[tuple[slice, ...]] = []
        for name, axes in zip(self.names, self.places):
            at = [axis[n] for axis, n in zip(axes, lead)]
            keys.append((name, *(k for k, _ in at), i, j))
            indices.append(tuple(slice(offset, offset + 1) for _, offset in at))
        return (_stacked, keys, indices, len(lead), self.dtype)


def _stacked(blocks: list[npt.ArrayLike], indices: list[tuple[slice, ...]], axis: int,
             dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    import numpy as np

    return np.stack([np.asarray(block)[index].astype(dtype, copy=False) for block, index in zip(blocks, indices)],
                    axis=axis)



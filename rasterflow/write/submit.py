"""Bounded submission: compute the blocks of a large job a batch at a time, with a cap on blocks in flight.

Both writers use :func:`run_units`. A job of 100k-1M output blocks is never submitted at once: the client holds
futures, and the scheduler tasks, only for the blocks in flight (at most ``max_in_flight`` of them, by default a few
per worker thread, :func:`in_flight_cap`); a new batch is submitted whenever half of that has finished, and the
futures of finished blocks are released at once, so the scheduler forgets their tasks.

The tasks of a batch are made from only that batch's blocks (:class:`BlockTasks`), with distributed's public API:
each key's task comes from the layer that defines it (a :class:`~rasterflow.layers.TaskLayer` that makes the task
when asked, as ``graph.build_dataset``'s layers do, so the client never holds the job's tasks), its inputs followed
the same way, and each is submitted with ``Client.submit``, its inputs' futures as arguments; cheap views (the
selection of one band, a stack of bands) run inside the task that uses them. Blocks of any other Dask collection
(a writer's caller may pass any lazy Dataset) are computed through the collection API (``array.blocks[...]``).
Nothing reads Dask's graph internals, so building a batch costs O(its tasks) whatever the size of the job.

Blocks are grouped into *units* by the writer: the blocks of a unit share upstream tasks (e.g. every band and
period of one spatial chunk comes out of one read-and-reduce task) and are always submitted together, so a shared
task is computed once. Without a distributed client (Dask's threaded or synchronous scheduler) the same loop computes
each unit's tasks in a pool of threads, the same cap applying.

The first failure cancels every block in flight and is raised; blocks already finished stay finished (the Zarr
writer's done-markers let the next run resume from them).
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from rasterflow.layers import Task, layer_named, prefetch, starts_reads
from rasterflow.write.placement import Placement, in_this_process, places_units

if TYPE_CHECKING:  # pragma: no cover
    import dask.array as da
    from distributed import Client, Future

__all__ = ["BlockTasks", "Batch", "evaluate", "run_calls", "run_units", "in_flight_cap", "default_client", "cluster_threads", "settled", "IN_FLIGHT_PER_THREAD", "QUEUED_UNITS", "places_units", "UnitFeed"]

#: Default cap on blocks in flight, per worker thread of the cluster: enough that no thread waits for the next
#: submission (a batch is submitted when half the cap has finished), small enough that the scheduler holds O(threads).
IN_FLIGHT_PER_THREAD = 4

#: Units (a chunk's keys, which share its task) allowed in flight beyond one per worker thread, whatever the cap on
#: blocks says: a unit of more blocks than the cap (a geomedian's 8 variables on 2 threads: cap 8) would otherwise
#: run one chunk at a time on the whole cluster. One: every thread runs a chunk and one waits to start, so a
#: thread that finishes has the next at once; more queued chunks let more finished results wait for their writes.
QUEUED_UNITS = 1

#: A block's key: ``(name, *block index)``.
Key = tuple[Any, ...]


# --------------------------------------------------------------------------------------------------------------------
# where to compute


def default_client(client: Client | None) -> Client | None:
    """``client``, else the global distributed client when Dask's scheduler setting allows one, else None."""
    if client is not None:
        return client
    import dask

    if dask.config.get("scheduler", None) not in (None, "dask.distributed", "distributed"):
        return None
    try:
        from distributed import default_client as _global

        found: Client = _global()
        return found
    except (ImportError, ValueError):
        return None


def local_threads() -> int:
    """Threads of the local (no distributed client) path: 1 for the synchronous scheduler, else Dask's
    ``num_workers`` or the CPU count."""
    import dask

    if dask.config.get("scheduler", None) in ("sync", "synchronous", "single-threaded"):
        return 1
    return int(dask.config.get("num_workers", None) or os.cpu_count() or 1)


def cluster_threads(client: Client | None) -> int:
    """Worker threads of the cluster behind ``client`` (from the scheduler's worker info), or of the local path."""
    if client is None:
        return local_threads()
    return max(1, sum(int(n) for n in client.nthreads().values()))


def in_flight_cap(client: Client | None, per_thread: int = IN_FLIGHT_PER_THREAD) -> int:
    """The default cap on blocks in flight: ``per_thread`` × the cluster's worker threads (at least 2)."""
    return max(2, per_thread * cluster_threads(client))


# --------------------------------------------------------------------------------------------------------------------
# the tasks of a batch, from only its blocks


class _Call:
    """``fn(*args)``; arguments that are other blocks are :class:`_Call` or :class:`_Block` nodes."""

    __slots__ = ("key", "fn", "args", "inline")

    def __init__(self, key: Key, fn: Callable[..., Any], args: tuple[Any, ...], inline: bool):
        self.key, self.fn, self.args, self.inline = key, fn, args, inline


class _Block:
    """Block ``index`` of a Dask collection that is not ours: computed through Dask's public collection API."""

    __slots__ = ("collection", "index")

    def __init__(self, collection: da.Array, index: tuple[int, ...]):
        self.collection, self.index = collection, index


#: Marks an inlined call in the arguments a worker gets: ``[_INLINE, fn, *args]`` (a list, so distributed finds the
#: futures inside it and hands their values over).
_INLINE = "__rasterflow_inline_call__"


def evaluate(value: Any, results: Sequence[Any] = ()) -> Any:
    """Run the inlined calls in ``value`` (nested lists and tuples), innermost first; a :class:`_Result` is the
    value of that call of ``results`` (:func:`run_calls`); other values as they are."""
    if isinstance(value, _Result):
        return results[value.index]
    if isinstance(value, list):
        if value and isinstance(value[0], str) and value[0] == _INLINE:
            fn, *args = value[1:]
            return fn(*(evaluate(a, results) for a in args))
        return [evaluate(v, results) for v in value]
    if isinstance(value, tuple):
        return tuple(evaluate(v, results) for v in value)
    return value


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """A submitted task: ``fn`` applied to its arguments once their inlined calls ran."""
    return fn(*(evaluate(a) for a in args))


class _Result:
    """In :func:`run_calls`' arguments: the value of its ``index``-th call."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def run_calls(calls: list[tuple[Callable[..., Any], tuple[Any, ...]]], roots: list[Any]) -> list[Any]:
    """A unit's task (:meth:`Batch.submit_as_one`): ``calls`` in order, each ``fn(*args)`` with
    :class:`_Result` arguments standing for earlier calls' values, then the values of ``roots``."""
    results: list[Any] = []
    try:
        for fn, args in calls:
            results.append(fn(*(evaluate(a, results) for a in args)))
        return [evaluate(root, results) for root in roots]
    finally:
        results.clear()  # the chunk's result goes when the task ends, also when a write failed


class BlockTasks:
    """The tasks of a few output keys, made from the layers that define them, touching only what they need.

    A key ``(name, *block)`` of one of our lazy arrays (:func:`rasterflow.layers.lazy_array`, e.g.
    ``graph.build_dataset``'s) is made by its layer (:func:`rasterflow.layers.layer_named`), its arguments that are
    keys followed the same way; a cheap view (a selection, a stack: ``inline`` layers) runs inside the task that
    uses it. A block of any other Dask collection among ``collections`` is computed with Dask's public API
    (``collection.blocks[...]``, all of a batch's in one ``compute``, so what they share runs once). Nothing here
    reads Dask's graph internals.

    Parameters
    ----------
    collections : sequence of dask collections
        Whose blocks (or whose blocks' dependents, via ``tasks``) are computed.
    tasks : callable, optional
        ``tasks(key)`` -> a task tuple ``(function, *arguments)``, arguments that are keys of the collections (also
        inside lists), for keys the caller defines itself (e.g. one write task per block), or None for every other
        key. Such tasks are made per batch, so the caller never builds all of them.
    """

    def __init__(self, collections: Sequence[da.Array], tasks: Callable[[Key], Task | None] | None = None):
        self.collections: dict[str, da.Array] = {collection.name: collection for collection in collections}
        self.tasks = tasks

    def _is_key(self, value: object) -> bool:
        if not (isinstance(value, tuple) and value and isinstance(value[0], str)):
            return False
        if not all(isinstance(i, int) for i in value[1:]):
            return False
        layer = layer_named(value[0])
        return (layer is not None and value in layer) or value[0] in self.collections

    def _argument(self, value: Any, memo: dict[Key, _Call | _Block]) -> Any:
        if self._is_key(value):
            return self.node(value, memo)
        if isinstance(value, list):
            return [self._argument(v, memo) for v in value]
        if isinstance(value, tuple):
            return tuple(self._argument(v, memo) for v in value)
        return value

    def node(self, key: Key, memo: dict[Key, _Call | _Block], root: bool = False) -> _Call | _Block:
        """The node computing ``key`` (shared through ``memo`` within a batch)."""
        if key in memo:
            return memo[key]
        task = self.tasks(key) if self.tasks is not None else None
        inline = False
        if task is None:
            layer = layer_named(key[0]) if isinstance(key, tuple) and key else None
            if layer is not None and key in layer:
                task, inline = layer[key], layer.inline and not root
                for name, array in layer.inputs.items():  # keys of arrays that are not ours: blocks of these
                    self.collections.setdefault(name, array)
            elif isinstance(key, tuple) and key and key[0] in self.collections:
                node: _Call | _Block = _Block(self.collections[key[0]], tuple(key[1:]))
                memo[key] = node
                return node
            else:
                raise KeyError(f"{key!r} is not a key of the blocks being written")
        fn, *args = task
        node = _Call(key, fn, tuple(self._argument(a, memo) for a in args), inline)
        memo[key] = node
        return node

    def __call__(self, keys: Sequence[Key]) -> Batch:
        memo: dict[Key, _Call | _Block] = {}
        return Batch(list(keys), [self.node(key, memo, root=True) for key in keys])


class Batch:
    """The nodes of a batch's keys, submitted to a distributed client or computed in this process."""

    def __init__(self, keys: list[Key], roots: list[_Call | _Block]):
        self.keys, self.roots = keys, roots

    def has_blocks(self) -> bool:
        """Whether the batch takes blocks of a Dask collection that is not ours (:meth:`submit_as_one` cannot)."""
        return bool(self._blocks())

    def _blocks(self) -> list[_Block]:
        found: dict[int, _Block] = {}

        def walk(value: object) -> None:
            if isinstance(value, _Block):
                found.setdefault(id(value), value)
            elif isinstance(value, _Call):
                for a in value.args:
                    walk(a)
            elif isinstance(value, (list, tuple)):
                for v in value:
                    walk(v)

        for root in self.roots:
            walk(root)
        return list(found.values())

    def submit(self, client: Client, worker: str | None = None) -> list[Future[Any]]:
        """Futures of the batch's keys: each non-inline call one task, its inputs' futures as arguments (the
        scheduler runs it where they are); the other collections' blocks in one ``client.compute``.

        ``worker``: the address of the worker every task of the batch should run on (where the reads of its reading
        tasks, :meth:`prefetchable`, were started ahead; left to the scheduler, a task that takes a read's result
        may run on an idle worker, which then fetches that result: a 5490² x 36-date series moved 4.3 GB between
        its 2 workers so). Another worker runs them if that one leaves."""
        blocks = self._blocks()
        done: dict[int, Any] = {}
        if blocks:
            futures = client.compute([b.collection.blocks[b.index] for b in blocks])
            done.update({id(b): f for b, f in zip(blocks, futures)})

        def encode(value: Any) -> Any:
            if isinstance(value, (_Call, _Block)) and id(value) in done:
                return done[id(value)]
            if isinstance(value, _Call):
                if value.inline:
                    return [_INLINE, value.fn, *(encode(a) for a in value.args)]
                # the block's own key: the scheduler's view names what runs, and a block two batches ask for at
                # once is computed once
                args = tuple(encode(a) for a in value.args)
                if worker is None:
                    future = client.submit(_call, value.fn, *args, key=value.key)
                else:
                    # each task a generation of its own (fifo_timeout=0): a worker runs its tasks in the order
                    # they were sent (a task's reads were started in that order), and a task that takes a read's
                    # result before the next read; within one generation it would go by key
                    future = client.submit(_call, value.fn, *args, key=value.key, workers=[worker],
                                           allow_other_workers=True, fifo_timeout=0)
                done[id(value)] = future
                return future
            if isinstance(value, list):
                return [encode(v) for v in value]
            if isinstance(value, tuple):
                return tuple(encode(v) for v in value)
            return value

        try:
            return [encode(root) for root in self.roots]
        finally:
            # encode is a recursive closure (a reference cycle): without this the inputs' futures, and so their
            # results on the workers, would live until the garbage collector runs
            done.clear()

    def submit_as_one(self, client: Client, worker: str | None = None) -> Future[Any] | None:
        """One task computing every key of the batch on one worker, each shared call once (a chunk's
        read-and-reduce, then the writes of its variables), in order; its value is the list of the keys' values.
        None when the batch has blocks of another collection (submit those with :meth:`submit`).

        A chunk's result then lives only inside that task: it never waits on a worker for write tasks the scheduler
        has not sent yet while the thread that made it starts the next chunk.

        ``worker``: the address of the worker it should run on (where its reads were started ahead); another one
        runs it if that worker leaves."""
        if self._blocks():
            return None
        calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        position: dict[int, int] = {}

        def encode(value: Any) -> Any:
            if isinstance(value, _Call):
                if value.inline:
                    return [_INLINE, value.fn, *(encode(a) for a in value.args)]
                if id(value) not in position:
                    args = tuple(encode(a) for a in value.args)
                    position[id(value)] = len(calls)
                    calls.append((value.fn, args))
                return _Result(position[id(value)])
            if isinstance(value, list):
                return [encode(v) for v in value]
            if isinstance(value, tuple):
                return tuple(encode(v) for v in value)
            return value

        roots = [encode(root) for root in self.roots]
        first = self.keys[0]
        key = (f"rasterflow-unit-{first[0]}", *first[1:]) if isinstance(first, tuple) else f"rasterflow-unit-{first}"
        if worker is not None:
            future: Future[Any] = client.submit(run_calls, calls, roots, key=key, workers=[worker],
                                                allow_other_workers=True)
        else:
            future = client.submit(run_calls, calls, roots, key=key)
        return future

    def prefetch(self) -> list[Callable[[], None]]:
        """Start the reads of the batch's tasks that can start them before they run (:func:`rasterflow.layers.prefetch`:
        a chunk's read-and-reduce), for tasks that will run in this process; the callables that drop what their
        tasks did not take over."""
        drops: list[Callable[[], None]] = []
        for function, args in self.prefetchable():
            try:
                drop = prefetch(function, args)
            except Exception:  # noqa: BLE001 - only a head start: the task plans its reads and meets it
                drop = None
            if drop is not None:
                drops.append(drop)
        return drops

    def prefetchable(self) -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
        """The batch's tasks ``(function, args)`` whose reads can start before they run
        (:func:`rasterflow.layers.starts_reads`), their arguments plain values (no other task's result)."""
        found: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        seen: set[int] = set()

        def plain(value: object) -> bool:
            if isinstance(value, (_Call, _Block)):
                return False
            if isinstance(value, (list, tuple)):
                return all(plain(v) for v in value)
            return True

        def walk(value: object) -> None:
            if isinstance(value, _Call) and id(value) not in seen:
                seen.add(id(value))
                for a in value.args:
                    walk(a)
                if plain(value.args) and starts_reads(value.fn, value.args):
                    found.append((value.fn, value.args))
            elif isinstance(value, (list, tuple)):
                for v in value:
                    walk(v)

        for root in self.roots:
            walk(root)
        return found

    def compute(self) -> list[Any]:
        """The values of the batch's keys, computed in this thread (the other collections' blocks in one
        synchronous ``dask.compute``)."""
        from dask.base import compute

        blocks = self._blocks()
        done: dict[int, Any] = {}
        if blocks:
            values = compute(*(b.collection.blocks[b.index] for b in blocks), scheduler="synchronous")
            done.update({id(b): v for b, v in zip(blocks, values)})

        def run(value: Any) -> Any:
            if isinstance(value, _Block):
                return done[id(value)]
            if isinstance(value, _Call):
                if id(value) not in done:
                    done[id(value)] = value.fn(*(run(a) for a in value.args))
                return done[id(value)]
            if isinstance(value, list):
                return [run(v) for v in value]
            if isinstance(value, tuple):
                return tuple(run(v) for v in value)
            return value

        try:
            return [run(root) for root in self.roots]
        finally:
            done.clear()  # the inputs' arrays go now, not when the garbage collector breaks run's reference cycle


# --------------------------------------------------------------------------------------------------------------------
# the loop


def run_units(
    units: Iterable[Sequence[Key]],
    build: Callable[[Sequence[Key]], Batch],
    *,
    total: int,
    client: Client | None = None,
    max_in_flight: int | None = None,
    on_result: Callable[[Key, Any], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    weight: Callable[[Key], int] | None = None,
    min_units: int | None = None,
    one_task_per_unit: bool = False,
    place_reads: bool = False,
) -> int:
    """Compute every key of ``units``, a bounded batch at a time; returns the number of blocks computed.

    Parameters
    ----------
    units : iterable of sequences of keys
        Consumed lazily, in order. The keys of one unit are always submitted together (they may share tasks).
    build : callable
        ``build(keys)`` -> the tasks of those keys only (a :class:`BlockTasks`).
    total : int
        The number of blocks in ``units``, for ``progress``.
    client : distributed.Client, optional
        Where to compute. None: a pool of :func:`local_threads` threads, each computing a unit's tasks.
    max_in_flight : int, optional
        Cap on blocks (keys, each counted at its ``weight``) submitted and not yet finished (default
        :func:`in_flight_cap`). A unit larger than the cap is submitted alone once nothing else is in flight.
    on_result : callable, optional
        ``on_result(key, value)`` for each finished key, in this thread; without it results are not fetched (the
        tasks have side effects, such as writing their block).
    progress : callable, optional
        ``progress(done, total)`` after each finished key.
    weight : callable, optional
        ``weight(key)``: the blocks one key counts for in the cap, ``progress`` and the result (default 1; e.g. the
        chunks of a Zarr shard written by one task, whose results are all held until it runs).
    min_units : int, optional
        Units allowed in flight whatever their blocks (default 1: a unit larger than the cap goes alone). The Zarr
        writer passes the cluster's worker threads + :data:`QUEUED_UNITS` on the fused and series paths, the
        threads on the tree path, so that every thread has a unit to run even when one unit's blocks fill the cap.
    one_task_per_unit : bool
        On a distributed client, compute each unit's tasks as one task (:meth:`Batch.submit_as_one`): its shared
        upstream (a chunk's read-and-reduce) and its keys (the writes of the chunk's variables) run one after the
        other on one worker thread. The Zarr writer asks for it on the fused path.
    place_reads : bool
        On worker processes, send each unit's tasks to a worker the writer picks, the reads of those that read
        remote files (:meth:`Batch.prefetchable`) started there first, as ``one_task_per_unit`` does for its one
        task (see :func:`places_units`), where the cap or ``min_units`` lets every worker have a unit in flight (a
        unit's blocks times the workers within ``max_in_flight``, or ``min_units`` at least the workers; else the
        scheduler places the tasks). The Zarr writer asks for it on the tree path without shards (a chunk's band
        tasks per time chunk, their partials, its writes).

    Raises
    ------
    Exception
        The first failure of a task (or of ``on_result``), after every key still in flight was cancelled.
    """
    cap = max(1, int(max_in_flight or in_flight_cap(client)))
    floor = max(1, int(min_units or 1))
    count = _Counter(total, progress, weight)
    size = (lambda key: 1) if weight is None else weight
    if client is not None:
        _run_distributed(UnitFeed(iter(units), size, floor), build, client, cap, on_result, count, one_task_per_unit,
                         place_reads)
    else:
        _run_local(UnitFeed(iter(units), size, floor), build, cap, on_result, count)
    return count.done


class _Counter:
    def __init__(self, total: int, progress: Callable[[int, int], None] | None, weight: Callable[[Key], int] | None):
        self.total, self.progress, self.weight = total, progress, weight
        self.done = 0

    def __call__(self, key: Key) -> None:
        self.done += 1 if self.weight is None else self.weight(key)
        if self.progress is not None:
            self.progress(self.done, self.total)


class UnitFeed:
    """The units not yet submitted, taken while they fit in the cap (counted in blocks: ``size(key)`` per key) or
    while fewer than ``min_units`` units are in flight."""

    def __init__(self, units: Iterator[Sequence[Key]], size: Callable[[Key], int], min_units: int = 1):
        self.units = units
        self.size = size
        self.min_units = min_units
        self.max_units: int | None = None
        """Units in flight at most, whatever the cap (None: the cap alone)."""
        self.head: list[Key] | None = self._next()

    def _next(self) -> list[Key] | None:
        for unit in self.units:
            keys = list(unit)
            if keys:
                return keys
        return None

    def take_one(self) -> list[Key] | None:
        """The next unit (None when all are taken)."""
        unit, self.head = self.head, self._next() if self.head is not None else None
        return unit

    def blocks(self, keys: Iterable[Key]) -> int:
        return sum(self.size(key) for key in keys)

    def take(self, in_flight: int, cap: int, units: int = 0) -> list[list[Key]]:
        """Units while ``in_flight`` blocks plus theirs fit in ``cap``, or while fewer than :attr:`min_units` are in
        flight (``units``: those in flight now)."""
        taken: list[list[Key]] = []
        while self.head is not None and (units < self.min_units or in_flight + self.blocks(self.head) <= cap) \
                and (self.max_units is None or units < self.max_units):
            taken.append(self.head)
            in_flight += self.blocks(self.head)
            units += 1
            self.head = self._next()
        return taken

    def wants(self, in_flight: int, cap: int, units: int) -> bool:
        """Submit more: half the cap is free, or fewer than :attr:`min_units` units are in flight."""
        if self.max_units is not None and units >= self.max_units:
            return False
        return self.head is not None and (in_flight <= cap // 2 or units < self.min_units)


def _run_distributed(feed: UnitFeed, build: Callable[[Sequence[Key]], Batch], client: Client, cap: int,
                     on_result: Callable[[Key, Any], None] | None, count: _Counter,
                     one_task_per_unit: bool = False, place_reads: bool = False) -> None:
    from distributed import as_completed

    in_flight: dict[Future[Any], list[Key]] = {}  # future -> its key, or every key of a unit's one task
    whole: set[Future[Any]] = set()  # futures of a unit's one task (their value: the list of the keys' values)
    unit_of: dict[Key, int] = {}  # key in flight -> its unit's number
    left: dict[int, int] = {}  # unit in flight -> its keys not finished
    # bound to this client's loop: without it as_completed looks for a *default* client
    completed = as_completed(loop=client.loop, raise_errors=False)
    numbers = iter(range(1 << 62))
    # workers in this process (the one-process layout) run what this process starts ahead
    workers = client.scheduler_info().get("workers") or {}
    ahead = bool(workers) and in_this_process(workers)
    drops: dict[int, list[Callable[[], None]]] = {}  # unit in flight -> what drops its reads started ahead
    # worker processes: a unit sent as one task goes to a worker the writer picks, its reads started there first
    # (only when the chunks' reads can start ahead: remote files the concurrent reader reads; asked of the first)
    # placed apart (place_reads), a unit goes whole to one worker: only where the cap or the floor lets every worker
    # have one in flight (else one unit at a time would all go to the same worker)
    placing = one_task_per_unit or (place_reads and feed.head is not None
                                    and (feed.blocks(feed.head) * max(1, len(workers)) <= cap
                                         or feed.min_units >= len(workers)))
    placement = Placement(client, feed, whole_units=one_task_per_unit) if placing and feed.head is not None \
        and places_units(client, build, feed.head) else None

    def blocks_in_flight() -> int:
        return feed.blocks(key for keys in in_flight.values() for key in keys)

    def submit() -> None:
        units = feed.take(blocks_in_flight(), cap, len(left))
        batch = [key for unit in units for key in unit]
        if not batch:
            return
        for unit in units:
            number = next(numbers)
            left[number] = len(unit)
            unit_of.update((key, number) for key in unit)
        futures: list[Future[Any]] = []
        rest = batch
        def start_reads(keys: Sequence[Key], built: Batch) -> None:
            # before the tasks are submitted: a task that starts first would not find its reads, and they would
            # be fetched twice
            if ahead:
                started = built.prefetch()
                if started:
                    drops.setdefault(unit_of[keys[-1]], []).extend(started)

        if one_task_per_unit:
            rest = []
            for unit in units:
                built = build(unit)
                if built.has_blocks():
                    rest.extend(unit)
                    continue
                start_reads(unit, built)
                future = built.submit_as_one(client, placement.place(unit_of[unit[-1]], built)
                                             if placement is not None else None)
                assert future is not None  # no blocks of another collection
                in_flight[future] = list(unit)
                whole.add(future)
                futures.append(future)
        elif placement is not None:
            rest = []
            for unit in units:  # each unit's tasks to the worker its reads were started on
                built = build(unit)
                worker = None if built.has_blocks() else placement.place(unit_of[unit[-1]], built)
                for key, future in zip(unit, built.submit(client, worker)):
                    in_flight[future] = [key]
                    futures.append(future)
        if rest:
            built = build(rest)
            start_reads(rest, built)
            for key, future in zip(rest, built.submit(client)):
                in_flight[future] = [key]
                futures.append(future)
        completed.update(futures)

    try:
        submit()
        while in_flight:
            finished = [next(completed)]
            while completed.has_ready():
                finished.append(next(completed))
            for future in finished:
                keys = in_flight.pop(future)
                # raises a failed block's error
                value = settled(future, keys[0], wanted=on_result is not None)
                values = value if future in whole else [value]
                whole.discard(future)
                for index, key in enumerate(keys):
                    if on_result is not None:
                        on_result(key, values[index])  # with on_result, settled gave the value
                    count(key)
                    number = unit_of.pop(key)
                    left[number] -= 1
                    if not left[number]:
                        del left[number]
                        if placement is not None:
                            placement.finished(number)
                        for drop in drops.pop(number, ()):
                            drop()  # reads its task did not take over (it failed before them)
                future.release()  # the scheduler forgets the block's tasks
            if feed.wants(blocks_in_flight(), cap, len(left)):
                submit()
    finally:
        if in_flight:
            client.cancel(list(in_flight))
            in_flight.clear()
        for started in drops.values():
            for drop in started:
                drop()
        if placement is not None:
            placement.close()


def settled(future: Future[Any], key: Key, wanted: bool = True) -> Any:
    """The value of a future that ``as_completed`` gave back (None when not ``wanted`` and it finished).

    Its status is read later than it was given back: a worker that dies after finishing the block loses its
    result (status ``lost``) and the scheduler computes it again elsewhere; ``result()`` waits for that. A block
    that failed raises its task's exception, one cancelled from outside (another client, a scheduler restart) a
    ``RuntimeError``.
    """
    if future.status == "finished" and not wanted:
        return None
    try:
        return future.result()
    except concurrent.futures.CancelledError as error:
        raise RuntimeError(f"block {key!r} was cancelled from outside this run (another client or a scheduler "
                           "restart); rerunning the same job resumes from the blocks already written") from error


def _run_local(feed: UnitFeed, build: Callable[[Sequence[Key]], Batch], cap: int,
               on_result: Callable[[Key, Any], None] | None, count: _Counter) -> None:
    if local_threads() == 1:  # the synchronous scheduler: one unit after the other, in this thread
        while (unit := feed.take_one()) is not None:
            for key, value in zip(unit, build(unit).compute()):
                if on_result is not None:
                    on_result(key, value)
                count(key)
        return
    in_flight: dict[concurrent.futures.Future[list[Any]], list[Key]] = {}  # one pool job per unit
    executor = concurrent.futures.ThreadPoolExecutor(local_threads(), thread_name_prefix="rasterflow-write")

    drops: dict[concurrent.futures.Future[list[Any]], list[Callable[[], None]]] = {}

    def submit() -> None:
        for unit in feed.take(sum(feed.blocks(u) for u in in_flight.values()), cap, len(in_flight)):
            built = build(unit)
            started = built.prefetch()  # the pool's threads are this process's; before the task can start
            job = executor.submit(built.compute)
            in_flight[job] = unit
            drops[job] = started

    try:
        submit()
        while in_flight:
            finished, _ = concurrent.futures.wait(list(in_flight), return_when=concurrent.futures.FIRST_COMPLETED)
            for job in finished:
                unit = in_flight.pop(job)
                for drop in drops.pop(job, ()):
                    drop()
                values = job.result()  # raises the first failure
                for key, value in zip(unit, values):
                    if on_result is not None:
                        on_result(key, value)
                    count(key)
            if feed.wants(sum(feed.blocks(u) for u in in_flight.values()), cap, len(in_flight)):
                submit()
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
        for started in drops.values():
            for drop in started:
                drop()

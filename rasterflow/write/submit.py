"""Bounded submission: compute the blocks of a large job a batch at a time, with a cap on blocks in flight.

Both writers use :func:`run_units`. A job of 100k-1M output blocks is never submitted at once: the client holds
futures, and the scheduler tasks, only for the blocks in flight (at most ``max_in_flight`` of them, by default a few
per worker thread, :func:`in_flight_cap`); a new batch is submitted whenever half of that has finished, and the
futures of finished blocks are released at once, so the scheduler forgets their tasks.

The graph of a batch is built from only that batch's blocks (:class:`BlockGraph`): starting from the batch's keys,
each task is looked up in its own layer of the collections' high-level graphs (a lookup in a mapping layer: a dict,
or a :class:`~rasterflow.layers.TaskLayer` that makes the task when asked, as ``graph.build_dataset``'s layers do, so the client never
holds the job's tasks; a :meth:`~dask.highlevelgraph.Layer.cull` to the requested blocks in a blockwise one, which is
never materialised whole), its dependencies followed the same way, and the small result fused by Dask's array
optimisation (the collection protocol's ``__dask_optimize__``). Building a batch therefore costs O(its tasks),
whatever the size of the job: ``HighLevelGraph.cull`` would copy every task-spec layer once per batch (O(job) each
time), and optimising the whole graph first would materialise every layer in the client.

Blocks are grouped into *units* by the writer: the blocks of a unit share upstream tasks (e.g. every band and
period of one spatial chunk comes out of one read-and-reduce task) and are always submitted together, so a shared
task is computed once. Without a distributed client (Dask's threaded or synchronous scheduler) the same loop runs
each unit's graph with ``dask.get`` in a pool of threads, the same cap applying.

The first failure cancels every block in flight and is raised; blocks already finished stay finished (the Zarr
writer's done-markers let the next run resume from them).
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

__all__ = ["BlockGraph", "run_units", "in_flight_cap", "default_client", "cluster_threads", "settled", "IN_FLIGHT_PER_THREAD"]

#: Default cap on blocks in flight, per worker thread of the cluster: enough that no thread waits for the next
#: submission (a batch is submitted when half the cap has finished), small enough that the scheduler holds O(threads).
IN_FLIGHT_PER_THREAD = 4

Key = Any
Task = Any


# --------------------------------------------------------------------------------------------------------------------
# where to compute


def default_client(client: Any) -> Any:
    """``client``, else the global distributed client when Dask's scheduler setting allows one, else None."""
    if client is not None:
        return client
    import dask

    if dask.config.get("scheduler", None) not in (None, "dask.distributed", "distributed"):
        return None
    try:
        from distributed import default_client as _global

        return _global()
    except (ImportError, ValueError):
        return None


def local_threads() -> int:
    """Threads of the local (no distributed client) path: 1 for the synchronous scheduler, else Dask's
    ``num_workers`` or the CPU count."""
    import dask

    if dask.config.get("scheduler", None) in ("sync", "synchronous", "single-threaded"):
        return 1
    return int(dask.config.get("num_workers", None) or os.cpu_count() or 1)


def cluster_threads(client: Any) -> int:
    """Worker threads of the cluster behind ``client`` (from the scheduler's worker info), or of the local path."""
    if client is None:
        return local_threads()
    return max(1, sum(int(n) for n in client.nthreads().values()))


def in_flight_cap(client: Any, per_thread: int = IN_FLIGHT_PER_THREAD) -> int:
    """The default cap on blocks in flight: ``per_thread`` × the cluster's worker threads (at least 2)."""
    return max(2, per_thread * cluster_threads(client))


# --------------------------------------------------------------------------------------------------------------------
# the graph of a batch, from only its blocks


class _KeyIndex(Mapping):
    """Read-only view of the keys of high-level graph layers, looked up without materialising any layer.

    ``key in index`` is what :func:`dask.core.get_dependencies` asks of each argument of a task; the answer comes
    from the key's name (the layer of that name) or, for a materialised layer holding keys of other names (e.g. the
    original array of ``from_array``), a dict lookup in the materialised layers.
    """

    def __init__(self, layers: Mapping[str, Any]):
        self.layers = dict(layers)
        self.materialized = [layer for layer in self.layers.values() if layer.is_materialized()]

    def layer_of(self, key: Key) -> Any:
        name = key[0] if isinstance(key, tuple) and key and isinstance(key[0], str) else key
        if isinstance(name, str):
            layer = self.layers.get(name)
            if layer is not None and (not layer.is_materialized() or key in layer):
                return layer
        if isinstance(key, (str, tuple)):
            for layer in self.materialized:
                try:
                    if key in layer:
                        return layer
                except TypeError:  # an unhashable argument: not a key
                    return None
        return None

    def __contains__(self, key: object) -> bool:
        return self.layer_of(key) is not None

    def __getitem__(self, key: Key) -> Task:
        layer = self.layer_of(key)
        if layer is None:
            raise KeyError(key)
        return layer[key]

    def __iter__(self) -> Iterator[Key]:  # pragma: no cover - the whole graph; never needed here
        for layer in self.layers.values():
            yield from layer

    def __len__(self) -> int:  # pragma: no cover - see __iter__
        return sum(len(layer) for layer in self.layers.values())


class BlockGraph:
    """Builds the graph of a few output keys from the collections' graphs, touching only the tasks they need.

    Parameters
    ----------
    collections : sequence of dask collections
        Whose blocks (or whose blocks' dependents, via ``tasks``) are computed.
    tasks : callable, optional
        ``tasks(key)`` -> a task (Dask's graph specification: a tuple with a callable first, arguments that are
        keys of the collections) for keys the caller defines itself (e.g. one write task per block), or None for
        every other key. Such tasks are made per batch, so the caller never builds a layer of all of them.
    optimize : bool
        Fuse each batch's graph with Dask's array optimisation (linear chains become one task).
    """

    def __init__(self, collections: Sequence[Any], tasks: Callable[[Key], Task | None] | None = None, *,
                 optimize: bool = True):
        from dask.highlevelgraph import HighLevelGraph

        graphs = []
        for collection in collections:
            graph = collection.__dask_graph__()
            if not isinstance(graph, HighLevelGraph):
                graph = HighLevelGraph.from_collections(str(id(graph)), dict(graph), dependencies=())
            graphs.append(graph)
        merged = HighLevelGraph.merge(*graphs) if graphs else HighLevelGraph({}, {})
        self.index = _KeyIndex(merged.layers)
        self.tasks = tasks
        self.optimize = optimize

    def __call__(self, keys: Sequence[Key]) -> dict:
        """The graph (a dict) that computes ``keys``: their tasks and every task they depend on, nothing else."""
        from dask.core import get_dependencies

        graph: dict = {}
        frontier = list(dict.fromkeys(keys))
        while frontier:
            lazy: dict[int, tuple[Any, set]] = {}
            following: list = []
            for key in frontier:
                if key in graph:
                    continue
                task = self.tasks(key) if self.tasks is not None else None
                if task is None:
                    layer = self.index.layer_of(key)
                    if layer is None:
                        raise KeyError(f"{key!r} is not a key of the graph being written")
                    if not layer.is_materialized():
                        lazy.setdefault(id(layer), (layer, set()))[1].add(key)
                        continue
                    task = layer[key]
                graph[key] = task
                following.extend(get_dependencies(self.index, task=task))
            for layer, wanted in lazy.values():
                # a blockwise layer: only the wanted blocks are generated, with their dependencies
                culled, dependencies = layer.cull(wanted, self.index)
                tasks = dict(culled)
                for key in wanted:
                    graph[key] = tasks[key]
                    following.extend(dependencies.get(key, ()))
            frontier = [k for k in dict.fromkeys(following) if k not in graph]
        if self.optimize:
            import dask.array as da

            graph = dict(da.Array.__dask_optimize__(graph, list(keys)))
        return graph


# --------------------------------------------------------------------------------------------------------------------
# the loop


def run_units(
    units: Iterable[Sequence[Key]],
    build: Callable[[Sequence[Key]], dict],
    *,
    total: int,
    client: Any = None,
    max_in_flight: int | None = None,
    on_result: Callable[[Key, Any], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
    weight: Callable[[Key], int] | None = None,
) -> int:
    """Compute every key of ``units``, a bounded batch at a time; returns the number of blocks computed.

    Parameters
    ----------
    units : iterable of sequences of keys
        Consumed lazily, in order. The keys of one unit are always submitted together (they may share tasks).
    build : callable
        ``build(keys)`` -> the graph of those keys only (a :class:`BlockGraph`).
    total : int
        The number of blocks in ``units``, for ``progress``.
    client : distributed.Client, optional
        Where to compute. None: a pool of :func:`local_threads` threads, each running a unit's graph with
        ``dask.get``.
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

    Raises
    ------
    Exception
        The first failure of a task (or of ``on_result``), after every key still in flight was cancelled.
    """
    cap = max(1, int(max_in_flight or in_flight_cap(client)))
    count = _Counter(total, progress, weight)
    size = (lambda key: 1) if weight is None else weight
    if client is not None:
        _run_distributed(_Feed(iter(units), size), build, client, cap, on_result, count)
    else:
        _run_local(_Feed(iter(units), size), build, cap, on_result, count)
    return count.done


class _Counter:
    def __init__(self, total: int, progress: Callable[[int, int], None] | None, weight: Callable[[Key], int] | None):
        self.total, self.progress, self.weight = total, progress, weight
        self.done = 0

    def __call__(self, key: Key) -> None:
        self.done += 1 if self.weight is None else self.weight(key)
        if self.progress is not None:
            self.progress(self.done, self.total)


class _Feed:
    """The units not yet submitted, taken while they fit in the cap (counted in blocks: ``size(key)`` per key)."""

    def __init__(self, units: Iterator[Sequence[Key]], size: Callable[[Key], int]):
        self.units = units
        self.size = size
        self.head: list | None = self._next()

    def _next(self) -> list | None:
        for unit in self.units:
            keys = list(unit)
            if keys:
                return keys
        return None

    def take_one(self) -> list | None:
        """The next unit (None when all are taken)."""
        unit, self.head = self.head, self._next() if self.head is not None else None
        return unit

    def blocks(self, keys: Iterable[Key]) -> int:
        return sum(self.size(key) for key in keys)

    def take(self, in_flight: int, cap: int) -> list[list]:
        """Units while ``in_flight`` blocks plus theirs fit in ``cap`` (at least one when nothing is in flight)."""
        taken: list[list] = []
        while self.head is not None and (in_flight == 0 or in_flight + self.blocks(self.head) <= cap):
            taken.append(self.head)
            in_flight += self.blocks(self.head)
            self.head = self._next()
        return taken


def _run_distributed(feed: _Feed, build: Callable[[Sequence[Key]], dict], client: Any, cap: int,
                     on_result: Callable[[Key, Any], None] | None, count: _Counter) -> None:
    from distributed import as_completed

    in_flight: dict[Any, Key] = {}  # future -> key
    # bound to this client's loop: without it as_completed looks for a *default* client
    completed = as_completed(loop=client.loop, raise_errors=False)

    def submit() -> None:
        batch = [key for unit in feed.take(feed.blocks(in_flight.values()), cap) for key in unit]
        if not batch:
            return
        futures = client.get(build(batch), batch, sync=False)
        for key, future in zip(batch, futures):
            in_flight[future] = key
        completed.update(futures)

    try:
        submit()
        while in_flight:
            finished = [next(completed)]
            while completed.has_ready():
                finished.append(next(completed))
            for future in finished:
                key = in_flight.pop(future)
                value = settled(future, key, wanted=on_result is not None)  # raises a failed block's error
                if on_result is not None:
                    on_result(key, value)
                future.release()  # the scheduler forgets the block's tasks
                count(key)
            if feed.blocks(in_flight.values()) <= cap // 2:
                submit()
    finally:
        if in_flight:
            client.cancel(list(in_flight))
            in_flight.clear()


def settled(future: Any, key: Key, wanted: bool = True) -> Any:
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


def _run_local(feed: _Feed, build: Callable[[Sequence[Key]], dict], cap: int,
               on_result: Callable[[Key, Any], None] | None, count: _Counter) -> None:
    import dask

    if local_threads() == 1:  # the synchronous scheduler: one unit after the other, in this thread
        while (unit := feed.take_one()) is not None:
            for key, value in zip(unit, dask.get(build(unit), unit)):
                if on_result is not None:
                    on_result(key, value)
                count(key)
        return
    in_flight: dict[concurrent.futures.Future, list] = {}  # one pool job per unit
    executor = concurrent.futures.ThreadPoolExecutor(local_threads(), thread_name_prefix="rasterflow-write")

    def submit() -> None:
        for unit in feed.take(sum(feed.blocks(u) for u in in_flight.values()), cap):
            in_flight[executor.submit(dask.get, build(unit), unit)] = unit

    try:
        submit()
        while in_flight:
            finished, _ = concurrent.futures.wait(list(in_flight), return_when=concurrent.futures.FIRST_COMPLETED)
            for job in finished:
                unit = in_flight.pop(job)
                values = job.result()  # raises the first failure
                for key, value in zip(unit, values):
                    if on_result is not None:
                        on_result(key, value)
                    count(key)
            if sum(feed.blocks(u) for u in in_flight.values()) <= cap // 2:
                submit()
    finally:
        executor.shutdown(wait=True, cancel_futures=True)

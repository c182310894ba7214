"""Bounded submission (issue 13, step 4): client and scheduler memory of a Zarr write of many tiny blocks,
the writer before (HEAD's ``rasterflow/write/zarr.py``: every block persisted at once) and after (``write.submit``:
a capped number of blocks in flight, each batch's graph built from its blocks), side by side in one run.

The job: one variable of ``--blocks`` chunks of 16² float32, each made by its own task in a materialised layer (as
``graph.build_dataset`` makes them), written with ``write_zarr``. Each variant gets a fresh cluster started outside
this process (``dask scheduler`` + ``dask worker --nworkers 2 --nthreads 2``), so the scheduler's memory is its own
process's; RSS of this process (the client) and of the scheduler are sampled every 20 ms (psutil). Reported: wall
time, peak RSS above the baseline taken after the dataset is built (the client) or after the workers connected (the
scheduler), the scheduler's most tasks at once (a scheduler plugin), and the values checked against NumPy.

    .venv/bin/python benchmarks/bounded_submit.py --blocks 20000

``--graph``: the client's graph before the first block is written (issue 13, step 4, "build the graph lazily per
batch"), no cluster: ``tracemalloc`` around ``graph.build_dataset`` of ``benchmarks/plan_scale.py``'s synthetic job
(10 tiles × ``--dates``, a masked NDVI median by solar day) at chunk sizes giving ~2,500 / 10,000 / 40,000 chunks,
and around the first batch's graph (``write.submit.BlockTasks``, 16 blocks). *before*: the layers as the former
``build_dataset`` held them (every read task made and stored in a dict, each band cut out by Dask's slicing and
rechunking); *after*: the lazy layers (``layers.TaskLayer``: a task is made when a batch asks for it).

    .venv/bin/python benchmarks/bounded_submit.py --graph --dates 73
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from distributed.diagnostics.plugin import SchedulerPlugin

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DASK = str(Path(sys.executable).with_name("dask"))
EDGE = 16


class Sampler:
    """Peak RSS of some processes, sampled every ``interval`` seconds from a thread."""

    def __init__(self, pids: dict[str, int], interval: float = 0.02):
        import psutil

        self.processes = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.peak = {name: 0 for name in pids}
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> dict[str, int]:
        return {name: p.memory_info().rss for name, p in self.processes.items()}

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, value in self.rss().items():
                self.peak[name] = max(self.peak[name], value)
            time.sleep(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _chunk(i: int, j: int) -> np.ndarray:
    rows, cols = np.mgrid[i * EDGE:(i + 1) * EDGE, j * EDGE:(j + 1) * EDGE]
    return (rows * 1000 + cols).astype(np.float32)


def dataset(ny: int, nx: int):
    """A lazy 2-D band of ny × nx tasks in one materialised layer, like graph.build_dataset's."""
    import dask.array as da
    import rioxarray  # noqa: F401
    import xarray as xr
    from affine import Affine
    from dask.highlevelgraph import HighLevelGraph

    name = f"bench-chunk-{ny}-{nx}"
    layer = {(name, i, j): (_chunk, i, j) for i in range(ny) for j in range(nx)}
    graph = HighLevelGraph.from_collections(name, layer, dependencies=())
    band = da.Array(graph, name, ((EDGE,) * ny, (EDGE,) * nx), meta=np.empty((0, 0), dtype=np.float32))
    coords = {"y": 5_000_000 - 10.0 * (np.arange(ny * EDGE) + 0.5), "x": 400_000 + 10.0 * (np.arange(nx * EDGE) + 0.5)}
    ds = xr.Dataset({"v": (("y", "x"), band)}, coords=coords)
    return ds.rio.write_crs("EPSG:32633").rio.write_transform(Affine(10.0, 0, 400_000, 0, -10.0, 5_000_000))


def before_module():
    """HEAD's rasterflow/write/zarr.py, imported from a temporary copy (pickled by value for the workers)."""
    import cloudpickle

    text = subprocess.run(["git", "-C", str(REPO), "show", "HEAD:rasterflow/write/zarr.py"], check=True,
                          capture_output=True).stdout
    directory = Path(tempfile.mkdtemp(prefix="rasterflow-bench-before-"))
    (directory / "rasterflow_zarr_before.py").write_bytes(text)
    spec = importlib.util.spec_from_file_location("rasterflow_zarr_before", directory / "rasterflow_zarr_before.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


class PeakTasks(SchedulerPlugin):
    """Scheduler plugin: the most tasks the scheduler held at once (checked at every transition)."""

    name = "bench-peak-tasks"

    def __init__(self) -> None:
        self.peak = 0
        self.scheduler = None

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler

    def transition(self, *args, **kwargs) -> None:
        self.peak = max(self.peak, len(self.scheduler.tasks))


def _peak(dask_scheduler=None) -> int:
    return dask_scheduler.plugins[PeakTasks.name].peak


def cluster(workdir: Path):
    """A scheduler and one ``dask worker`` process group (2 processes × 2 threads), started outside this process."""
    scheduler_file = workdir / "scheduler.json"
    env = dict(os.environ)
    scheduler = subprocess.Popen([DASK, "scheduler", "--scheduler-file", str(scheduler_file), "--port", "0",
                                  "--dashboard-address", ":0"], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    for _ in range(600):
        if scheduler_file.exists() and scheduler_file.stat().st_size:
            break
        time.sleep(0.1)
    workers = subprocess.Popen([DASK, "worker", "--scheduler-file", str(scheduler_file), "--nworkers", "2",
                                "--nthreads", "2", "--memory-limit", "2GB", "--local-directory", str(workdir)],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return scheduler, workers, scheduler_file


def run(variant: str, ny: int, nx: int, root: Path) -> dict:
    import distributed

    workdir = root / variant
    workdir.mkdir()
    scheduler, workers, scheduler_file = cluster(workdir)
    try:
        client = distributed.Client(scheduler_file=str(scheduler_file), set_as_default=False)
        client.wait_for_workers(2, timeout=120)
        client.register_plugin(PeakTasks(), name=PeakTasks.name)
        if variant == "before":
            write_zarr = before_module().write_zarr
        else:
            from rasterflow.write.zarr import write_zarr
        # warm-up: the first write imports zarr on the workers and grows the scheduler once; not the job's cost
        write_zarr(dataset(2, 2), str(workdir / "warm.zarr"), fingerprint="warm", client=client, compression="none")
        ds = dataset(ny, nx)
        time.sleep(1.0)
        sampler = Sampler({"client": os.getpid(), "scheduler": scheduler.pid})
        base = sampler.rss()
        path = str(workdir / "out.zarr")
        started = time.perf_counter()
        with sampler:
            result = write_zarr(ds, path, fingerprint="bench", client=client, compression="none")
        wall = time.perf_counter() - started
        peak_tasks = client.run_on_scheduler(_peak)
        import xarray as xr

        values = xr.open_zarr(path)["v"].values
        rows, cols = np.indices(values.shape)
        identical = bool(np.array_equal(values, (rows * 1000 + cols).astype(np.float32)))
        client.close()
    finally:
        workers.terminate()
        scheduler.terminate()
        workers.wait(60)
        scheduler.wait(60)
    return {"variant": variant, "blocks": result.blocks_written, "wall_s": round(wall, 1),
            "client_peak_mb": round((sampler.peak["client"] - base["client"]) / 1e6),
            "scheduler_peak_mb": round((sampler.peak["scheduler"] - base["scheduler"]) / 1e6),
            "scheduler_peak_tasks": peak_tasks, "identical": identical}


# --------------------------------------------------------------------------------------------------------------------
# --graph: the client's graph, before and after the lazy layers

GRAPH_CHUNKS = {2_500: 704, 10_000: 352, 40_000: 176}
"""Target chunks -> chunk edge on the 10-tile grid (30,744 × 40,626 px): 2,552, 10,208 and 40,425 chunks."""


def _plan_scale():
    spec = importlib.util.spec_from_file_location("plan_scale", HERE / "plan_scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def former_dataset(plan):
    """The Dataset's graph as ``graph.build_dataset`` built it before: the read layer materialised (a dict of every
    chunk's task, the tasks identical: tests/test_lazy_graph.py), each band a Dask slice of it, rechunked to the
    user's dims. Fused path only (the job here)."""
    import dask.array as da
    import xarray as xr
    from dask.highlevelgraph import HighLevelGraph

    from rasterflow import graph

    lazy = graph.build_dataset(plan)
    layers = lazy[plan.program.band_names[0]].data.__dask_graph__().layers
    name = next(n for n, layer in layers.items() if layer[next(iter(layer))][0] is graph.chunk_reduce)
    chunks = layers[name].collection_annotations["chunks"]
    root = da.Array(HighLevelGraph.from_collections(name, dict(layers[name]), dependencies=()), name, chunks,
                    meta=np.empty((0,) * len(chunks), dtype=plan.program.dtype))
    variables = {band: graph._reduced_dims(root[:, :, b], bool(plan.period_labels), plan.quantile_dim)
                 for b, band in enumerate(plan.program.band_names)}
    return xr.Dataset(variables, coords=lazy.coords)


def _traced(function, *args) -> tuple[Any, int, float]:
    import tracemalloc

    tracemalloc.start()
    started = time.perf_counter()
    try:
        value = function(*args)
        return value, tracemalloc.get_traced_memory()[0], time.perf_counter() - started
    finally:
        tracemalloc.stop()


def graph_memory(targets: list[int], dates: int, variants: list[str]) -> list[dict]:
    """Per target chunk count and variant: client bytes of ``build_dataset`` and of the first batch's graph."""
    from rasterflow import graph
    from rasterflow.commands import plan_command
    from rasterflow.spec import load_spec
    from rasterflow.write.submit import BlockTasks

    bench = _plan_scale()
    rows = []
    for target in targets:
        chunk = GRAPH_CHUNKS.get(target) or int(round((30_744 * 40_626 / target) ** 0.5))
        spec = bench.write_job(bench.DATA / f"t10_d{dates}", 10, dates, chunk=chunk)
        plan = plan_command(load_spec(spec)).plan
        graph.build_dataset(plan)  # imports and first-call caches: not the graph's cost
        for variant in variants:
            build = graph.build_dataset if variant == "after" else former_dataset
            dataset, nbytes, seconds = _traced(build, plan)
            array = dataset["ndvi"].data
            ny, nx = array.numblocks[-2:]
            keys = [(array.name, ny // 2, j) for j in range(min(16, nx))]
            tasks, batch_bytes, batch_seconds = _traced(lambda a=array, k=keys: BlockTasks([a])(k))
            assert len(tasks.roots) == len(keys)
            rows.append({"variant": variant, "chunks": ny * nx, "chunk": chunk, "dates": dates, "build_bytes": nbytes,
                         "build_mb": round(nbytes / 1e6, 2), "bytes_per_chunk": round(nbytes / (ny * nx)),
                         "build_s": round(seconds, 2), "batch_kb": round(batch_bytes / 1e3),
                         "batch_s": round(batch_seconds, 3), "items_per_task": plan.report.inputs.items_per_task})
            print(json.dumps(rows[-1]), flush=True)
            del dataset, array, tasks
    return rows


def print_graph_table(rows: list[dict]) -> None:
    print(f"\nclient graph of graph.build_dataset ({rows[0]['dates']} dates x 10 tiles, solar-day median, 1 band; "
          f"tracemalloc), and of the first batch (16 blocks, BlockTasks)\n")
    print("| chunks | chunk | items per task | variant | build_dataset | per chunk | per chunk added | build time | "
          "first batch | batch time |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    smallest: dict[str, dict] = {}
    for r in rows:
        first = smallest.setdefault(r["variant"], r)
        added = (f"{(r['build_bytes'] - first['build_bytes']) / (r['chunks'] - first['chunks']):,.0f} B"
                 if r["chunks"] > first["chunks"] else "")
        print(f"| {r['chunks']:,} | {r['chunk']} | {r['items_per_task']} | {r['variant']} | {r['build_mb']} MB | "
              f"{r['bytes_per_chunk']:,} B | {added} | {r['build_s']} s | {r['batch_kb']} kB | "
              f"{r['batch_s'] * 1e3:.0f} ms |")
    print("\n(per chunk: build_dataset's bytes / chunks, with the grid's coordinates, ~1.8 MB whatever the chunks; "
          "per chunk added: the growth from the smallest job, the graph's own cost per chunk)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=20_000, help="blocks of the job (rounded to a 2:1 grid)")
    parser.add_argument("--variants", default="before,after")
    parser.add_argument("--graph", action="store_true", help="the client's graph before the write (no cluster)")
    parser.add_argument("--chunks", default="2500,10000,40000", help="--graph: chunk counts to build")
    parser.add_argument("--dates", type=int, default=73, help="--graph: dates per tile of the synthetic job")
    args = parser.parse_args()
    if args.graph:
        print_graph_table(graph_memory([int(c) for c in args.chunks.split(",")], args.dates,
                                       args.variants.split(",")))
        return
    ny = max(1, int(round((args.blocks / 2) ** 0.5)))
    nx = max(1, args.blocks // ny)
    root = Path(tempfile.mkdtemp(prefix="rasterflow-bench-bounded-"))
    rows = []
    try:
        for variant in args.variants.split(","):
            rows.append(run(variant, ny, nx, root))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{ny} × {nx} = {ny * nx:,} blocks of {EDGE}² float32, one variable, 2 workers × 2 threads\n")
    print("| variant | blocks | wall | client peak (above baseline) | scheduler peak (above baseline) | "
          "scheduler tasks at most | identical |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['blocks']:,} | {r['wall_s']} s | {r['client_peak_mb']} MB | "
              f"{r['scheduler_peak_mb']} MB | {r['scheduler_peak_tasks']:,} | {r['identical']} |")


if __name__ == "__main__":
    main()

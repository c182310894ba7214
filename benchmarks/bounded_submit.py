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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=20_000, help="blocks of the job (rounded to a 2:1 grid)")
    parser.add_argument("--variants", default="before,after")
    args = parser.parse_args()
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

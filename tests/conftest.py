"""Shared fixtures: generated sample scenes (real COGs written by rasterio) and spec files that use them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

SAMPLE_SIZE = 256
SAMPLE_DATES = 8


@pytest.fixture(scope="session")
def sample(tmp_path_factory):
    """Small synthetic Sentinel-2-like scenes: 256² px, 8 dates, tiled ZSTD COGs, with an items file."""
    from rasterflow.sample import generate_sample

    return generate_sample(tmp_path_factory.mktemp("sample"), size=SAMPLE_SIZE, n_dates=SAMPLE_DATES, blocksize=128)


def spec_text(sample, *, catalog: str | None = None, output: str = "out/result.zarr", reduce: str | None = None,
              mask: str | None = '"scl in (3, 8, 9, 10)"', bands: str = 'ndvi: "(nir - red) / (nir + red)"',
              chunks: str = "{time: -1, y: 96, x: 96}", extra: str = "", query: str | None = None,
              stac_filter: str | None = None, group_by: str | None = None,
              cluster: str = "{n_workers: 2, threads_per_worker: 1, memory_limit: 2GB}") -> str:
    """A spec over the sample scenes; keyword arguments replace whole sections."""
    minx, miny, maxx, maxy = sample.bounds
    lines = [
        "version: 1",
        "name: test-run",
        "source:",
        "  stac:",
        f"    catalog: {catalog or sample.items_json}",
        "    collections: [sentinel-2-l2a-sample]",
        f"    bbox: [{sample.bbox_wgs84[0] - 0.01}, {sample.bbox_wgs84[1] - 0.01}, "
        f"{sample.bbox_wgs84[2] + 0.01}, {sample.bbox_wgs84[3] + 0.01}]",
        "    datetime: 2024-06-01/2024-08-31",
    ]
    if query:
        lines.append(f"    query: {query}")
    if stac_filter:
        lines.append(f"    filter: {stac_filter}")
    lines += [
        "  assets: {red: red, nir: nir, green: green, scl: scl}",
        *([f"  group_by: {group_by}"] if group_by else []),
        "grid:",
        "  crs: EPSG:32633",
        "  resolution: 10",
        f"  bounds: [{minx}, {miny}, {maxx}, {maxy}]",
        f"chunks: {chunks}",
    ]
    if mask:
        lines.append(f"mask: {mask}")
    lines += ["bands:", textwrap.indent(bands, "  ")]
    if reduce:
        lines.append(f"reduce: {reduce}")
    lines += [f"output: {{path: {output}}}", f"cluster: {cluster}"]
    return "\n".join(lines) + "\n" + extra


def sample_with_truncated_file(sample, tmp_path: Path, item_index: int, asset: str = "nir") -> tuple[Path, Path]:
    """A copy of the sample under ``tmp_path/broken`` whose item ``item_index`` has its ``asset`` COG cut to a third
    (a real fault: reading it fails in the middle of the computation); returns the copy's items file and that COG."""
    import json
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(sample.directory, broken)
    items = json.loads((broken / "items.json").read_text())
    for item in items["features"]:
        for meta in item["assets"].values():
            meta["href"] = meta["href"].replace(str(sample.directory), str(broken))
    (broken / "items.json").write_text(json.dumps(items))
    victim = Path(items["features"][item_index]["assets"][asset]["href"])
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 3])
    return broken / "items.json", victim


@pytest.fixture(scope="session")
def four_tiles(tmp_path_factory):
    """2 × 2 adjacent tiles of 96² px, 4 dates (three in June, one in July): 16 items."""
    from rasterflow.sample import generate_sample

    return generate_sample(tmp_path_factory.mktemp("four-tiles"), size=96, n_dates=4, tiles=(2, 2), blocksize=32)


@pytest.fixture(scope="session")
def two_tile_sample(tmp_path_factory):
    """Two adjacent tiles per date (128² px each, 4 dates): one pass covers both."""
    from rasterflow.sample import generate_sample

    return generate_sample(tmp_path_factory.mktemp("two-tiles"), size=128, n_dates=4, tiles=(1, 2), blocksize=64)


@pytest.fixture
def write_spec(tmp_path, sample):
    """Write a spec over the sample scenes into tmp_path and return its path."""

    def _write(name: str = "spec.yaml", **kwargs) -> Path:
        path = tmp_path / name
        path.write_text(spec_text(sample, **kwargs))
        return path

    return _write


@pytest.fixture(scope="session")
def dask_cluster_address(tmp_path_factory):
    """A real `dask scheduler` and two `dask worker` processes (1 thread, 1.5 GB each) on loopback."""
    import os
    import shutil
    import signal
    import socket
    import subprocess
    import sys
    import time

    from distributed import Client

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    dask = shutil.which("dask", path=os.path.dirname(sys.executable)) or "dask"
    logs = tmp_path_factory.mktemp("dask-logs")
    env = {**os.environ, "GDAL_CACHEMAX": "128"}
    # each log file is the child's own once it started: the parent closes its copy at once (no ResourceWarning)
    with open(logs / "scheduler.log", "w") as log:
        procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                                  stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)]
    for index in range(2):
        with open(logs / f"worker{index}.log", "w") as log:
            procs.append(subprocess.Popen(
                [dask, "worker", address, "--nthreads", "1", "--memory-limit", "1.5GB", "--nworkers", "1",
                 "--no-dashboard", "--local-directory", str(logs / f"w{index}")],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with Client(address, timeout=2) as client:
                    client.wait_for_workers(2, timeout=max(1, deadline - time.monotonic()))
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield address
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

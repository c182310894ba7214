"""Workers that read only local tiled COGs never import rasterio (GDAL): the file's header is parsed by tifffile
(:func:`rasterflow.read.cogheader.parse_local`) and its tiles are decoded by :mod:`rasterflow.read.tiles`. Where
GDAL is needed (here: striped files, a warped read) it is still used, entered lazily, with the same numbers.

Real runs on real worker processes (a Dask LocalCluster, and rasterflow's own), results compared with a NumPy
reference read with rasterio in the test process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import spec_text

WORKERS = {"n_workers": 2, "threads_per_worker": 1, "memory_limit": "1.5GB", "processes": True,
           "dashboard_address": None, "host": "127.0.0.1",
           # no HTTP server on 8787, which another cluster on the machine may hold
           "scheduler_kwargs": {"dashboard": False, "dashboard_address": "127.0.0.1:0"}}


def _rasterio_loaded(client) -> dict[str, bool]:
    """Per worker, whether it has imported rasterio (a lambda: pickled by value, so the worker imports nothing of
    this module, whose reference helpers import rasterio)."""
    return client.run(lambda: "rasterio" in sys.modules)


def _reference(sample) -> np.ndarray:
    """The median of the masked NDVI: the sample's pixels read with rasterio in this process, NumPy's median."""
    from reference import load_items, masked_ndvi, reduce_reference

    return reduce_reference(masked_ndvi(load_items(sample)), "median")


def _items(sample) -> list[dict]:
    from reference import load_items

    return load_items(sample)


def _assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    from reference import assert_same

    assert_same(actual, expected)


@pytest.fixture(scope="module")
def cluster():
    """A real LocalCluster with two worker processes (spawned: they start without rasterio)."""
    from distributed import Client, LocalCluster

    with LocalCluster(**WORKERS) as local, Client(local) as client:
        yield local, client


def _run(spec: Path) -> Path:
    from rasterflow import api

    api.run(str(spec), overwrite=True)
    return spec.parent / "out" / f"{spec.stem}.zarr"


def _median(path: Path) -> np.ndarray:
    import xarray as xr

    with xr.open_zarr(path) as ds:
        return ds["ndvi"].values


def _striped_copy(sample, folder: Path) -> Path:
    """A copy of the sample whose files are striped (not tiled) GeoTIFFs of the same pixels: GDAL reads those."""
    import rasterio

    folder.mkdir(parents=True, exist_ok=True)
    items = json.loads(Path(sample.items_json).read_text())
    for item in items["features"]:
        for meta in item["assets"].values():
            source = Path(meta["href"])
            target = folder / f"{item['id']}-{source.name}"
            with rasterio.open(source) as src:
                profile = {**src.profile, "tiled": False, "compress": "deflate"}
                profile.pop("blockxsize", None)
                profile.pop("blockysize", None)
                with rasterio.open(target, "w", **profile) as dst:
                    dst.write(src.read())
            meta["href"] = str(target)
    path = folder / "items.json"
    path.write_text(json.dumps(items))
    return path


def test_workers_reading_local_tiled_cogs_never_import_rasterio(sample, cluster, tmp_path):
    local, client = cluster
    before = _rasterio_loaded(client)
    assert len(before) == 2 and not any(before.values()), before
    spec = tmp_path / "lean.yaml"
    spec.write_text(spec_text(sample, reduce="{method: median}", output="out/lean.zarr",
                              cluster=f"{{address: '{local.scheduler_address}'}}"))
    with_workers = _run(spec)
    seen = _rasterio_loaded(client)
    assert len(seen) == 2 and not any(seen.values()), seen
    # the same pixels read with rasterio here, masked and reduced with NumPy
    expected = _reference(sample)
    _assert_same(_median(with_workers), expected)


def test_a_job_that_needs_gdal_loads_it_and_gives_the_same_numbers(sample, cluster, tmp_path):
    local, client = cluster
    catalog = _striped_copy(sample, tmp_path / "striped")
    spec = tmp_path / "striped.yaml"
    spec.write_text(spec_text(sample, catalog=str(catalog), reduce="{method: median}", output="out/striped.zarr",
                              cluster=f"{{address: '{local.scheduler_address}'}}"))
    result = _run(spec)
    assert any(_rasterio_loaded(client).values())  # striped files: GDAL read them
    expected = _reference(sample)
    _assert_same(_median(result), expected)


PRELOAD = textwrap.dedent('''\
    """Writes whether this worker imported rasterio, when it closes, to $RASTERIO_SEEN/<pid>."""
    import os
    import sys


    def dask_teardown(worker):
        with open(os.path.join(os.environ["RASTERIO_SEEN"], str(os.getpid())), "w") as handle:
            handle.write("yes" if "rasterio" in sys.modules else "no")
''')


@pytest.mark.slow
def test_rasterflows_own_worker_processes_never_import_rasterio(sample, tmp_path):
    """``rasterflow run`` with its own LocalCluster (worker processes, GDAL_CACHEMAX in their environment, its
    preload): the workers close without having imported rasterio; the result is the reference."""
    seen = tmp_path / "seen"
    seen.mkdir()
    preload = tmp_path / "rasterio_seen_preload.py"
    preload.write_text(PRELOAD)
    spec = tmp_path / "own.yaml"
    spec.write_text(spec_text(sample, reduce="{method: median}", output="out/own.zarr",
                              cluster="{n_workers: 2, threads_per_worker: 1, memory_limit: 1.5GB, processes: true}"))
    env = {**__import__("os").environ, "RASTERIO_SEEN": str(seen),
           "DASK_DISTRIBUTED__WORKER__PRELOAD": json.dumps([str(preload)])}
    ran = subprocess.run([sys.executable, "-m", "rasterflow", "run", str(spec)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    answers = sorted(p.read_text() for p in seen.iterdir())
    assert answers == ["no", "no"], answers
    expected = _reference(sample)
    _assert_same(_median(tmp_path / "out" / "own.zarr"), expected)


# ---- the local read path on its own ------------------------------------------------------------------------------


def test_parse_local_says_what_gdal_says_of_the_sample_files(sample):
    import rasterio

    from rasterflow.read.cogheader import parse_local

    for item in _items(sample):
        for meta in item["assets"].values():
            header = parse_local(meta["href"])
            facts = header.facts
            assert header.index is not None, header.why_gdal
            with rasterio.open(meta["href"]) as src:
                assert (facts.count, facts.dtype, facts.height, facts.width) == \
                    (src.count, src.dtypes[0], src.height, src.width)
                assert facts.crs == src.crs.to_string()
                assert facts.transform == tuple(src.transform)[:6]
                assert facts.nodata == src.nodata
                assert facts.tile_shape == tuple(src.block_shapes[0])


def test_a_side_car_file_sends_the_file_to_gdal(sample, tmp_path):
    from rasterflow.read.cogheader import parse_local

    source = Path(_items(sample)[0]["assets"]["red"]["href"])
    copy = tmp_path / source.name
    shutil.copy(source, copy)
    assert parse_local(str(copy)).index is not None
    (tmp_path / (source.name + ".aux.xml")).write_text("<PAMDataset/>")
    header = parse_local(str(copy))
    assert header.index is None and "aux.xml" in header.why_gdal


@pytest.mark.parametrize("window", [((0, 96), (0, 96)), ((40, 136), (100, 256)), ((128, 256), (5, 77))])
def test_local_reads_equal_gdals_reads_bit_for_bit(four_tiles, tmp_path, monkeypatch, window):
    """Windows across tiles and files' edges (partial coverage, fill): the decoder's planes are GDAL's."""
    from rasterflow import api, graph
    from rasterflow.read import datasets, read_planes
    from rasterflow.read.tiles import ENV_SWITCH

    spec = tmp_path / "four.yaml"
    spec.write_text(spec_text(four_tiles, reduce="{method: median}"))
    plan = api.plan(str(spec))
    rows, cols = window
    rows = (rows[0], min(rows[1], plan.grid.shape[0]))
    cols = (cols[0], min(cols[1], plan.grid.shape[1]))
    job = graph.read_jobs(plan, slice(0, len(plan.items)), rows, cols)
    datasets.clear_cache()
    ours = read_planes(job, rows, cols)
    assert datasets.open_count() == 0  # no GDAL open
    monkeypatch.setenv(ENV_SWITCH, "gdal")
    gdals = read_planes(job, rows, cols)
    datasets.clear_cache()
    for a, b in zip(ours.raw, gdals.raw):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    for a, b in zip(ours.covered, gdals.covered):
        if a is None:
            assert b is None
        else:
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ours.nodata, gdals.nodata)


def test_a_process_reading_local_cogs_does_not_import_rasterio(sample, tmp_path):
    """The reader in a fresh interpreter: planes read, rasterio never imported (the plan is made here, as the
    client makes it, and sent over pickled)."""
    import pickle

    from rasterflow import api, graph

    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(sample, reduce="{method: median}"))
    plan = api.plan(str(spec))
    job = graph.read_jobs(plan, slice(0, len(plan.items)), (0, 96), (0, 96))
    (tmp_path / "job.pkl").write_bytes(pickle.dumps(job))
    code = textwrap.dedent(f"""
        import pickle, sys
        from rasterflow.read import read_planes
        job = pickle.loads(open({str(tmp_path / "job.pkl")!r}, "rb").read())
        planes = read_planes(job, (0, 96), (0, 96))
        assert planes.raw[0].any()
        print("rasterio" in sys.modules)
    """)
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "False"


def test_the_block_cache_size_waits_for_rasterios_first_import():
    """gdalenv.BlockCache in a fresh interpreter: nothing imported when applied; GDAL gets the size when rasterio is
    first imported; restore puts GDAL's own size back. Applied and restored before any import: GDAL keeps its own."""
    code = textwrap.dedent("""
        import sys
        from rasterflow.gdalenv import BlockCache
        cache = BlockCache(12_345_678)
        cache.apply()
        assert "rasterio" not in sys.modules
        import rasterio.env
        assert rasterio.env.get_gdal_config("GDAL_CACHEMAX") == 12_345_678
        own = cache.previous
        cache.restore()
        assert rasterio.env.get_gdal_config("GDAL_CACHEMAX") == own != 12_345_678
        again = BlockCache(7_654_321)
        again.apply()  # rasterio loaded: at once
        assert rasterio.env.get_gdal_config("GDAL_CACHEMAX") == 7_654_321
        again.restore()
        assert rasterio.env.get_gdal_config("GDAL_CACHEMAX") == own
        print("ok")
    """)
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    code = textwrap.dedent("""
        import sys
        from rasterflow.gdalenv import BlockCache
        cache = BlockCache(12_345_678)
        cache.apply()
        cache.restore()
        import rasterio.env
        assert rasterio.env.get_gdal_config("GDAL_CACHEMAX") != 12_345_678
        assert not any(type(f).__name__ == "_RasterioWatch" for f in sys.meta_path)
        print("ok")
    """)
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr


def test_the_budget_counts_no_gdal_in_workers_that_never_load_it(sample, tmp_path):
    """A plan whose files are all decoded by rasterflow (the sample: local tiled ZSTD COGs on the grid) counts the
    worker baseline without GDAL; a warped read (another resolution) or one process counts it whole."""
    from rasterflow import api, budget

    spec = tmp_path / "b.yaml"
    spec.write_text(spec_text(sample, reduce="{method: median}",
                              cluster="{n_workers: 2, threads_per_worker: 1, memory_limit: 2GB, processes: true}"))
    assert api.plan(str(spec)).report.baseline_bytes == budget.WORKER_BASELINE_BYTES - budget.GDAL_LIBRARY_BYTES
    warped = spec_text(sample, reduce="{method: median}",
                       cluster="{n_workers: 2, threads_per_worker: 1, memory_limit: 2GB, processes: true}")
    warped = warped.replace("  resolution: 10\n", "  resolution: 20\n")
    (tmp_path / "w.yaml").write_text(warped)
    assert api.plan(str(tmp_path / "w.yaml")).report.baseline_bytes == budget.WORKER_BASELINE_BYTES
    # an area of interest: its windows are masked with rasterio's geometry_mask, so GDAL is in the workers again
    west, south, east, north = sample.bbox_wgs84
    triangle = json.dumps({"type": "Polygon", "coordinates": [[[west, south], [east, south], [west, north],
                                                               [west, south]]]})
    clipped = spec_text(sample, reduce="{method: median}",
                        cluster="{n_workers: 2, threads_per_worker: 1, memory_limit: 2GB, processes: true}")
    clipped = "\n".join(line for line in clipped.splitlines() if not line.startswith("    bbox:"))
    clipped = clipped.replace("    datetime:", f"    intersects: {triangle}\n    datetime:")
    (tmp_path / "a.yaml").write_text(clipped + "\n")
    assert api.plan(str(tmp_path / "a.yaml")).report.baseline_bytes == budget.WORKER_BASELINE_BYTES

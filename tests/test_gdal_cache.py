"""``cluster.gdal_cachemax: auto`` (issue 13, step 0: what a worker holds): a small GDAL block cache when every
source block is decoded once, the default where a cache saves decoding.

Plans on the real sample COGs (256² px, 128² tiles, 8 dates) through ``run.plan_with_items`` (which reads one file's
header, as a run does); one real run whose worker processes report, from a worker preload, the GDAL_CACHEMAX GDAL
itself sees there, and whose values equal the NumPy reference.
"""

from __future__ import annotations

import contextlib
import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import spec_text
from rasterflow.budget import ALIGNED_GDAL_CACHEMAX, DEFAULT_GDAL_CACHEMAX
from rasterflow.cli import cli


def _plan(sample, tmp_path: Path, *, shift_px: int = 0, **kwargs):
    from rasterflow.planning import local_layout
    from rasterflow.commands import plan_with_items, search
    from rasterflow.spec import load_spec

    text = spec_text(sample, **kwargs)
    if shift_px:  # the grid's origin moved east by whole pixels: the files' tiles no longer start on chunk edges
        minx, miny, maxx, maxy = sample.bounds
        text = text.replace(f"bounds: [{minx}, {miny}, {maxx}, {maxy}]",
                            f"bounds: [{minx + 10 * shift_px}, {miny}, {maxx}, {maxy}]")
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    loaded = load_spec(spec)
    return plan_with_items(loaded, search(loaded), local_layout(loaded.spec))


ALIGNED = "{time: -1, y: 128, x: 128}"


def test_auto_is_small_when_every_block_is_decoded_once(sample, tmp_path):
    plan = _plan(sample, tmp_path, chunks=ALIGNED)
    assert plan.gdal_cachemax == ALIGNED_GDAL_CACHEMAX
    assert plan.report.inputs.gdal_cachemax == ALIGNED_GDAL_CACHEMAX  # what the budget counted
    assert plan.writer_cachemax == DEFAULT_GDAL_CACHEMAX  # the COG writer's overviews read tiles back
    # whole chunks of two tiles, and one chunk as wide as the grid, keep tiles whole too
    assert _plan(sample, tmp_path, chunks="{time: -1, y: 256, x: 256}").gdal_cachemax == ALIGNED_GDAL_CACHEMAX


@pytest.mark.parametrize("case, kwargs", [
    ("chunks cut tiles", {"chunks": "{time: -1, y: 96, x: 96}"}),
    ("grid origin off the tile grid", {"chunks": ALIGNED, "shift_px": 64}),
])
def test_auto_keeps_the_default_where_a_cache_saves_decoding(sample, tmp_path, case, kwargs):
    assert _plan(sample, tmp_path, **kwargs).gdal_cachemax == DEFAULT_GDAL_CACHEMAX, case


def test_auto_keeps_the_default_for_warped_reads(sample, tmp_path):
    from rasterflow.planning import local_layout
    from rasterflow.commands import plan_with_items, search
    from rasterflow.spec import load_spec

    spec = tmp_path / "warped.yaml"  # 20 m from 10 m files: every read through a WarpedVRT
    spec.write_text(spec_text(sample, chunks=ALIGNED).replace("resolution: 10", "resolution: 20"))
    loaded = load_spec(spec)
    plan = plan_with_items(loaded, search(loaded), local_layout(loaded.spec))
    assert not any(read.direct for reads in plan.sources.reads for read in reads if read is not None)
    assert plan.gdal_cachemax == DEFAULT_GDAL_CACHEMAX


def test_a_size_in_the_spec_is_used_as_given(sample, tmp_path):
    plan = _plan(sample, tmp_path, chunks=ALIGNED,
                 cluster="{n_workers: 2, threads_per_worker: 1, memory_limit: 2GB, gdal_cachemax: 64MB}")
    assert plan.gdal_cachemax == plan.writer_cachemax == 64 * 10**6


PRELOAD = textwrap.dedent('''\
    """Writes the GDAL_CACHEMAX GDAL sees in this worker (bytes) to $GDAL_CACHE_SEEN/<pid>."""
    import os


    def dask_setup(worker):
        from rasterio.env import get_gdal_config

        with open(os.path.join(os.environ["GDAL_CACHE_SEEN"], str(os.getpid())), "w") as handle:
            handle.write(str(get_gdal_config("GDAL_CACHEMAX")))
''')


@pytest.mark.slow
def test_the_workers_get_the_planned_cache_and_the_result_is_the_reference(sample, tmp_path, monkeypatch):
    from reference import assert_same, load_items, masked_ndvi, reduce_reference

    seen = tmp_path / "seen"
    seen.mkdir()
    preload = tmp_path / "gdal_cache_preload.py"
    preload.write_text(PRELOAD)
    monkeypatch.setenv("GDAL_CACHE_SEEN", str(seen))
    monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__PRELOAD", json.dumps([str(preload)]))
    spec = tmp_path / "run.yaml"
    spec.write_text(spec_text(sample, chunks=ALIGNED, reduce="{method: median}", output="out/m.zarr",
                              cluster="{n_workers: 2, threads_per_worker: 1, memory_limit: 2GB, processes: true}"))
    import dask

    dask.config.refresh()  # the preload from the environment, as a fresh `rasterflow run` reads it
    try:
        with contextlib.chdir(tmp_path):
            result = CliRunner().invoke(cli, ["run", str(spec)])
    finally:
        monkeypatch.delenv("DASK_DISTRIBUTED__WORKER__PRELOAD")
        dask.config.refresh()
    assert result.exit_code == 0, result.output
    values = sorted(int(p.read_text()) for p in seen.iterdir())
    assert values == [ALIGNED_GDAL_CACHEMAX] * 2  # both worker processes
    report = json.loads((tmp_path / "out" / "m.zarr.report.json").read_text())
    assert report["cluster"]["gdal_cachemax"] == ALIGNED_GDAL_CACHEMAX
    import xarray as xr

    expected = reduce_reference(masked_ndvi(load_items(sample)), "median")
    assert_same(xr.open_zarr(tmp_path / "out" / "m.zarr")["ndvi"].values, expected)

"""The same spec through real STAC APIs on loopback and on a real `dask scheduler` + 2 `dask worker` processes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

from rasterflow.cli import cli
from reference import assert_same, load_items, masked_ndvi, reduce_reference
from stac_servers import pgstac_server, rustac_server

pytestmark = [pytest.mark.slow, pytest.mark.server]


@pytest.fixture(scope="module")
def rustac_url(sample):
    with rustac_server(sample.collection_json, sample.items_ndjson) as url:
        yield url


@pytest.fixture(scope="module")
def pgstac_url(sample):
    with pgstac_server(sample.collection_json, sample.items_ndjson) as url:
        yield url


def _run(spec: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["run", str(spec)])
    return result.exit_code, result.output


def _result(out: Path) -> tuple[np.ndarray, list[str]]:
    report = json.loads(Path(str(out) + ".report.json").read_text())
    return xr.open_zarr(out)["ndvi"].values, report["item_ids"]


def test_rustac_api_gives_the_same_result_as_the_local_file(write_spec, sample, tmp_path, rustac_url):
    local = write_spec("local.yaml", reduce="{method: median}", output="out/local.zarr")
    remote = write_spec("api.yaml", catalog=rustac_url, reduce="{method: median}", output="out/api.zarr")
    assert _run(local)[0] == 0
    code, output = _run(remote)
    assert code == 0, output
    local_values, local_ids = _result(tmp_path / "out" / "local.zarr")
    api_values, api_ids = _result(tmp_path / "out" / "api.zarr")
    assert api_ids == local_ids and len(api_ids) == len(sample.item_ids)
    np.testing.assert_array_equal(api_values, local_values)
    assert_same(api_values, reduce_reference(masked_ndvi(load_items(sample, api_ids)), "median"))


@pytest.mark.parametrize("selection", [
    {"query": '{"eo:cloud_cover": {lt: 40}}'},
    {"stac_filter": '"eo:cloud_cover < 40"'},
    {"stac_filter": '{op: "<", args: [{property: "eo:cloud_cover"}, 40]}'},
], ids=["query", "cql2-text", "cql2-json"])
def test_pgstac_query_filters_items_like_the_local_path(write_spec, sample, tmp_path, pgstac_url, selection):
    local = write_spec("local.yaml", reduce="{method: median}", output="out/local.zarr", **selection)
    remote = write_spec("api.yaml", catalog=pgstac_url, reduce="{method: median}", output="out/api.zarr",
                        **selection)
    assert _run(local)[0] == 0
    code, output = _run(remote)
    assert code == 0, output
    local_values, local_ids = _result(tmp_path / "out" / "local.zarr")
    api_values, api_ids = _result(tmp_path / "out" / "api.zarr")
    all_items = load_items(sample)
    expected_ids = [i["id"] for i in all_items if i["properties"]["eo:cloud_cover"] < 40]
    assert 0 < len(expected_ids) < len(all_items), "the query must select a strict subset"
    assert api_ids == local_ids == expected_ids
    np.testing.assert_array_equal(api_values, local_values)


def test_run_on_an_existing_dask_cluster(write_spec, sample, tmp_path, dask_cluster_address):
    spec = write_spec(reduce="{method: median}", output="out/remote.zarr",
                      cluster=f"{{address: '{dask_cluster_address}', threads_per_worker: 1}}")
    code, output = _run(spec)
    assert code == 0, output
    out = tmp_path / "out" / "remote.zarr"
    report = json.loads(Path(str(out) + ".report.json").read_text())
    assert report["cluster"]["is_local"] is False
    assert report["cluster"]["address"] == dask_cluster_address
    assert report["cluster"]["n_workers"] == 2
    assert report["memory_limit"] == 1_500_000_000  # the workers' real limit, not the local sizing
    values, ids = _result(out)
    assert_same(values, reduce_reference(masked_ndvi(load_items(sample, ids)), "median"))


def test_plan_uses_the_real_workers_limits(write_spec, dask_cluster_address):
    # The remote workers were started with --memory-limit 1.5GB and 1 thread; the plan must judge against those,
    # not against what a LocalCluster on this machine would get.
    chunks = "{time: -1, y: -1, x: -1}"
    local = write_spec("local.yaml", reduce="{method: median}", chunks=chunks,
                       cluster="{threads_per_worker: 4, memory_limit: 8GB, gdal_cachemax: 0}")
    remote = write_spec("remote.yaml", reduce="{method: median}", chunks=chunks,
                        cluster=f"{{address: '{dask_cluster_address}', threads_per_worker: 1, gdal_cachemax: 0}}")
    runner = CliRunner()
    local_plan = json.loads(runner.invoke(cli, ["plan", "--json", str(local)]).output)
    result = runner.invoke(cli, ["plan", "--json", str(remote)])
    remote_plan = json.loads(result.output)
    assert remote_plan["layout"] == {"n_workers": 2, "threads_per_worker": 1, "memory_limit": 1_500_000_000,
                                     "source": dask_cluster_address}
    assert remote_plan["budget"]["memory_limit"] == 1_500_000_000
    assert remote_plan["budget"]["limit_source"] == dask_cluster_address
    assert local_plan["budget"]["memory_limit"] == 8_000_000_000
    # the same per-task estimate, judged against each cluster's own limit
    assert remote_plan["budget"]["peak_task_bytes"] == local_plan["budget"]["peak_task_bytes"]
    assert remote_plan["budget"]["fraction_of_limit"] == pytest.approx(
        remote_plan["budget"]["peak_per_worker"] / 1_500_000_000, rel=1e-3)

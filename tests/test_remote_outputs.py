"""Outputs to object storage (issue 9, point 4): Zarr and COG written to an S3 API on loopback (moto's standalone
server), with the guarantees of local outputs: nothing at the final prefix looks complete before it is, a killed
run resumes, ``overwrite: false`` refuses, an uploaded COG is checked.

The runs get their S3 settings as boto users set them (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``...); the
read-backs use xarray with s3fs ``storage_options`` and rasterio with GDAL's ``/vsis3/`` options, and compare with an
independent NumPy reference (tests/reference.py) and with the local-file run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

from conftest import spec_text
from reference import assert_same, load_items, masked_ndvi, reduce_reference
from s3_server import moto_server

from rasterflow.cli import cli

pytestmark = pytest.mark.slow

BUCKET = "out"
KEYS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}


# ---- the S3 server and its clients -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto_server on a free loopback port with an empty bucket ``out``; yields its URL."""
    with moto_server() as endpoint:
        _client(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint


def _client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                        region_name="us-east-1")


@pytest.fixture
def s3_env(s3_endpoint, monkeypatch, tmp_path):
    """The environment a boto user sets for a private endpoint (no GDAL-specific variable), cwd in tmp_path (the
    reports of remote outputs go to ./.rasterflow/reports)."""
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    for key, value in {**KEYS, "AWS_ENDPOINT_URL": s3_endpoint}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    return s3_endpoint


def _objects(endpoint: str, prefix: str) -> dict[str, str]:
    """{key: ETag} of every object under ``prefix``."""
    s3 = _client(endpoint)
    out: dict[str, str] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        out.update({o["Key"]: o["ETag"] for o in page.get("Contents", [])})
    return out


def _storage_options(endpoint: str) -> dict:
    return {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}


def _open_s3_zarr(endpoint: str, key: str) -> xr.Dataset:
    # consolidated=True: a store without its consolidated metadata (unfinished) must not open
    return xr.open_zarr(f"s3://{BUCKET}/{key}", consolidated=True, storage_options=_storage_options(endpoint))


def _gdal_s3(endpoint: str) -> dict:
    # the credentials come from the environment (s3_env): rasterio.Env refuses them as options
    return {"AWS_S3_ENDPOINT": endpoint.split("://", 1)[1], "AWS_HTTPS": "NO", "AWS_VIRTUAL_HOSTING": "FALSE"}


def _spec(sample, path: Path, *, output: str, **kwargs) -> Path:
    path.write_text(spec_text(sample, reduce="{method: median}", output=output, **kwargs))
    return path


def _run(spec: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["run", str(spec)])
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes else "")


@pytest.fixture(scope="module")
def reference(sample):
    """The NumPy median NDVI of the sample (independent of rasterflow)."""
    return reduce_reference(masked_ndvi(load_items(sample)), "median")


@pytest.fixture(scope="module")
def local_run(sample, tmp_path_factory):
    """The local-file run of the same job: what an S3 output must equal."""
    tmp = tmp_path_factory.mktemp("local-out")
    code, output = _run(_spec(sample, tmp / "local.yaml", output="out/local.zarr"))
    assert code == 0, output
    return xr.open_zarr(tmp / "out" / "local.zarr", consolidated=True)["ndvi"].values


# ---- Zarr and COG through `rasterflow run` ------------------------------------------------------------------------


def test_zarr_and_cog_written_to_s3_read_back_with_xarray_and_rasterio(sample, tmp_path, s3_env, reference,
                                                                      local_run):
    import rasterio

    endpoint = s3_env
    code, output = _run(_spec(sample, tmp_path / "zarr.yaml", output=f"s3://{BUCKET}/runs/ndvi.zarr"))
    assert code == 0, output
    ds = _open_s3_zarr(endpoint, "runs/ndvi.zarr")
    assert ds.attrs["rasterflow_complete"] is True and ds.attrs["rasterflow_fingerprint"]
    assert_same(ds["ndvi"].values, reference)
    np.testing.assert_array_equal(ds["ndvi"].values, local_run)
    keys = _objects(endpoint, "runs/")
    assert "runs/ndvi.zarr/.zmetadata" in keys and "runs/ndvi.zarr/.zattrs" in keys
    assert not [k for k in keys if ".partial" in k or "/.rasterflow/" in k], keys  # staging and markers gone
    assert "runs/ndvi.zarr.stac-item.json" in keys  # the STAC item is written beside it, after the data

    # the scratch directory a killed remote COG write left (its pid is gone) is removed; a live run's is not
    import tempfile

    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "60"])
    left = Path(tempfile.gettempdir()) / f"rasterflow-cog-{dead.pid}-killed"
    live = Path(tempfile.gettempdir()) / f"rasterflow-cog-{alive.pid}-running"
    for scratch in (left, live):
        scratch.mkdir()
        (scratch / "0-ndvi.tif").write_bytes(b"half a COG")
    try:
        code, output = _run(_spec(sample, tmp_path / "cog.yaml", output=f"s3://{BUCKET}/runs/ndvi.tif"))
        assert code == 0, output
        assert not left.exists() and live.exists()
    finally:
        alive.kill()
        alive.wait()
        for scratch in (left, live):
            shutil.rmtree(scratch, ignore_errors=True)
    with rasterio.Env(**_gdal_s3(endpoint)), rasterio.open(f"/vsis3/{BUCKET}/runs/ndvi.tif") as src:
        assert src.tags(ns="IMAGE_STRUCTURE").get("LAYOUT") == "COG" and src.profile["tiled"]
        cog = src.read(1, masked=True).filled(np.nan)
    assert_same(cog, reference)
    np.testing.assert_array_equal(cog, local_run)
    body = _client(endpoint).get_object(Bucket=BUCKET, Key="runs/ndvi.tif")["Body"].read()
    item = json.loads(_client(endpoint).get_object(Bucket=BUCKET, Key="runs/ndvi.tif.stac-item.json")["Body"].read())
    asset = next(iter(item["assets"].values()))
    # the checksum the writer verified after the upload is the object's
    assert asset["file:checksum"] == "1220" + hashlib.sha256(body).hexdigest()
    assert asset["file:size"] == len(body)
    assert not [k for k in _objects(endpoint, "runs/") if "rasterflow-" in k]  # no temporary object, ever
    # a remote output's report stays on this machine, never as a local "s3:/..." directory
    assert not (tmp_path / "s3:").exists()
    reports = sorted((tmp_path / ".rasterflow" / "reports").glob("*.report.json"))
    assert [json.loads(p.read_text())["status"] for p in reports] == ["ok", "ok"]


def test_overwrite_false_refuses_an_existing_s3_output_with_exit_2(sample, tmp_path, s3_env):
    endpoint = s3_env
    first = _spec(sample, tmp_path / "first.yaml", output=f"s3://{BUCKET}/refuse/ndvi.zarr",
                  chunks="{time: -1, y: 128, x: 128}")
    code, output = _run(first)
    assert code == 0, output
    before = _objects(endpoint, "refuse/")
    assert "refuse/ndvi.zarr/.zmetadata" in before
    old_fingerprint = _open_s3_zarr(endpoint, "refuse/ndvi.zarr").attrs["rasterflow_fingerprint"]
    # another job (other chunks: another fingerprint) at the same path, overwrite: false
    other = _spec(sample, tmp_path / "other.yaml", output=f"s3://{BUCKET}/refuse/ndvi.zarr, overwrite: false",
                  chunks="{time: -1, y: 64, x: 64}")
    code, output = _run(other)
    assert code == 2, output
    assert "already exists" in output and f"s3://{BUCKET}/refuse/ndvi.zarr" in output
    assert "Traceback" not in output
    assert _objects(endpoint, "refuse/") == before  # untouched, object for object (same ETags)
    # asked to (--overwrite), the run replaces it: the new layout, no chunk of the old one left
    result = CliRunner().invoke(cli, ["run", str(other), "--overwrite"])
    assert result.exit_code == 0, result.output
    ds = _open_s3_zarr(endpoint, "refuse/ndvi.zarr")
    assert ds["ndvi"].encoding["chunks"] == (64, 64) and ds.attrs["rasterflow_fingerprint"] != old_fingerprint
    after = _objects(endpoint, "refuse/ndvi.zarr/ndvi/")
    chunks = sorted(k.rsplit("/", 1)[1] for k in after if not k.rsplit("/", 1)[1].startswith("."))
    assert chunks == [f"{i}.{j}" for i in range(4) for j in range(4)]  # exactly the new layout's chunks

    # a COG too: someone else's object at the path is kept as it is
    _client(endpoint).put_object(Bucket=BUCKET, Key="refuse/ndvi.tif", Body=b"someone else's file")
    cog = _spec(sample, tmp_path / "cog.yaml", output=f"s3://{BUCKET}/refuse/ndvi.tif, overwrite: false")
    code, output = _run(cog)
    assert code == 2 and "already exists" in output, output
    kept = _client(endpoint).get_object(Bucket=BUCKET, Key="refuse/ndvi.tif")["Body"].read()
    assert kept == b"someone else's file"


def test_sigkill_during_an_s3_zarr_write_leaves_nothing_complete_then_resumes(sample, tmp_path, s3_env, reference,
                                                                             local_run):
    endpoint = s3_env
    spec = _spec(sample, tmp_path / "killed.yaml", output=f"s3://{BUCKET}/killed/ndvi.zarr",
                 chunks="{time: -1, y: 32, x: 32}", cluster="{n_workers: 1, threads_per_worker: 1, memory_limit: 2GB}")
    proc = subprocess.Popen([sys.executable, "-m", "rasterflow", "run", str(spec)], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    markers = "killed/ndvi.zarr.partial/.rasterflow/done/"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if len(_objects(endpoint, markers)) >= 3:
                break
            assert proc.poll() is None, proc.stdout.read().decode()
            time.sleep(0.05)
        else:
            pytest.fail("no block was written within 120 s")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()  # the pipe's file: unclosed, a ResourceWarning (an error under filterwarnings)
    # nothing at the final prefix; the staging store says it is unfinished and keeps the finished blocks
    assert _objects(endpoint, "killed/ndvi.zarr/") == {}
    import zarr

    with pytest.raises(zarr.errors.GroupNotFoundError):
        _open_s3_zarr(endpoint, "killed/ndvi.zarr")

    staging = zarr.open_group(f"s3://{BUCKET}/killed/ndvi.zarr.partial", mode="r", use_consolidated=False,
                              storage_options=_storage_options(endpoint))
    assert staging.attrs.get("rasterflow_complete") is False
    finished_before = len(_objects(endpoint, markers))
    assert 0 < finished_before < 64

    code, output = _run(spec)
    assert code == 0, output
    assert "skipped" in output or "resum" in output
    ds = _open_s3_zarr(endpoint, "killed/ndvi.zarr")
    assert ds.attrs["rasterflow_complete"] is True
    np.testing.assert_array_equal(ds["ndvi"].values, local_run)
    assert_same(ds["ndvi"].values, reference)
    assert _objects(endpoint, "killed/ndvi.zarr.partial/") == {}


# ---- the writers on S3, directly (faults a real server does not produce on demand) -----------------------------


def _dataset(value: float, chunk: int):
    import dask.array as da
    import rioxarray  # noqa: F401
    from rasterio.transform import from_origin

    data = da.full((64, 64), value, dtype="float32", chunks=chunk)
    ds = xr.Dataset({"ndvi": (("y", "x"), data)},
                    coords={"y": 500_000 - 5 - 10 * np.arange(64), "x": 300_000 + 5 + 10 * np.arange(64)})
    ds = ds.rio.write_crs("EPSG:32633").rio.write_transform(from_origin(300_000, 500_000, 10, 10))
    return ds


def test_s3_zarr_copied_into_place_completeness_last_and_replaced_only_when_complete(s3_env, monkeypatch):
    import dask

    from rasterflow.errors import RunFailedError
    from rasterflow.write import zarr as zarr_writer

    endpoint = s3_env
    url = f"s3://{BUCKET}/direct/a.zarr"
    with dask.config.set(scheduler="synchronous"):
        zarr_writer.write_zarr(_dataset(1.0, 16), url, fingerprint="job-1")
        old = _objects(endpoint, "direct/a.zarr/")
        assert any(k.endswith("/ndvi/0.0") for k in old) and "direct/a.zarr/.zmetadata" in old

        # a replacement (other chunks) cut short just before completeness is written: the old output's
        # consolidated metadata is gone, the prefix says "job-2, unfinished", the staging store is kept
        def cut(store, zarr_format):
            raise OSError("connection lost")

        with monkeypatch.context() as patched:
            patched.setattr(zarr_writer, "_finish", cut)
            with pytest.raises(RunFailedError, match="connection lost"):
                zarr_writer.write_zarr(_dataset(2.0, 32), url, fingerprint="job-2", overwrite=True)
        keys = _objects(endpoint, "direct/a.zarr/")
        assert "direct/a.zarr/.zmetadata" not in keys
        assert not [k for k in keys if k.endswith(("/ndvi/3.3", "/ndvi/0.2"))]  # the old layout's chunks are gone
        with pytest.raises(ValueError, match="zmetadata"):  # no consolidated metadata: not complete
            _open_s3_zarr(endpoint, "direct/a.zarr")
        from rasterflow.write.common import read_zarr_state

        state = read_zarr_state(url)
        assert state is not None and state.fingerprint == "job-2" and not state.complete
        assert _objects(endpoint, "direct/a.zarr.partial/")

        # the same job again (overwrite: false): resumes, nothing recomputed, copied and completed
        result = zarr_writer.write_zarr(_dataset(2.0, 32), url, fingerprint="job-2")
    assert result.blocks_written == 0 and result.blocks_skipped == 4
    ds = _open_s3_zarr(endpoint, "direct/a.zarr")
    np.testing.assert_array_equal(ds["ndvi"].values, np.full((64, 64), 2.0, dtype="float32"))
    assert ds["ndvi"].encoding["chunks"] == (32, 32)
    assert _objects(endpoint, "direct/a.zarr.partial/") == {}


def test_cog_upload_is_checked_and_a_corrupt_upload_is_deleted(s3_env, tmp_path, monkeypatch):
    import fsspec.core

    from rasterflow.errors import OutputExistsError, RunFailedError
    from rasterflow.write.common import upload_verified

    endpoint = s3_env
    local = tmp_path / "file.tif"
    local.write_bytes(os.urandom(300_000))
    url = f"s3://{BUCKET}/checked/file.tif"
    checksum = upload_verified(str(local), url, replace=False)
    body = _client(endpoint).get_object(Bucket=BUCKET, Key="checked/file.tif")["Body"].read()
    assert body == local.read_bytes() and checksum == "1220" + hashlib.sha256(body).hexdigest()
    with pytest.raises(OutputExistsError):  # never replaced unless asked
        upload_verified(str(local), url, replace=False)
    # a multipart upload (11 MiB in 5 MiB parts): its ETag is no MD5, so the object is downloaded and hashed
    big = tmp_path / "big.tif"
    big.write_bytes(os.urandom(11 * 2**20))
    checksum = upload_verified(str(big), f"s3://{BUCKET}/checked/big.tif", replace=False, part_size=5 * 2**20)
    head = _client(endpoint).head_object(Bucket=BUCKET, Key="checked/big.tif")
    assert head["ETag"].strip('"').endswith("-3") and head["ContentLength"] == 11 * 2**20
    assert checksum == "1220" + hashlib.sha256(big.read_bytes()).hexdigest()

    # a transfer that loses bytes (a broken proxy) is caught by the size check, and the object deleted
    fs, _ = fsspec.core.url_to_fs(url)  # the cached instance upload_verified uses too
    real_put = fs.put_file

    def lossy_put(lpath, rpath, *args, **kwargs):
        short = tmp_path / "short.tif"
        short.write_bytes(Path(lpath).read_bytes()[:-10])
        return real_put(str(short), rpath, *args, **kwargs)

    monkeypatch.setattr(fs, "put_file", lossy_put)
    with pytest.raises(RunFailedError, match="bytes arrived instead of 300000"):
        upload_verified(str(local), f"s3://{BUCKET}/checked/lossy.tif", replace=True)
    assert _objects(endpoint, "checked/lossy.tif") == {}

    # same size, other bytes (ETag mismatch -> re-download -> SHA2-256 mismatch)
    def flipping_put(lpath, rpath, *args, **kwargs):
        data = bytearray(Path(lpath).read_bytes())
        data[1000] ^= 0xFF
        flipped = tmp_path / "flipped.tif"
        flipped.write_bytes(bytes(data))
        return real_put(str(flipped), rpath, *args, **kwargs)

    monkeypatch.setattr(fs, "put_file", flipping_put)
    with pytest.raises(RunFailedError, match="SHA2-256"):
        upload_verified(str(local), f"s3://{BUCKET}/checked/flipped.tif", replace=True)
    assert _objects(endpoint, "checked/flipped.tif") == {}


def test_s3_zarr_v3_unfinished_copy_does_not_open_consolidated_then_finishes(s3_env, monkeypatch):
    import dask

    from rasterflow.errors import RunFailedError
    from rasterflow.write import zarr as zarr_writer

    endpoint = s3_env
    url = f"s3://{BUCKET}/direct/v3.zarr"

    def cut(store, zarr_format):
        raise OSError("connection lost")

    with dask.config.set(scheduler="synchronous"):
        with monkeypatch.context() as patched:
            patched.setattr(zarr_writer, "_finish", cut)
            with pytest.raises(RunFailedError):
                zarr_writer.write_zarr(_dataset(3.0, 32), url, fingerprint="v3-job", zarr_format=3)
        keys = _objects(endpoint, "direct/v3.zarr/")
        assert "direct/v3.zarr/zarr.json" in keys and any("/ndvi/c/" in k for k in keys)  # copied, not finished
        with pytest.raises(ValueError, match="Consolidated metadata requested"):
            _open_s3_zarr(endpoint, "direct/v3.zarr")
        result = zarr_writer.write_zarr(_dataset(3.0, 32), url, fingerprint="v3-job", zarr_format=3)
    assert result.blocks_skipped == 4 and result.blocks_written == 0
    ds = _open_s3_zarr(endpoint, "direct/v3.zarr")
    assert ds.attrs["rasterflow_complete"] is True
    np.testing.assert_array_equal(ds["ndvi"].values, np.full((64, 64), 3.0, dtype="float32"))


def test_sigkill_during_an_s3_cog_write_uploads_nothing_and_a_rerun_writes_it(sample, tmp_path, s3_env, local_run):
    import tempfile

    import rasterio

    endpoint = s3_env
    spec = _spec(sample, tmp_path / "cog.yaml", output=f"s3://{BUCKET}/killed-cog/ndvi.tif",
                 chunks="{time: -1, y: 32, x: 32}", cluster="{n_workers: 1, threads_per_worker: 1, memory_limit: 2GB}")
    proc = subprocess.Popen([sys.executable, "-m", "rasterflow", "run", str(spec)], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = Path(tempfile.gettempdir())
    deadline = time.monotonic() + 120
    scratch: list[Path] = []
    try:
        while time.monotonic() < deadline:  # the client is streaming blocks into its local scratch file
            scratch = [d for d in base.glob(f"rasterflow-cog-{proc.pid}-*") if any(d.glob("*rasterflow-stream*"))]
            if scratch:
                break
            assert proc.poll() is None, proc.stdout.read().decode()
            time.sleep(0.02)
        else:
            pytest.fail("the COG write did not start within 120 s")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()  # the pipe's file: unclosed, a ResourceWarning (an error under filterwarnings)
    assert _objects(endpoint, "killed-cog/") == {}  # nothing reached the bucket
    assert scratch[0].exists()  # what a SIGKILL leaves: local scratch files only

    code, output = _run(spec)
    assert code == 0, output
    assert not scratch[0].exists()  # the dead run's scratch directory is cleaned up by the next remote write
    with rasterio.Env(**_gdal_s3(endpoint)), rasterio.open(f"/vsis3/{BUCKET}/killed-cog/ndvi.tif") as src:
        np.testing.assert_array_equal(src.read(1, masked=True).filled(np.nan), local_run)


def test_an_s3_cog_is_recognised_as_ours_by_its_uploaded_report(sample, tmp_path, s3_env):
    endpoint = s3_env
    spec = _spec(sample, tmp_path / "skip.yaml", output=f"s3://{BUCKET}/skip/ndvi.tif, if_exists: skip")
    code, output = _run(spec)
    assert code == 0, output
    before = _objects(endpoint, "skip/")
    assert "skip/ndvi.tif" in before and "skip/ndvi.tif.report.json" in before
    report = json.loads(_client(endpoint).get_object(Bucket=BUCKET, Key="skip/ndvi.tif.report.json")["Body"].read())
    assert report["status"] == "ok" and report["fingerprint"]
    code, output = _run(spec)  # the same job again: up to date, nothing rewritten
    assert code == 0 and "up to date" in output, output
    assert _objects(endpoint, "skip/")["skip/ndvi.tif"] == before["skip/ndvi.tif"]
    result = CliRunner().invoke(cli, ["run", str(spec), "--overwrite"])  # ours, so it may be replaced
    assert result.exit_code == 0, result.output


# ---- output.tiling to object storage (issue 13, step 3) -----------------------------------------------------------


def test_tiles_written_to_s3_each_complete_with_its_item_the_collection_and_the_vrt(sample, tmp_path, s3_env,
                                                                                     reference):
    """COG tiles and Zarr v3 (sharded) tiles at an s3:// output: every tile object equals its window of the NumPy
    reference, each has its STAC Item, the Collection lists them, the COG mosaic VRT opens through /vsis3/ and equals
    the whole grid, and no staging object is left. A rerun of the same job writes nothing again."""
    import rasterio

    endpoint = s3_env
    size = 128  # the 256² sample: 2 x 2 tiles of 2 x 2 chunks
    for name, output in (("cog", f"s3://{BUCKET}/tiled/ndvi.tif"), ("zarr", f"s3://{BUCKET}/tiled/ndvi.zarr")):
        options = f"tiling: {{size: {size}}}" + (", zarr_format: 3, zarr_shards: 2" if name == "zarr" else "")
        text = spec_text(sample, reduce="{method: median}", output=output, chunks="{time: -1, y: 64, x: 64}")
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(text.replace(f"output: {{path: {output}}}", f"output: {{path: {output}, {options}}}"))
        code, text_out = _run(spec)
        assert code == 0, text_out
    keys = _objects(endpoint, "tiled/")
    tiles = [f"{r:03d}_{c:03d}" for r in range(2) for c in range(2)]
    for tile in tiles:
        rows, cols = (int(v) for v in tile.split("_"))
        want = reference[rows * size:(rows + 1) * size, cols * size:(cols + 1) * size]
        with rasterio.Env(**_gdal_s3(endpoint)), rasterio.open(f"/vsis3/{BUCKET}/tiled/ndvi/{tile}.tif") as src:
            assert src.tags(ns="IMAGE_STRUCTURE").get("LAYOUT") == "COG"
            assert_same(src.read(1, masked=True).filled(np.nan), want)
        ds = _open_s3_zarr(endpoint, f"tiled/ndvi/{tile}.zarr")
        assert ds.attrs["rasterflow_complete"] is True
        assert_same(ds["ndvi"].values, want)
        assert f"tiled/ndvi/{tile}.tif.stac-item.json" in keys and f"tiled/ndvi/{tile}.zarr.stac-item.json" in keys
        # 2 x 2 chunks of 64² in one shard object per tile
        assert [k for k in keys if k.startswith(f"tiled/ndvi/{tile}.zarr/ndvi/c/")] == [
            f"tiled/ndvi/{tile}.zarr/ndvi/c/0/0"]
    collections = [k for k in keys if k.endswith("stac-collection.json")]
    assert collections, keys
    for key in collections:
        collection = json.loads(_client(endpoint).get_object(Bucket=BUCKET, Key=key)["Body"].read())
        assert len([link for link in collection["links"] if link["rel"] == "item"]) == len(tiles)
    with rasterio.Env(**_gdal_s3(endpoint)), rasterio.open(f"/vsis3/{BUCKET}/tiled/ndvi.vrt") as mosaic:
        assert_same(mosaic.read(1, masked=True).filled(np.nan), reference)
    assert not [k for k in keys if ".partial" in k or "/.rasterflow/done" in k or "rasterflow-" in k], keys
    # what stays: each tile's marker (whose job wrote it, and that it is done), beside the tiles
    markers = sorted(k for k in keys if "/.rasterflow/" in k)
    assert markers == sorted(f"tiled/ndvi/.rasterflow/{t}.{ext}.json" for t in tiles for ext in ("tif", "zarr"))
    for key in markers:
        assert json.loads(_client(endpoint).get_object(Bucket=BUCKET, Key=key)["Body"].read())["state"] == "done"

    before = _objects(endpoint, "tiled/")
    spec = tmp_path / "cog.yaml"
    spec.write_text(spec.read_text().replace("tiling: {size: 128}", "tiling: {size: 128}, if_exists: skip"))
    code, text_out = _run(spec)
    assert code == 0, text_out
    after = _objects(endpoint, "tiled/")
    assert {k: v for k, v in after.items() if k.endswith(".tif")} == {
        k: v for k, v in before.items() if k.endswith(".tif")}  # no tile uploaded again

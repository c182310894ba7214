"""The budget's charge for open source files follows their codec: libtiff keeps a ZSTD decoder's state (~0.84 MB)
per open file, a DEFLATE one ~0.27 MB (benchmarks/README.md). The codec comes from the header the planner reads
(no pixels); unknown stays at the old, ZSTD-sized charge. Local tiled files that rasterflow.read.tiles decodes
keep no decoder, whatever their codec, and are charged that."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import SAMPLE_DATES, SAMPLE_SIZE, spec_text
from rasterflow import budget


def _inputs(**changes) -> budget.BudgetInputs:
    base = budget.BudgetInputs(grid_shape=(1024, 1024), n_time=36, time_source="search", chunk_time=-1, chunk_y=512,
                               chunk_x=512, dtype="float32", threads_per_worker=1, n_workers=2,
                               memory_limit=4 * 10**9, limit_source="spec", gdal_cachemax=0, max_fraction=0.5)
    return dataclasses.replace(base, **changes)


def test_files_decoded_by_the_tile_path_are_charged_without_a_decoder():
    for codec in ("ZSTD", "DEFLATE"):
        decoded = budget.open_file_bytes(_inputs(local_files=True, source_codec=codec, tile_decoder=True))
        assert decoded == budget.TILE_DECODED_FILE_BYTES < budget.LOCAL_FILE_BYTES_BY_CODEC[codec] / 2
    # remote files are always GDAL's to read
    assert budget.open_file_bytes(_inputs(source_codec="ZSTD", tile_decoder=True)) == (
        budget.LOCAL_FILE_BYTES + budget.VSI_CACHE_BYTES)


def test_open_file_bytes_by_codec_local_and_remote():
    assert budget.open_file_bytes(_inputs(local_files=True)) == budget.LOCAL_FILE_BYTES  # unknown codec
    assert budget.open_file_bytes(_inputs(local_files=True, source_codec="ZSTD")) == budget.LOCAL_FILE_BYTES
    deflate = budget.open_file_bytes(_inputs(local_files=True, source_codec="deflate"))
    assert deflate == budget.LOCAL_FILE_BYTES_BY_CODEC["DEFLATE"] < budget.LOCAL_FILE_BYTES / 2
    assert budget.open_file_bytes(_inputs(local_files=True, source_codec="JPEG")) == budget.LOCAL_FILE_BYTES
    assert budget.open_file_bytes(_inputs()) == budget.OPEN_FILE_BYTES  # remote, unknown
    assert budget.open_file_bytes(_inputs(source_codec="DEFLATE")) == deflate + budget.VSI_CACHE_BYTES


@pytest.fixture(scope="module")
def deflate_sample(tmp_path_factory):
    from rasterflow.sample import generate_sample

    return generate_sample(tmp_path_factory.mktemp("deflate"), size=SAMPLE_SIZE, n_dates=SAMPLE_DATES, blocksize=128,
                           compress="DEFLATE")


@pytest.mark.parametrize("decoder", ["tiles", "gdal"])
def test_the_plan_reads_the_codec_from_a_header_and_charges_it(sample, deflate_sample, tmp_path, monkeypatch, decoder):
    from rasterflow.read import tiles
    from rasterflow.commands import plan_command
    from rasterflow.spec import load_spec

    if decoder == "gdal":
        monkeypatch.setenv(tiles.ENV_SWITCH, "gdal")
    reports = {}
    for name, catalog in (("zstd", sample), ("deflate", deflate_sample)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(spec_text(catalog, reduce="{method: median}"))
        plan = plan_command(load_spec(path)).plan
        reports[name] = plan.report
    zstd, deflate = reports["zstd"], reports["deflate"]
    assert zstd.inputs.source_codec == "ZSTD" and deflate.inputs.source_codec == "DEFLATE"
    assert zstd.inputs.local_files and deflate.inputs.local_files
    if decoder == "tiles":
        assert zstd.inputs.tile_decoder and deflate.inputs.tile_decoder
        assert zstd.open_files_bytes == deflate.open_files_bytes > 0
        assert zstd.open_files_bytes % budget.TILE_DECODED_FILE_BYTES == 0
        return
    assert not zstd.inputs.tile_decoder
    files = zstd.open_files_bytes // budget.LOCAL_FILE_BYTES
    assert files > 0 and zstd.open_files_bytes == files * budget.LOCAL_FILE_BYTES
    assert deflate.open_files_bytes == files * budget.LOCAL_FILE_BYTES_BY_CODEC["DEFLATE"]
    assert zstd.peak_per_worker - deflate.peak_per_worker == zstd.open_files_bytes - deflate.open_files_bytes


def test_no_gdal_cache_is_charged_when_every_read_decodes_its_own_tiles(sample, tmp_path, monkeypatch):
    """Direct local reads through rasterflow.read.tiles never go through GDAL's block cache, so it stays empty;
    with the decoder switched off the same plan charges the cache it fills."""
    from rasterflow.read import tiles
    from rasterflow.commands import plan_command
    from rasterflow.spec import load_spec

    path = tmp_path / "s.yaml"
    path.write_text(spec_text(sample, reduce="{method: median}",
                              cluster="{n_workers: 1, threads_per_worker: 1, gdal_cachemax: 64MB}"))
    decoded = plan_command(load_spec(path)).plan.report
    monkeypatch.setenv(tiles.ENV_SWITCH, "gdal")
    by_gdal = plan_command(load_spec(path)).plan.report
    assert decoded.inputs.tile_decoder and not by_gdal.inputs.tile_decoder
    assert decoded.gdal_cache_bytes == 0 < by_gdal.gdal_cache_bytes
    assert by_gdal.peak_per_worker - decoded.peak_per_worker >= by_gdal.gdal_cache_bytes

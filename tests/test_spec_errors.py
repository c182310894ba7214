"""A battery of bad specs: each exits 2 with file:line naming the field, no traceback, and writes nothing."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from rasterflow.cli import cli
from rasterflow.errors import SpecError
from rasterflow.spec import load_spec

GOOD = textwrap.dedent(
    """\
    version: 1
    name: test-ndvi
    source:
      stac:
        catalog: items.json
        collections: [sentinel-2-l2a]
        bbox: [13.0, 52.3, 13.8, 52.7]
        datetime: 2024-06-01/2024-08-31
        query: {"eo:cloud_cover": {lt: 40}}
        max_items: 20
      assets: {red: red, nir: nir, scl: scl}
    grid:
      crs: EPSG:32633
      resolution: 10
      bounds: [380000, 5819760, 390240, 5830000]
      dtype: float32
    chunks: {time: -1, y: 512, x: 512}
    mask: "scl in (3, 8, 9, 10)"
    bands:
      ndvi: "(nir - red) / (nir + red)"
    reduce:
      over: time
      method: median
    output:
      path: out/ndvi.zarr
      overwrite: false
    cluster:
      n_workers: 2
      threads_per_worker: 1
      memory_limit: 4GB
    """
)


def _replace(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new, 1)


# (id, text, expected field in the message, expected line number or None for file-level problems)
BAD_SPECS = [
    ("version-missing", _replace("version: 1\n", ""), "version", 1),
    ("version-2", _replace("version: 1", "version: 2"), "version", 1),
    ("version-string", _replace("version: 1", "version: one"), "version", 1),
    ("name-uppercase", _replace("name: test-ndvi", "name: Test NDVI"), "name", 2),
    ("name-number", _replace("name: test-ndvi", "name: 12"), "name", 2),
    ("unknown-top-key", GOOD + "outptu: {}\n", "outptu", 31),
    ("misspelled-chunks", _replace("chunks:", "chunk:"), "chunk", 17),
    ("unknown-key-in-grid", _replace("  dtype: float32", "  dtyp: float32"), "grid.dtyp", 16),
    ("unknown-key-in-stac", _replace("    max_items: 20", "    max_item: 20"), "source.stac.max_item", 10),
    ("duplicate-top-key", GOOD + "name: other\n", "name", 31),
    ("duplicate-nested-key", _replace("  resolution: 10", "  resolution: 10\n  resolution: 20"), "grid.resolution", 15),
    ("missing-source", re.sub(r"source:\n(  .*\n)+", "", GOOD), "source", None),
    ("missing-grid", re.sub(r"grid:\n(  .*\n)+", "", GOOD), "grid", None),
    ("missing-bands", re.sub(r"bands:\n(  .*\n)+", "", GOOD), "bands", None),
    ("missing-output-path", _replace("  path: out/ndvi.zarr\n", ""), "output.path", 24),
    ("bbox-three-numbers", _replace("[13.0, 52.3, 13.8, 52.7]", "[13.0, 52.3, 13.8]"), "source.stac.bbox", 7),
    ("bbox-west-east-swapped", _replace("[13.0, 52.3, 13.8, 52.7]", "[13.8, 52.3, 13.0, 52.7]"), "source.stac.bbox", 7),
    ("bbox-latitude-out-of-range", _replace("[13.0, 52.3, 13.8, 52.7]", "[13.0, 52.3, 13.8, 95]"), "source.stac.bbox", 7),
    ("bbox-string", _replace("[13.0, 52.3, 13.8, 52.7]", "[13.0, '52.3', 13.8, 52.7]"), "source.stac.bbox", 7),
    ("datetime-bad-month", _replace("2024-06-01/2024-08-31", "2024-13-01/2024-08-31"), "source.stac.datetime", 8),
    ("datetime-reversed", _replace("2024-06-01/2024-08-31", "2024-08-31/2024-06-01"), "source.stac.datetime", 8),
    ("datetime-bad-duration", _replace("2024-06-01/2024-08-31", "P30X"), "source.stac.datetime", 8),
    ("query-unknown-operator", _replace("{lt: 40}", "{less: 40}"), "source.stac.query", 9),
    ("max-items-zero", _replace("max_items: 20", "max_items: 0"), "source.stac.max_items", 10),
    ("collections-empty", _replace("[sentinel-2-l2a]", "[]"), "source.stac.collections", 6),
    ("asset-name-not-identifier", _replace("{red: red,", "{red-band: red,"), "source.assets", 11),
    ("crs-not-epsg", _replace("crs: EPSG:32633", "crs: UTM33"), "grid.crs", 13),
    ("resolution-negative", _replace("resolution: 10", "resolution: -10"), "grid.resolution", 14),
    ("resolution-string", _replace("resolution: 10", "resolution: ten"), "grid.resolution", 14),
    ("bounds-inverted", _replace("[380000, 5819760, 390240, 5830000]", "[390240, 5819760, 380000, 5830000]"),
     "grid.bounds", 15),
    ("dtype-int16", _replace("dtype: float32", "dtype: int16"), "grid.dtype", 16),
    ("group-by-with-time-chunked", _replace("  assets: {red: red, nir: nir, scl: scl}",
                                            "  assets: {red: red, nir: nir, scl: scl}\n  group_by: solar_day")
     .replace("time: -1, y: 512", "time: 4, y: 512"), "chunks.time", 18),
    ("group-by-unknown", _replace("  assets: {red: red, nir: nir, scl: scl}",
                                  "  assets: {red: red, nir: nir, scl: scl}\n  group_by: day"), "source.group_by", 12),
    ("chunk-zero", _replace("y: 512", "y: 0"), "chunks.y", 17),
    ("chunk-negative", _replace("x: 512", "x: -4"), "chunks.x", 17),
    ("chunk-string", _replace("y: 512", "y: '512'"), "chunks.y", 17),
    ("chunk-float", _replace("y: 512", "y: 512.5"), "chunks.y", 17),
    ("chunk-unknown-axis", _replace("x: 512}", "x: 512, z: 4}"), "chunks.z", 17),
    ("mask-unknown-name", _replace('"scl in (3, 8, 9, 10)"', '"scls in (3, 8, 9, 10)"'), "mask", 18),
    ("mask-not-boolean", _replace('"scl in (3, 8, 9, 10)"', '"scl + 1"'), "mask", 18),
    ("band-unknown-name", _replace('"(nir - red) / (nir + red)"', '"(nri - red) / (nir + red)"'), "bands.ndvi", 20),
    ("band-syntax-error", _replace('"(nir - red) / (nir + red)"', '"(nir - red / (nir + red)"'), "bands.ndvi", 20),
    ("band-hostile", _replace('"(nir - red) / (nir + red)"', "\"__import__('os').system('touch pwned')\""),
     "bands.ndvi", 20),
    ("band-not-string", _replace('"(nir - red) / (nir + red)"', "[nir, red]"), "bands.ndvi", 20),
    ("band-collides-with-asset", _replace('  ndvi: "(nir - red) / (nir + red)"', '  red: "nir * 2"'), "bands.red", 20),
    ("band-uses-later-band", _replace('  ndvi: "(nir - red) / (nir + red)"', '  a: "b * 2"\n  b: "nir"'), "bands.a", 20),
    ("reduce-unknown-method", _replace("method: median", "method: medain"), "reduce.method", 23),
    ("quantile-without-q", _replace("method: median", "method: quantile"), "reduce.method", 23),
    ("quantile-q-out-of-range", _replace("method: median", "method: quantile\n  q: 1.5"), "reduce.q", 24),
    ("q-without-quantile", _replace("method: median", "method: median\n  q: 0.5"), "reduce.q", 24),
    ("reduce-over-unknown-dim", _replace("over: time", "over: tme"), "reduce.over", 22),
    ("reduce-period-week", _replace("method: median", "method: median\n  period: week"), "reduce.period", 24),
    ("format-extension-mismatch", _replace("path: out/ndvi.zarr", "path: out/ndvi.zarr\n  format: cog"), "output.format", 26),
    ("unknown-extension", _replace("path: out/ndvi.zarr", "path: out/ndvi.nc"), "output.path", 25),
    ("compression-lzw-for-zarr", _replace("overwrite: false", "overwrite: false\n  compression: lzw"),
     "output.compression", 27),
    ("overwrite-string", _replace("overwrite: false", "overwrite: maybe"), "output.overwrite", 26),
    ("zarr-shards-on-format-2", _replace("overwrite: false", "overwrite: false\n  zarr_shards: 4"),
     "output.zarr_shards", 27),
    ("zarr-shards-on-cog", _replace("path: out/ndvi.zarr", "path: out/ndvi.tif\n  zarr_shards: 1"),
     "output.zarr_shards", 26),
    ("zarr-shards-zero", _replace("overwrite: false", "overwrite: false\n  zarr_format: 3\n  zarr_shards: 0"),
     "output.zarr_shards", 28),
    ("threads-zero", _replace("threads_per_worker: 1", "threads_per_worker: 0"), "cluster.threads_per_worker", 29),
    ("memory-limit-garbage", _replace("memory_limit: 4GB", "memory_limit: lots"), "cluster.memory_limit", 30),
    ("address-not-url", GOOD + "  address: my-scheduler\n", "cluster.address", 31),
    ("budget-fraction-above-one", GOOD + "budget: {max_fraction: 1.5}\n", "budget.max_fraction", 31),
    ("section-is-a-list", _replace("chunks: {time: -1, y: 512, x: 512}", "chunks: [512, 512]"), "chunks", 17),
    ("empty-file", "", "", None),
    ("only-comments", "# nothing here\n", "", None),
    ("top-level-list", "- version: 1\n- name: x\n", "", 1),
    ("top-level-scalar", "just a string\n", "", 1),
    ("tab-indentation", _replace("  crs: EPSG:32633", "\tcrs: EPSG:32633"), "", 13),
    ("yaml-syntax-error", _replace("bbox: [13.0, 52.3, 13.8, 52.7]", "bbox: [13.0, 52.3, 13.8, 52.7"), "", None),
    ("two-documents", GOOD + "---\nversion: 1\n", "", 31),
    ("python-object-tag", _replace("name: test-ndvi", "name: !!python/object/apply:os.system ['touch pwned']"),
     "name", 2),
    ("alias-bomb", "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
     + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 10) + "]\n" for i in range(8)),
     "", None),
]


def _run_validate(tmp_path: Path, text: str) -> tuple[int, str, list[str]]:
    spec = tmp_path / "bad.yaml"
    spec.write_text(text)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = CliRunner().invoke(cli, ["validate", str(spec)], catch_exceptions=False)
    after = sorted(p.name for p in tmp_path.rglob("*"))
    assert before == after, "validate must not write anything"
    return result.exit_code, result.output, after


def test_good_spec_is_valid(tmp_path):
    spec = tmp_path / "good.yaml"
    spec.write_text(GOOD)
    loaded = load_spec(spec)
    assert loaded.spec.chunks.y == 512
    assert loaded.spec.output.resolved_format == "zarr"
    assert loaded.where("chunks", "y") == f"{spec}:17:20"
    assert loaded.where("grid", "crs") == f"{spec}:13:3"


def test_battery_is_large_enough():
    assert len(BAD_SPECS) >= 40
    assert len({case[0] for case in BAD_SPECS}) == len(BAD_SPECS)


@pytest.mark.parametrize("case_id,text,field,line", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_spec_exits_2_with_location(tmp_path, case_id, text, field, line):
    code, output, files = _run_validate(tmp_path, text)
    assert code == 2, output
    assert "Traceback" not in output
    assert "pwned" not in files
    spec_path = str(tmp_path / "bad.yaml")
    first = output.strip().splitlines()[0]
    assert first.startswith(spec_path), output
    if line is not None:
        assert f"{spec_path}:{line}:" in output, output
    if field:
        assert re.search(rf":\d+:\d+: {re.escape(field)}\b", output) or f": {field}:" in output, output


def test_all_errors_of_a_file_are_reported_at_once(tmp_path):
    text = _replace("y: 512", "y: 0")
    text = text.replace("resolution: 10", "resolution: -1").replace("method: median", "method: medain")
    text = text.replace('"(nir - red) / (nir + red)"', '"(nri - red) / (nir + red)"')
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, text))
    fields = [issue.field for issue in info.value.issues]
    assert fields == ["grid.resolution", "chunks.y", "bands.ndvi", "reduce.method"]
    lines = [issue.line for issue in info.value.issues]
    assert lines == sorted(lines)


def test_message_says_what_to_change(tmp_path):
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, _replace("y: 512", "y: 0")))
    assert str(info.value) == f"{tmp_path / 'bad.yaml'}:17:20: chunks.y: must be a positive integer or -1 (got 0)"
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, _replace("chunks:", "chunk:")))
    assert "unknown key 'chunk'; did you mean 'chunks'?" in str(info.value)
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, _replace('"(nir - red) / (nir + red)"', '"(nri - red) / (nir + red)"')))
    message = str(info.value)
    assert "nri" in message and "nir" in message and "^" in message


def test_huge_file_refused_fast(tmp_path):
    import time

    path = tmp_path / "huge.yaml"
    path.write_text(GOOD + "#" + "x" * (3 * 1024 * 1024) + "\n")
    start = time.perf_counter()
    with pytest.raises(SpecError, match="MB"):
        load_spec(path)
    assert time.perf_counter() - start < 1.0


def test_alias_bomb_refused_fast(tmp_path):
    import tracemalloc

    bomb = next(case[1] for case in BAD_SPECS if case[0] == "alias-bomb")
    path = _write(tmp_path, bomb)
    tracemalloc.start()
    try:
        with pytest.raises(SpecError, match="alias bomb"):
            load_spec(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # refused before expanding: the expansion would be ~10^9 nodes (GBs); memory, unlike time, does not depend on
    # the machine's load
    assert peak < 64 * 2**20, peak


def test_missing_file(tmp_path):
    result = CliRunner().invoke(cli, ["validate", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "no such file" in result.output


def test_many_files_worst_exit_code(tmp_path):
    good = _write(tmp_path, GOOD, "good.yaml")
    bad = _write(tmp_path, _replace("y: 512", "y: 0"), "bad.yaml")
    result = CliRunner().invoke(cli, ["validate", str(good), str(bad)])
    assert result.exit_code == 2
    assert f"ok   {good}" in result.output
    assert f"{bad}:17:20: chunks.y" in result.output


def test_no_traceback_in_a_real_process(tmp_path):
    bad = _write(tmp_path, _replace("resolution: 10", "resolution: ten"))
    proc = subprocess.run([sys.executable, "-m", "rasterflow", "validate", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert f"{bad}:14:3: grid.resolution: must be a number (got 'ten')" in proc.stderr


def _write(tmp_path: Path, text: str, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("section, line, allowed", [
    ("tiling", "tiling: {size: 512, sise: 1}", "size"),
    ("encoding", "encoding: {dtyp: int16}", "dtype"),
    ("cog", "cog: {blocksise: 512}", "blocksize"),
])
def test_unknown_nested_output_keys_list_what_is_allowed(tmp_path, section, line, allowed):
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, _replace("  overwrite: false", f"  {line}")))
    message = str(info.value)
    assert f"output.{section}" in message and f"(allowed in output.{section}:" in message, message
    assert allowed in message.split("allowed in")[1], message

"""The layering of the design (ARCHITECTURE.md: a module imports only from the layers below it): planning decides
and the reader and the writers execute, so importing the planner or the budget brings in no reader, writer, catalog,
cluster or task module; the read plan's and the write plan's light parts (``rasterflow.readplan``,
``rasterflow.writeplan``) import the standard library only, so workers and ``validate`` pay nothing."""

from __future__ import annotations

import json
import subprocess
import sys


def _modules_after(statement: str) -> list[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(ran.stdout.splitlines()[-1])


def test_the_planner_imports_no_layer_above_it():
    modules = _modules_after("import rasterflow.planning")
    above = [m for m in modules if m.split(".")[:2] in (["rasterflow", "read"], ["rasterflow", "catalog"],
                                                        ["rasterflow", "cluster"], ["rasterflow", "tasks"],
                                                        ["rasterflow", "graph"], ["rasterflow", "commands"])]
    assert above == []
    assert "rasterflow.readplan" in modules


def test_the_read_plan_is_light_and_the_reader_reexports_it():
    modules = _modules_after("import rasterflow.readplan")
    assert not [m for m in modules if m.split(".")[0] in ("numpy", "rasterio", "pydantic", "aiohttp", "obstore",
                                                           "tenacity")]
    from rasterflow import readplan
    from rasterflow.read import fetch, policy, remote, tiles

    assert policy.ReadPolicy is readplan.ReadPolicy and policy.policy_from_spec is readplan.policy_from_spec
    assert remote.is_remote is readplan.is_remote and tiles.decodes is readplan.decodes
    assert fetch.supported is readplan.supported and fetch.gcs_config is readplan.gcs_config


def _writers(modules: list[str]) -> list[str]:
    return [m for m in modules if m == "rasterflow.write" or m.startswith("rasterflow.write.")]


def test_the_budget_and_the_planner_import_no_writer():
    budget = _modules_after("import rasterflow.budget")
    assert _writers(budget) == [] and "rasterflow.writeplan" in budget
    planning = _modules_after("import rasterflow.planning")
    assert _writers(planning) == [] and "rasterflow.writeplan" in planning


def test_the_write_plan_is_light_and_the_writers_reexport_it():
    modules = _modules_after("import rasterflow.writeplan")
    assert not [m for m in modules if m.split(".")[0] in ("numpy", "rasterio", "pydantic", "zarr", "dask", "xarray",
                                                           "distributed", "tifffile", "fsspec")]
    # nothing of rasterflow's beyond what the package itself imports (its public API's names)
    ours = set(_modules_after("import rasterflow"))
    assert {m for m in modules if m.startswith("rasterflow.")} - ours == {"rasterflow.writeplan"}
    from rasterflow import writeplan
    from rasterflow.budget import cogclient, paths
    from rasterflow.write import cogassembly, cogtiles, common, encoding, shards

    for name in ("SHARD_BYTES", "MAX_SHARD_SIDE", "SHARD_ABOVE_CHUNKS", "SHARDS_IN_FLIGHT", "shard_side"):
        assert getattr(shards, name) is getattr(writeplan, name), name
    for name in ("TileLayout", "fast_layout", "assembly_enabled", "level_shapes", "predictor_code",
                 "client_levels_bytes", "TIFF_COMPRESSION", "CLIENT_LEVELS_MAX_BYTES"):
        assert getattr(cogtiles, name) is getattr(writeplan, name), name
    for name in ("Encoding", "compression_name", "ENCODING_DTYPES"):
        assert getattr(encoding, name) is getattr(writeplan, name), name
        assert getattr(common, name) is getattr(writeplan, name), name
    assert cogassembly.TEMPLATE_CACHEMAX is writeplan.TEMPLATE_CACHEMAX
    assert paths.shard_side is writeplan.shard_side and cogclient.fast_layout is writeplan.fast_layout


def test_the_paths_cost_is_light_and_imports_in_either_order():
    """``rasterflow.paths`` holds each code path's cost beside its tasks' building: importing it (as the budget
    does) brings in no Dask, xarray, task, graph or reader module, nothing beyond the budget's own imports and the
    paths' modules; a path's ``build`` imports them when it runs. The budget's package re-exports the paths' names
    and the paths read the budget's constants: whichever is imported first, both are complete."""
    for statement in ("import rasterflow.paths", "import rasterflow.paths.tree", "import rasterflow.budget",
                      "import rasterflow.budget.constants", "import rasterflow.paths.common"):
        modules = _modules_after(statement + "\nimport rasterflow.paths, rasterflow.budget\n"
                                 "assert rasterflow.paths.PATHS and rasterflow.budget.paths.PATHS is rasterflow.paths.PATHS")
        assert not [m for m in modules if m.split(".")[0] in ("dask", "xarray", "distributed", "rasterio", "zarr")]
        assert not [m for m in modules if m.split(".")[:2] in (["rasterflow", "tasks"], ["rasterflow", "graph"],
                                                               ["rasterflow", "read"], ["rasterflow", "kernels"])]
    budget = set(_modules_after("import rasterflow.budget"))
    paths = set(_modules_after("import rasterflow.paths"))
    assert {m for m in paths - budget if not m.startswith("rasterflow.paths")} == set()
    assert {"rasterflow.paths.fused", "rasterflow.paths.tree", "rasterflow.paths.series"} <= budget

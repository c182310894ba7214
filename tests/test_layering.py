"""The layering of the design (ARCHITECTURE.md: a module imports only from the layers below it): planning decides
and the reader executes, so importing the planner brings in no reader, catalog, cluster or task module; the read plan's
light parts (``rasterflow.readplan``) import the standard library only, so workers and ``validate`` pay nothing."""

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

"""Each code path's cost lives beside the task that runs it (issue 28): a path's ``build`` returns its lazy variables
with their projected memory per task, counted by the same function the budget used, so it equals the budget
report's per-task figure; the budget and the graph switch on the path in one place (``rasterflow.paths.PATHS``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import spec_text
from reference import load_items

from rasterflow import budget, graph
from rasterflow.budget import paths as budget_paths
from rasterflow.paths import PATHS, common, fused, series, tree
from rasterflow.planning import make_plan
from rasterflow.sizing import WorkerLayout
from rasterflow.spec import load_spec

LAYOUT = WorkerLayout(n_workers=2, threads_per_worker=1, memory_limit=2 * 10**9, source="local")

CASES = {
    "series": dict(),
    "fused": dict(reduce="{method: median}"),
    "fused in sub-blocks": dict(reduce="{method: median, period: month}"),
    "fused, a list of statistics": dict(reduce="[{method: mean}, {method: quantile, q: 0.9}]"),
    "tree": dict(reduce="{method: mean, period: month}", chunks="{time: 3, y: 96, x: 96}"),
    "tree, std": dict(reduce="{method: std}", chunks="{time: 3, y: 96, x: 96}"),
}


def _plan(sample, tmp_path: Path, **kwargs):
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(sample, **kwargs))
    return make_plan(load_spec(spec).spec, items=load_items(sample), layout=LAYOUT)


@pytest.mark.parametrize("case", list(CASES))
def test_a_paths_build_projects_the_budgets_per_task_peak(sample, tmp_path, monkeypatch, case):
    if case == "fused in sub-blocks":  # a target below the chunk's working set: the plan's sub-blocks are counted
        monkeypatch.setattr(budget, "STRIP_TARGET_BYTES", 400_000)
    plan = _plan(sample, tmp_path, **CASES[case])
    path = case.split()[0].rstrip(",")
    assert plan.code_path == path
    assert (plan.sub_block != (0, 0)) == (case == "fused in sub-blocks")
    built = PATHS[path].build(plan)
    report = plan.report
    assert built.task_bytes == report.peak_task_bytes == max(s.bytes_per_task for s in report.stages)
    # the variables are those of the graph: build_dataset runs the path the budget chose
    dataset = graph.build_dataset(plan)
    assert sorted(built.variables) == sorted(dataset.data_vars)
    for name, (dims, array) in built.variables.items():
        assert dataset[name].dims == dims and dataset[name].data.name == array.name
    assert ("time" in built.coords) == (path == "series")


def test_the_budget_and_the_graph_switch_on_one_registry():
    assert PATHS == {"fused": fused, "tree": tree, "series": series}
    for module, stages, held in ((fused, fused.fused_stages, fused.fused_held),
                                 (tree, tree.tree_stages, tree.tree_held),
                                 (series, series.series_stages, series.series_held)):
        assert module.held is held
        name = module.__name__.rsplit(".", 1)[1]
        # the budget's names are the paths' own: one definition each, importable from where they were
        assert getattr(budget_paths, stages.__name__) is stages and getattr(budget_paths, held.__name__) is held
        assert getattr(budget, "path_task_stages") is budget_paths.path_task_stages and PATHS[name] is module
    for name in ("item_stages", "ItemTerms", "write_extra_bytes", "band_temporaries"):
        assert getattr(budget_paths, name) is getattr(common, name)
    assert budget.held_between_tasks is budget_paths.held_between_tasks


def test_the_budgets_stages_are_the_paths(monkeypatch):
    """``path_task_stages`` and ``held_between_tasks`` dispatch through PATHS: a path's functions replaced there are
    what the budget counts."""
    from rasterflow.expr import parse_expression

    ndvi = parse_expression("(nir - red) / (nir + red)", ["red", "nir"], what="band")
    shape = budget.PipelineShape(assets_loaded=("red", "nir"), mask=None, masked_assets=(), bands=(("ndvi", ndvi),),
                                 reduce_method="median", n_quantiles=0)
    inputs = budget.BudgetInputs(
        grid_shape=(1024, 1024), n_time=8, time_source="search", chunk_time=-1, chunk_y=512, chunk_x=512,
        dtype="float32", threads_per_worker=1, n_workers=1, memory_limit=8 * 10**9, limit_source="spec",
        gdal_cachemax=64 * 2**20, max_fraction=0.5)
    assert budget.code_path(shape, inputs) == "fused"

    class Fake:
        def task_stages(self, shape, inputs, task, block, *, writes=True):
            return [("fake", 123, "")]

        def held(self, shape, inputs):
            return 456

    monkeypatch.setitem(PATHS, "fused", Fake())
    task = budget.task_shapes(shape, inputs)[0]
    assert budget_paths.path_task_stages(shape, inputs, task, (0, 0)) == [("fake", 123, "")]
    assert budget_paths.held_between_tasks(shape, inputs) == 456

"""The checks before any pixel is read: the searched items against the spec, and validate's static budget check."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rasterflow import budget
from rasterflow.errors import SpecError, SpecIssue
from rasterflow.planning.jobplan import JobPlan
from rasterflow.planning.make import local_layout, make_plan
from rasterflow.sources import MissingAsset, missing_assets

if TYPE_CHECKING:  # pragma: no cover
    from rasterflow.spec import LoadedSpec


def check_items(loaded: LoadedSpec, plan: JobPlan) -> None:
    """Check the searched items against the spec, before any pixel is read.

    Raises
    ------
    SpecError
        (exit 2) when items lack an asset key of the spec (naming the spec line, the key, the keys the items do
        have), or when the mask applies an integer-only operation to an asset the items declare as float.
    """
    from rasterflow.errors import ExpressionError

    spec = loaded.spec
    issues: list[SpecIssue] = []
    loaded_assets = {a: spec.source.assets[a] for a in plan.shape.assets_loaded}
    problems: list[MissingAsset] = missing_assets(plan.items, loaded_assets)
    for problem in problems:
        issues.append(_issue(loaded, ("source", "assets", problem.name), "source.assets." + problem.name,
                             problem.message()))
    if not problems and plan.sources is not None and plan.shape.mask is not None:
        kinds = plan.sources.kinds()
        try:
            plan.shape.mask.check_kinds({name: kinds[name] for name in plan.shape.mask.names})
        except ExpressionError as err:
            floats = [n for n in plan.shape.mask.names if kinds[n] == "float"]
            issues.append(_issue(loaded, ("mask",), "mask", f"{err}\n(the items declare {', '.join(floats)} as "
                                 "float, or do not declare their data type: set source.overrides.<name>.data_type)"))
    if issues:
        raise SpecError(issues)


def _issue(loaded: LoadedSpec, loc: tuple[str | int, ...], field: str, message: str) -> SpecIssue:
    position = loaded.positions.position_of(loc)
    return SpecIssue(str(loaded.path), position.line if position else None, position.column if position else None,
                     field, message)


def static_check(loaded: LoadedSpec) -> budget.BudgetReport:
    """The check ``validate`` runs: no network, time axis from ``max_items``.

    Raises
    ------
    BudgetExceededError
        When refused, naming the worst stage and the fixes.
    """
    plan = make_plan(loaded.spec)
    if not plan.report.ok and loaded.spec.cluster.processes == "auto" and not plan.layout.processes:
        plan = make_plan(loaded.spec, layout=local_layout(loaded.spec, processes=True))  # as run falls back to worker processes
    budget.enforce(plan.report, where=loaded.where("chunks"))
    return plan.report

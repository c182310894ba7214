"""The one switch between the code paths: :data:`PATHS`, read by the budget (a task's stages, what a worker holds
between tasks) and by :func:`rasterflow.graph.build_dataset` (the tasks it builds), under the name the budget chose
(:func:`rasterflow.budget.code_path`, :attr:`rasterflow.planning.JobPlan.code_path`).

A module of its own (not the package's ``__init__``) so that the budget can import it while the package is still
being initialised (see :mod:`rasterflow.paths`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from rasterflow.paths import fused, series, tree

if TYPE_CHECKING:
    from rasterflow.budget.model import BudgetInputs, PipelineShape, TaskShape
    from rasterflow.paths.common import PathTasks
    from rasterflow.planning import JobPlan


class CodePath(Protocol):
    """What each code path's module holds: its cost and its tasks."""

    def task_stages(self, shape: PipelineShape, inputs: BudgetInputs, task: TaskShape, block: tuple[int, int], *,
                    writes: bool = True) -> list[tuple[str, int, str]]:
        """``(stage, bytes, detail)`` of one task of ``task``'s shape on this path."""

    def held(self, shape: PipelineShape, inputs: BudgetInputs) -> int:
        """What a worker holds between this path's tasks."""

    def build(self, plan: JobPlan) -> PathTasks:
        """This path's lazy variables and their projected memory per task."""


#: The code paths by the name the budget chooses.
PATHS: dict[str, CodePath] = {"fused": fused, "tree": tree, "series": series}

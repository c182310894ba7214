"""The code paths, one module each: :mod:`~rasterflow.paths.fused`, :mod:`~rasterflow.paths.tree` and
:mod:`~rasterflow.paths.series`, what they share in :mod:`~rasterflow.paths.common`. Each path's cost lives beside
the tasks that run it: its module holds its stages (``task_stages``: what one task holds, stage by stage), what a
worker holds between its tasks (``held``) and ``build``, which makes its lazy variables from a plan and returns them
with their projected memory per task (:class:`PathTasks`), counted by the same ``task_stages`` the budget used.

The budget (:mod:`rasterflow.budget`) adds the worker-level terms, solves fixes and words messages; it chooses the
path (:func:`rasterflow.budget.code_path`) and :func:`rasterflow.graph.build_dataset` runs it: both through the one
switch, :data:`PATHS`.

Importing this package brings in no NumPy, Dask or xarray (planning reads the cost functions): a path's ``build``
imports them when it runs.
"""

from __future__ import annotations

# The budget first: its package re-exports these modules' names (rasterflow.budget.paths imports them), and these
# modules read its constants and dataclasses. Initialised in this order, whichever package is imported first, each
# module finds the ones it imports complete.
import rasterflow.budget  # noqa: F401
from rasterflow.paths.common import PathTasks
from rasterflow.paths.registry import PATHS, CodePath

__all__ = ["PATHS", "CodePath", "PathTasks"]

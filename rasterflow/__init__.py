"""rasterflow: declarative, YAML-driven raster pipelines on Dask, with a static memory budget check.

The public API is small and light to import: heavy libraries (dask, xarray, rasterio) load only where pixels are
touched. ``load_spec -> plan -> run`` (:mod:`rasterflow.api`) never print and raise :class:`RasterflowError`
subclasses; ``run`` returns a :class:`RunResult`.
"""

__version__ = "0.1.0"

import sys as _sys  # noqa: E402
import types as _types  # noqa: E402

from rasterflow.api import load_spec, plan, run  # noqa: E402
from rasterflow.errors import (  # noqa: E402
    BudgetExceededError,
    CatalogError,
    ClusterError,
    ExitCode,
    ExpressionError,
    NoItemsFoundError,
    OutputExistsError,
    OutputLockedError,
    OutputNotOursError,
    RasterflowError,
    RunFailedError,
    RunInterrupted,
    SpecError,
    UsageError,
)

__all__ = [
    "__version__",
    "load_spec",
    "plan",
    "run",
    "RunResult",
    "BudgetExceededError",
    "CatalogError",
    "ClusterError",
    "ExitCode",
    "ExpressionError",
    "NoItemsFoundError",
    "OutputExistsError",
    "OutputLockedError",
    "OutputNotOursError",
    "RasterflowError",
    "RunFailedError",
    "RunInterrupted",
    "SpecError",
    "UsageError",
]


_API: dict[str, object] = {}


class _Package(_types.ModuleType):
    """``rasterflow.plan`` and ``rasterflow.run`` are the API functions, also once the submodules of the same names
    (``rasterflow/plan.py``, ``rasterflow/run.py``) are imported.

    Importing a submodule sets it as an attribute of its package, which would replace the function with the module.
    These data descriptors keep the functions; the modules stay importable as ``from rasterflow.plan import JobPlan``
    (which reads ``sys.modules``).
    """

    plan = property(lambda self: _API["plan"], lambda self, value: _keep("plan", value))
    run = property(lambda self: _API["run"], lambda self, value: _keep("run", value))


def _keep(name: str, value) -> None:
    if not isinstance(value, _types.ModuleType):  # the submodule being imported lives in sys.modules
        _API[name] = value


_API.update(plan=plan, run=run)
del plan, run
_sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    if name == "RunResult":  # rasterflow.run (the module) is the orchestrator; the result type is light
        from rasterflow.run import RunResult

        return RunResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

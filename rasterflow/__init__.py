"""rasterflow: declarative, YAML-driven raster pipelines on Dask, with a static memory budget check.

The public API is small and light to import: heavy libraries (dask, xarray, rasterio) load only where pixels are
touched. ``load_spec -> plan -> run`` (:mod:`rasterflow.api`) never print and raise :class:`RasterflowError`
subclasses; ``run`` returns a :class:`RunResult`.
"""

__version__ = "0.1.0"

from rasterflow.api import load_spec, open, plan, run  # noqa: E402,A004
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
    "open",
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


def __getattr__(name: str) -> type:
    if name == "RunResult":  # the orchestrator (rasterflow.commands) imports more; the result type loads on use
        from rasterflow.commands import RunResult

        return RunResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

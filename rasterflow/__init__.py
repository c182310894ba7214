"""rasterflow: declarative, YAML-driven raster pipelines on Dask, with a static memory budget check.

The public API is small and light to import: heavy libraries (dask, xarray, rasterio) load only where pixels are
touched.
"""

__version__ = "0.1.0"

from rasterflow.errors import (  # noqa: E402
    BudgetExceededError,
    CatalogError,
    ClusterError,
    ExitCode,
    ExpressionError,
    NoItemsFoundError,
    OutputExistsError,
    RasterflowError,
    RunFailedError,
    SpecError,
)

__all__ = [
    "__version__",
    "BudgetExceededError",
    "CatalogError",
    "ClusterError",
    "ExitCode",
    "ExpressionError",
    "NoItemsFoundError",
    "OutputExistsError",
    "RasterflowError",
    "RunFailedError",
    "SpecError",
]

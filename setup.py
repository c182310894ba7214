"""The one compiled part of rasterflow: the sorting-network kernel of ``rasterflow.fastreduce`` (``_native.c``).

Optional: where no C compiler is found the build goes on without it and ``fastreduce`` sorts with NumPy (same
values, ~3x slower at 36 dates). Everything else is declared in ``pyproject.toml``.
"""

import sys

from setuptools import Extension, setup

compile_args = [] if sys.platform == "win32" else ["-O3", "-std=c99", "-ffp-contract=off"]

setup(ext_modules=[
    Extension("rasterflow._native", ["rasterflow/_native.c"], extra_compile_args=compile_args, optional=True),
])

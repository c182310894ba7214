"""The compiled kernels (``rasterflow/_native.c``, built by ``setup.py`` where a C compiler is found), if installed.

Every kernel there has a NumPy twin that computes the same values (the tests run both); the compiled one is only
faster. :func:`module` is None where the extension was not built or is switched off (:func:`set_enabled`, for
side-by-side benchmarks), and the callers take their NumPy path.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

__all__ = ["available", "chosen", "module", "set_enabled"]

_enabled = True


@functools.cache
def _load() -> ModuleType | None:
    try:
        return importlib.import_module("rasterflow._native")
    except ImportError:
        return None


def module() -> ModuleType | None:
    """``rasterflow._native``, or None where it is not installed (built without a C compiler) or switched off."""
    return _load() if _enabled else None


def chosen(native: bool | None) -> ModuleType | None:
    """The kernels a caller's ``native`` argument asks for: True, the compiled ones (an error where they are not
    installed); False, none (the NumPy path); None, the compiled ones where installed and switched on."""
    if native is False:
        return None
    kernels = module()
    if native and kernels is None:
        raise RuntimeError("the compiled kernels rasterflow._native are not installed (no C compiler at install?)")
    return kernels


def available() -> bool:
    """Whether the compiled kernels are installed (switched on or not)."""
    return _load() is not None


def set_enabled(enabled: bool) -> None:
    """Switch the compiled kernels on or off in this process (off: every caller takes its NumPy path)."""
    global _enabled
    _enabled = enabled

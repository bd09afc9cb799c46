"""Load a script of bench/ as a module (bench/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench(filename: str, module_name: str) -> ModuleType:
    """``bench/<filename>`` as ``module_name`` (registered in sys.modules: dataclasses and attrs
    look their module up), with bench/ on the path while it loads (its sibling modules)."""
    spec = importlib.util.spec_from_file_location(module_name, BENCH / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module

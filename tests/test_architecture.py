"""The architecture as tests: the import-linter contracts of pyproject.toml, and what importing
each sans-io module really loads.

``lint-imports`` reads the import graph statically (function-level imports included): layers, no
cycle, forbidden imports. The subprocess checks complement it at run time: a fresh interpreter
imports the module and lists what ended up in ``sys.modules``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import duplex_actors

PACKAGE = Path(duplex_actors.__file__).resolve().parent
TRIO = ("trio", "trio_websocket", "quart", "quart_trio", "hypercorn")
MODEL = ("torch", "moshi", "duplex_actors.model")
SERVER_SIDE = (
    "jsonschema",
    "duplex_actors.scheduler",
    "duplex_actors.session.actor",
    "duplex_actors.log.writer",
)


def modules_of(subpackage: str) -> list[str]:
    return sorted(
        f"duplex_actors.{subpackage}" + ("" if p.stem == "__init__" else f".{p.stem}")
        for p in (PACKAGE / subpackage).glob("*.py")
    )


# (modules imported in one fresh interpreter, what none of them may load)
RULES: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    ((m,), TRIO + MODEL + SERVER_SIDE) for m in modules_of("protocol")
]
RULES += [
    ((m,), TRIO + MODEL)
    for m in ("duplex_actors.audio", "duplex_actors.session.core", "duplex_actors.session.events")
]
RULES += [((m,), MODEL) for m in ("duplex_actors.session.actor", "duplex_actors.session.inbox")]
RULES += [((m,), TRIO + MODEL) for m in ("duplex_actors.log.segment", "duplex_actors.log.records")]
# /api/chat's codec worker processes load neither trio nor the model (only the pool is a trio shell)
RULES += [(tuple(m for m in modules_of("opus") if not m.endswith(".pool")), TRIO + MODEL)]
# The client and the model need no fresh interpreter each (the contracts check them statically
# too): one interpreter imports a group's modules in turn, and each is charged with what its own
# import added (the model's modules all load torch, ~3 s an interpreter).
RULES += [(tuple(modules_of("client")), MODEL), (tuple(modules_of("model")), TRIO)]

PROBE = """
import importlib, json, sys
found = {}
for name in sys.argv[2:]:
    before = set(sys.modules)
    importlib.import_module(name)
    found[name] = sorted(m for m in set(sys.modules) - before
                         if any(m == f or m.startswith(f + ".") for f in json.loads(sys.argv[1])))
print(json.dumps(found))
"""


@pytest.mark.parametrize(
    ("modules", "forbidden"),
    RULES,
    ids=[m[0].removeprefix("duplex_actors.") + ("" if len(m) == 1 else ".*") for m, _ in RULES],
)
def test_importing_loads_nothing_forbidden(modules: tuple[str, ...], forbidden: tuple[str, ...]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(forbidden), *modules],
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(done.stdout)
    assert sorted(found) == sorted(modules)
    assert {m: f for m, f in found.items() if f} == {}


def test_every_subpackage_module_is_covered() -> None:
    covered = {m for modules, _ in RULES for m in modules}
    for subpackage in ("protocol", "model", "client"):
        assert set(modules_of(subpackage)) <= covered
    assert "duplex_actors.protocol.parsing" in covered and "duplex_actors.model.tiny" in covered


def test_the_import_contracts_hold() -> None:
    """Layers, no cycle, forbidden imports: ``[tool.importlinter]`` in pyproject.toml."""
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint is not None, "import-linter is a dev dependency (pip install -e '.[dev]')"
    root = PACKAGE.parents[1]
    done = subprocess.run([lint, "--no-cache"], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout

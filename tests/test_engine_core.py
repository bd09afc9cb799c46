"""The engine core's start-up phases (docs/operations.md, section 4, "Start-up")."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path


def test_the_import_phase_is_where_torch_is_imported(parrot_dir: Path):
    """In a fresh interpreter, ``build_engine`` reports its ``import`` phase before anything has
    imported torch, so that the seconds torch takes to import are that phase's on /ready and in
    the log (a factory imported ahead of the phase would hide them before every phase)."""
    script = textwrap.dedent(
        """
        import json, sys
        from duplex_actors.engine_core import CoreSettings, build_engine
        from duplex_actors.model.startup import RUNNING
        seen = {}
        def sink(report):
            if report.state == RUNNING:
                seen.setdefault(report.name, "torch" in sys.modules)
        build_engine(CoreSettings(model="tiny-parrot", max_sessions=1), sink)
        print(json.dumps(seen))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    torch_imported_at_start = json.loads(out.stdout.strip().splitlines()[-1])
    assert torch_imported_at_start["import"] is False, out.stdout
    assert torch_imported_at_start["load"] is True, out.stdout

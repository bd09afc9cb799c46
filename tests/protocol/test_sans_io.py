"""The protocol package stays sans-io: importing it loads no trio, torch or model code."""

from __future__ import annotations

import json
import subprocess
import sys


def test_importing_the_protocol_loads_no_io_or_model_modules() -> None:
    code = (
        "import sys, json, duplex_actors.protocol, duplex_actors.protocol.schemas; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('trio', 'torch', 'moshi', 'jsonschema') or m.startswith('duplex_actors.model') "
        "or m.startswith('duplex_actors.scheduler') or m == 'duplex_actors.session.actor')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []

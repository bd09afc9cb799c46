"""The soak (``bench/soak.py``), briefly: opt-in with ``-m slow``.

The recorded run is 10 minutes with 16 sessions (RELIABILITY.md); this one is 40 s with 4 lanes of
5-10 s sessions, a third of them cut by an RST, so churn, abrupt disconnects, the slot count at the
end, the fds, lost frames and the replay of every log are all exercised.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


@pytest.mark.slow
def test_soak_briefly(tmp_path, parrot_dir, record):
    cmd = [sys.executable, str(SOAK), "--minutes", "0.67", "--sessions", "4", "--max-session-s", "10"]
    cmd += ["--abrupt", "0.33", "--sample-s", "5", "--out", str(tmp_path / "soak")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "soak" / "soak.json").read_text())
    record(
        sessions=report["sessions"],
        abrupt=report["sessions_abrupt"],
        frames_lost=report["frames_lost"],
        rss_mib=report["rss_mib"],
        fds=report["fds"],
        slots_in_use_end=report["slots_in_use_end"],
        replay=report["replay"]["summary"],
        checks=report["checks"],
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert report["ok"] and report["sessions"] >= 8 and report["sessions_abrupt"] >= 1

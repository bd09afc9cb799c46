"""scripts/pick-python.sh: which interpreter ./.venv is made from."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pick-python.sh"


def _pick(path: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path}
    return subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def _interpreter(exe: str) -> str:
    probe = "import sys, venv, ensurepip; print(sys.version_info[:2] == (3, 11))"
    return subprocess.run(
        [exe, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


def test_it_prints_a_python_311_that_can_create_a_venv_and_marks_it() -> None:
    done = _pick(os.environ["PATH"])
    assert done.returncode == 0, done.stderr
    chosen = done.stdout.strip()
    assert chosen.count("\n") == 0 and os.path.isabs(chosen)
    assert _interpreter(chosen) == "True"
    # every candidate is listed once, with its speed; the chosen one is marked
    lines = [line for line in done.stderr.splitlines() if line.startswith("pick-python: ")]
    marked = [line for line in lines if line.startswith("pick-python: * ")]
    assert len(marked) == 1 and f" {chosen} (3.11." in marked[0], done.stderr
    assert all(line.endswith("ns per probe step") for line in lines)
    listed = [line.split()[2] for line in lines]
    assert len(listed) == len(set(listed))


def test_a_broken_python_first_on_path_is_passed_over(tmp_path: Path) -> None:
    broken = tmp_path / "python3.11"
    broken.write_text("#!/bin/sh\necho 'not a python' >&2\nexit 1\n")
    broken.chmod(0o755)
    done = _pick(f"{tmp_path}:{os.environ['PATH']}")
    assert done.returncode == 0, done.stderr
    chosen = done.stdout.strip()
    assert chosen != str(broken)
    assert _interpreter(chosen) == "True"
    assert str(broken) not in done.stderr


def test_a_python311_name_running_another_version_is_passed_over(tmp_path: Path) -> None:
    real = _pick(os.environ["PATH"]).stdout.strip()
    other = tmp_path / "python3.11"
    # a wrapper that runs the probe on an interpreter reporting 3.12
    other.write_text(
        "#!/bin/sh\n"
        f"exec {real} -c \"import sys; sys.version_info = (3, 12, 0, 'final', 0); "
        f"sys.version = '3.12.0 (other)'\n$2\"\n"
    )
    other.chmod(0o755)
    done = _pick(f"{tmp_path}:{os.environ['PATH']}")
    assert done.returncode == 0, done.stderr
    assert "(3.12.0)" not in done.stderr
    assert _interpreter(done.stdout.strip()) == "True"


def test_a_python_that_fails_its_second_probe_keeps_its_first(tmp_path: Path) -> None:
    real = _pick(os.environ["PATH"]).stdout.strip()
    flaky = tmp_path / "python3.11"
    flag = tmp_path / "answered"
    # answers the first probe as itself, then fails
    flaky.write_text(
        "#!/bin/sh\n"
        f"if [ -f {flag} ]; then echo 'gone' >&2; exit 1; fi\n"
        f"touch {flag}\n"
        f"exec {real} -c \"import sys; sys.executable = '{flaky}'\n$2\"\n"
    )
    flaky.chmod(0o755)
    done = _pick(f"{tmp_path}:{os.environ['PATH']}")
    assert done.returncode == 0, done.stderr
    assert flag.exists()
    assert f" {flaky} (3.11." in done.stderr
    assert done.stdout.strip() in (str(flaky), real)

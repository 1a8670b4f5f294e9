"""Type-check the package under its installed names (``python .ci/mypy.py``).

mypy maps modules to files by folder, so it cannot follow the wheel's mapping of the top-level
``actors/``, ``sweeps/`` and ``reporting/`` folders to ``commprof.actors``, ``commprof.sweeps``
and ``commprof.reporting``. This lays the installed shape out as links in a temporary folder,
runs mypy there with the project's settings and names the repository's files in its report.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAPPED = ("actors", "sweeps", "reporting")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="commprof-mypy-") as tmp:
        package = Path(tmp) / "commprof"
        package.mkdir()
        for entry in (REPO / "commprof").iterdir():
            if entry.name != "__pycache__":
                (package / entry.name).symlink_to(entry)
        for name in MAPPED:
            (package / name).symlink_to(REPO / name)
        cmd = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml")]
        proc = subprocess.run([*cmd, "commprof"], cwd=tmp, capture_output=True, text=True)
    report = proc.stdout + proc.stderr
    for name in MAPPED:
        report = report.replace(f"commprof/{name}/", f"{name}/")
    print(report, end="")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())

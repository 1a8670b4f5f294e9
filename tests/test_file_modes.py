"""Files honour the umask: a dataset's parquet files and commit sidecars, and analyze's tables,
get the mode a plainly created file gets (0644 under umask 022, 0600 under 077), not
``mkstemp``'s 0600 whatever the umask. Each umask in a fresh process (the umask is process-wide).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.hang import GUARD_S

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # a fresh interpreter per umask
WRITE = """
import os, sys
from pathlib import Path
os.umask(int(sys.argv[2], 8))
from commprof import results
from commprof.matrix import Cell
from commprof.traces.analyze import analyze, write_parquet
root = Path(sys.argv[1])
cell = Cell(model="srn-100k", world_size=2, bucket_cap_mb=1, steps=3)
row = results.cell_row(cell, sweep="t", attempt=1, status="ok")
results.write_attempt(root / "ds", row, {"steps": [{"rank": 0, "step": 1}]}, {"r0.json.gz": b"x"})
write_parquet(analyze(Path(sys.argv[3]), workers=1).tables(), root / "tables")
(root / "plain").write_text("")
"""


@pytest.mark.parametrize(("umask", "mode"), [("022", 0o644), ("077", 0o600), ("002", 0o664)])
def test_written_files_follow_the_umask(tmp_path: Path, umask: str, mode: int) -> None:
    golden = REPO / "tests" / "data" / "golden_gloo2"
    subprocess.run(
        [sys.executable, "-c", WRITE, str(tmp_path), umask, str(golden)],
        check=True,
        timeout=GUARD_S,
    )
    assert (tmp_path / "plain").stat().st_mode & 0o777 == mode  # what open() gives, for reference
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "plain"]
    kinds = {p.suffix for p in written}
    assert {".parquet", ".sha256", ".gz"} <= kinds, kinds
    assert any(p.parent.name == "tables" for p in written)
    for path in written:
        if path.name.startswith(".commprof.lock"):
            continue
        assert path.stat().st_mode & 0o777 == mode, (path, oct(path.stat().st_mode))

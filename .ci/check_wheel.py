"""Check a built wheel: only the ``commprof`` import name, and every data file the code reads."""

import sys
import zipfile

REQUIRED = (
    "commprof/reporting/templates/main.tex",
    "commprof/reporting/templates/postmortem.tex",
    "commprof/sweeps/smoke.yaml",
    "commprof/sweeps/matrix.yaml",
    "commprof/modeling/collective/interconnects.yaml",
    "commprof/modeling/collective/clusters.yaml",
    "commprof/modeling/collective/collective_scale.yaml",
    "commprof/modeling/step/model.py",
    "commprof/modeling/trace_whatif/replay.py",
    "commprof/commands/estimate.py",
    "commprof/sweeps/driver.py",
    "commprof/actors/gang.py",
)


def main(path: str) -> int:
    names = zipfile.ZipFile(path).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    stray = sorted(t for t in tops if t != "commprof" and not t.endswith(".dist-info"))
    missing = [name for name in REQUIRED if name not in names]
    for what, found in (("top-level names besides commprof", stray), ("missing files", missing)):
        if found:
            print(f"{path}: {what}: {found}", file=sys.stderr)
    return 1 if stray or missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

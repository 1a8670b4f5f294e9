"""Forbidden-character scanner: typographic look-alikes and invisible characters.

Rejects, in source, YAML, TOML, TeX and docs: smart quotes, dashes other than the ASCII
hyphen, non-breaking and other odd spaces, zero-width characters, bidi controls and the BOM.
Run by pre-commit and CI: ``python .ci/check_chars.py [FILES...]`` (no files: every tracked
file git lists with a checked suffix). Exit status 1 with ``file:line:col`` per finding.
"""

from __future__ import annotations

import subprocess
import sys
import unicodedata
from pathlib import Path

SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".tex", ".txt", ".cfg", ".sh", ".json"}
NAMES = {"run", "Dockerfile", ".pre-commit-config.yaml"}
FORBIDDEN = {
    **{chr(c): "dash or hyphen look-alike" for c in range(0x2010, 0x2016)},
    **{chr(c): "smart quote" for c in range(0x2018, 0x2020)},
    "\u2032": "prime",
    "\u2033": "double prime",
    "\u00a0": "non-breaking space",
    "\u202f": "narrow non-breaking space",
    "\u2007": "figure space",
    "\u2009": "thin space",
    "\u3000": "ideographic space",
    "\u00ad": "soft hyphen",
    "\u2212": "minus sign",
    "\ufeff": "byte order mark",
    **{chr(c): "zero-width character" for c in range(0x200B, 0x2010)},
    **{chr(c): "bidi control" for c in range(0x202A, 0x202F)},
    **{chr(c): "bidi isolate" for c in range(0x2066, 0x206A)},
    "\u2060": "word joiner",
}


def scan(path: Path) -> list[str]:
    """Findings in one file as ``path:line:col: U+XXXX name (kind)``."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        return [f"{path}: not UTF-8 ({err.reason} at byte {err.start})"]
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for col, char in enumerate(line, 1):
            if char in FORBIDDEN:
                name = unicodedata.name(char, "?")
                found.append(
                    f"{path}:{number}:{col}: U+{ord(char):04X} {name} ({FORBIDDEN[char]}); "
                    "use the ASCII character"
                )
    return found


def tracked_files() -> list[Path]:
    listing = subprocess.run(
        ["git", "ls-files", "-z"], check=True, capture_output=True, text=True
    ).stdout
    return [
        Path(p)
        for p in listing.split("\0")
        if p and (Path(p).suffix in SUFFIXES or Path(p).name in NAMES) and Path(p).is_file()
    ]


def main(argv: list[str]) -> int:
    files = [Path(a) for a in argv] if argv else tracked_files()
    findings = [line for path in files for line in scan(path)]
    for line in findings:
        print(line)
    if findings:
        print(f"{len(findings)} forbidden character(s) in {len(files)} file(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

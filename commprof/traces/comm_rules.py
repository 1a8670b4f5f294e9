"""Which GPU kernels are communication: a declared rule file, extended by the user's.

The package ships ``comm_rules.yaml`` (read with :mod:`importlib.resources`): one entry per
communication library's kernels, each with the library, a regular expression searched in the
kernel name, whether it is a collective or point-to-point transfer (or a kernel of such a
library that only computes), where its collective type comes from and the source that defines
the name. ``commprof analyze --rules FILE`` (or the ``COMMPROF_RULES`` environment variable, a
path) adds entries of the same shape: they come first, and one with the ``name`` of a shipped
entry replaces it. docs/analyze_rules.md describes the file.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from commprof.yamlio import load_yaml, read_text, short

KINDS = ("collective", "point_to_point", "not_communication")
"""What an entry's kernels are: collectives, point-to-point transfers, or compute kernels of a
communication library (claimed, so that nothing lists them as possible communication)."""
TYPE_SOURCES = ("args", "name", "fixed")
"""Where a collective's type comes from: Kineto's args (``Collective name`` on the kernel or its
launching op, else the launching ``nccl:<op>``, else the kernel name), the kernel name, or the
entry's ``collective_type``."""
TYPES = (
    "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "dispatch", "combine",
    "send_recv", "broadcast", "reduce", "gather", "scatter", "barrier",
)  # fmt: skip
"""Collective types an entry may fix (``trace_rules.COLLECTIVE_TYPES`` reads them from names)."""
FIELDS = ("name", "library", "pattern", "kind", "type_from", "collective_type", "source")
REQUIRED = ("name", "library", "pattern", "kind", "type_from", "source")
ENV_VAR = "COMMPROF_RULES"
"""Environment variable naming a rule file of the user's (as ``--rules`` does)."""
DEFAULT_FILE = "comm_rules.yaml"
MAX_RULE_FILE_BYTES = 1 << 20
"""Largest rule file read (1 MiB: thousands of entries)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CommRule:
    """One entry of a rule file: the kernels one pattern claims and what they are."""

    name: str
    """Unique id; a user's entry of the same name replaces the shipped one."""
    library: str
    """The library that launches the kernels (shown in the collectives table)."""
    pattern: str
    """Python regular expression searched anywhere in the kernel name."""
    kind: str
    """One of KINDS."""
    type_from: str
    """One of TYPE_SOURCES."""
    collective_type: str | None = None
    """The type where ``type_from`` is "fixed" (one of TYPES), else None."""
    source: str
    """Where the kernel name is defined: repository, path and commit."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.type_from not in TYPE_SOURCES:
            raise ValueError(f"type_from must be one of {TYPE_SOURCES}, got {self.type_from!r}")
        if (self.type_from == "fixed") != (self.collective_type is not None):
            raise ValueError(
                "collective_type is required where type_from is 'fixed' and only there, "
                f"got type_from {self.type_from!r} and collective_type {self.collective_type!r}"
            )
        if self.collective_type is not None and self.collective_type not in TYPES:
            raise ValueError(
                f"collective_type must be one of {TYPES}, got {self.collective_type!r}"
            )
        try:
            re.compile(self.pattern)
        except re.error as err:
            raise ValueError(f"pattern {self.pattern!r} is no regular expression ({err})") from None

    @property
    def is_communication(self) -> bool:
        return self.kind != "not_communication"


@dataclass(frozen=True, kw_only=True, slots=True)
class CommRules:
    """The entries in the order they claim names (the user's first, then the shipped ones)."""

    rules: tuple[CommRule, ...]
    """Entries; the first whose pattern a kernel name holds claims it."""
    sources: tuple[str, ...] = ()
    """Files they came from (for messages)."""
    claimed: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    """Kernel name -> index of the entry that claims it (-1: none), filled as names are asked."""

    def __post_init__(self) -> None:
        names = [r.name for r in self.rules]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"rule names must be unique, got {dup} more than once")

    def claim(self, kernel_name: str) -> CommRule | None:
        """The entry that claims ``kernel_name`` (None: no entry)."""
        index = self.claimed.get(kernel_name)
        if index is None:
            index = self.claimed[kernel_name] = _claim_index(self.rules, kernel_name)
        return None if index < 0 else self.rules[index]

    def runs(self) -> list[tuple[bool, str]]:
        """Consecutive entries of one target merged: (communication?, one regex for ``re.match``
        that finds any of their patterns anywhere in a name), in claim order. A rule table
        turns each into one rule (few rules over a million events, however many entries)."""
        out: list[tuple[bool, list[str]]] = []
        for rule in self.rules:
            if out and out[-1][0] == rule.is_communication:
                out[-1][1].append(rule.pattern)
            else:
                out.append((rule.is_communication, [rule.pattern]))
        return [(comm, ".*?(?:" + "|".join(f"(?:{p})" for p in ps) + ")") for comm, ps in out]

    def comm_pattern(self) -> str:
        """One regex for ``re.match`` that finds any communication entry's pattern."""
        pats = [r.pattern for r in self.rules if r.is_communication]
        return ".*?(?:" + "|".join(f"(?:{p})" for p in pats) + ")" if pats else "(?!)"


def _claim_index(rules: tuple[CommRule, ...], kernel_name: str) -> int:
    for i, rule in enumerate(rules):
        if _compiled(rule.pattern).search(kernel_name):
            return i
    return -1


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def parse_rules(doc: Any, source: str) -> tuple[CommRule, ...]:
    """The entries of a loaded rule document, each checked.

    Raises:
        ValueError: naming ``source``, the entry (its index and name) and the key at fault.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("rules"), list):
        raise ValueError(f"{source}: a rule file is a mapping with a 'rules' list of entries")
    extra = sorted(set(doc) - {"rules", "version"})
    if extra:
        raise ValueError(
            f"{source}: unknown top-level key(s) {extra}; only 'rules' (and 'version')"
        )
    out = []
    for i, entry in enumerate(doc["rules"]):
        where = f"{source}: rules[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(
                f"{where}: an entry is a mapping of {list(FIELDS)}, got {short(entry)}"
            )
        if isinstance(entry.get("name"), str):
            where += f" ({entry['name']})"
        unknown = sorted(set(map(str, entry)) - set(FIELDS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; the keys are {list(FIELDS)}")
        missing = [k for k in REQUIRED if k not in entry]
        if missing:
            raise ValueError(f"{where}: missing key(s) {missing}")
        for key in FIELDS:
            value = entry.get(key)
            if value is not None and not (isinstance(value, str) and value.strip()):
                raise ValueError(f"{where}: {key} must be a non-empty string, got {short(value)}")
        try:
            out.append(CommRule(**{k: entry[k] for k in FIELDS if k in entry}))
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
    return tuple(out)


def load_rule_file(path: str | Path) -> tuple[CommRule, ...]:
    """The entries of a rule file (``yaml.safe_load`` semantics, bounded; see yamlio)."""
    text = read_text(path, "the rule file", max_bytes=MAX_RULE_FILE_BYTES)
    return parse_rules(load_yaml(text, str(path)), str(path))


@functools.cache
def default_rules() -> CommRules:
    """The shipped rules (``commprof/traces/comm_rules.yaml``)."""
    text = resources.files("commprof.traces").joinpath(DEFAULT_FILE).read_text("utf-8")
    return CommRules(rules=parse_rules(load_yaml(text, DEFAULT_FILE), DEFAULT_FILE))


def with_user_rules(user: tuple[CommRule, ...], source: str, base: CommRules) -> CommRules:
    """``user``'s entries first, then ``base``'s not replaced by one of the same name."""
    names = {r.name for r in user}
    kept = tuple(r for r in base.rules if r.name not in names)
    try:
        return CommRules(rules=user + kept, sources=(source, *base.sources))
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None


def resolve_rules(path: str | Path | None = None) -> CommRules:
    """The rules an analysis uses: the shipped ones, with ``path``'s (else those of the file
    ``COMMPROF_RULES`` names, if set) first.

    Raises:
        ValueError: If the user's file cannot be read or an entry is invalid (file, entry, key
            and value named).
    """
    base = default_rules()
    if path is None:
        env = os.environ.get(ENV_VAR, "").strip()
        if not env:
            return base
        path, how = env, f"{ENV_VAR}={env}"
    else:
        how = str(path)
    try:
        user = load_rule_file(path)
    except ValueError as err:
        raise ValueError(f"{err} (rules from {how})" if ENV_VAR in how else str(err)) from None
    return with_user_rules(user, str(path), base)

"""Reading the project's YAML files (matrices, links, parameter lists) strictly and safely.

A :class:`yaml.SafeLoader` (no Python objects are ever constructed) with two changes:

- numbers as YAML 1.2 (and JSON) write them: ``1e30`` and ``1E-3`` are floats. YAML 1.1, which
  PyYAML implements, reads an exponent without a dot as a string, so ``cell_timeout_s: 1e3``
  would be rejected as "a str" with no hint why.
- a key given twice in one mapping is an error naming the key and its line, instead of the last
  value winning silently.

The float resolver is PyYAML's own pattern with the dot made optional before an exponent.

Bounded before anything is built from a document: :func:`load_yaml` refuses a text of more
commas and lines than ``MAX_VALUES`` before parsing it (composing half a million nodes alone
takes many seconds), then counts the values the
document holds with every alias (``*name``) expanded, on the composed node graph (each node
counted once, then reused: linear in the file), and refuses more than ``MAX_VALUES`` or an alias
that refers to itself; a 500-byte document of nine aliases nine deep otherwise expands to
9**9 values once anything walks it. :func:`read_text` reads at most the bytes its caller allows,
and :func:`short` quotes a value in an error by a short prefix only.
"""

from __future__ import annotations

import os
import re
import reprlib
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 16 * 2**20
"""Largest text file :func:`read_text` reads unless its caller says otherwise."""
MAX_VALUES = 100_000
"""Most values (scalars, lists, mappings) a document may hold, aliases expanded."""
SHORT_CHARS = 60
"""Longest quote of a value in an error message."""
_SHORT = reprlib.Repr()  # keyword arguments only from Python 3.12
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxtuple, _SHORT.maxset = 2, 4, 4, 4, 4
_SHORT.maxstring = _SHORT.maxother = SHORT_CHARS


def short(value: Any) -> str:
    """``repr(value)`` cut to a short prefix (at most about ``SHORT_CHARS`` characters), without
    walking more of the value than it shows: for error messages about what a user wrote."""
    text = _SHORT.repr(value)
    return text if len(text) <= SHORT_CHARS + 10 else text[:SHORT_CHARS] + "...'"


_FLOAT_12 = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.VERBOSE,
)


_SAFE_BASE: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""The safe loader the strict one is built on: libyaml's parser where PyYAML has it (the same
documents, read about ten times faster), else PyYAML's own."""
MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictSafeLoader(_SAFE_BASE):  # type: ignore[misc]
    """SafeLoader with YAML 1.2 floats and duplicate keys refused; so are keys that are not plain
    values (``? [a, b]``: a list or mapping as a key) and merge keys (``<<: *base``): write the
    mapping out instead."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == MERGE_TAG:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"a merge key (<<) on line {line}: merge keys are not read; write the "
                    "mapping's keys out",
                    key_node.start_mark,
                )
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"a key on line {line} is a {_kind(key_node)}; a key must be a plain value "
                    "(a name or a number)",
                    key_node.start_mark,
                )
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} is given twice (lines {seen[key]} and {line}); keep one",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


MAX_INT_DIGITS = 19
"""Most digits of a whole number in a document: a 64-bit integer's; a longer one (``cap:
<400 digits>``) would overflow the first float conversion, far from the file."""


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    digits = sum(c.isdigit() for c in str(node.value))
    if digits > MAX_INT_DIGITS:
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"a whole number on line {node.start_mark.line + 1} has {digits} digits, more than "
            f"{MAX_INT_DIGITS}; give a smaller number",
            node.start_mark,
        )
    return yaml.SafeLoader.construct_yaml_int(loader, node)  # type: ignore[no-any-return]


StrictSafeLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _kind(node: yaml.Node) -> str:
    return "list" if isinstance(node, yaml.SequenceNode) else "mapping"


# Replace the inherited float resolver (first characters as PyYAML registers it).
StrictSafeLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:float"]
    for first, resolvers in _SAFE_BASE.yaml_implicit_resolvers.items()
}
StrictSafeLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))


def read_text(path: str | Path, what: str, *, max_bytes: int | None = None) -> str:
    """A file's text as UTF-8, with errors that say which file and what to do.

    Args:
        path: the file.
        what: what the file is, for messages ("the matrix file").
        max_bytes: refuse a file larger than this (read no further than one byte past it;
            default ``MAX_FILE_BYTES``).

    Raises:
        ValueError: the file is not a regular file (a FIFO, a folder), cannot be read, is
            larger than ``max_bytes``, or is not UTF-8.
    """
    path = Path(path)
    max_bytes = MAX_FILE_BYTES if max_bytes is None else max_bytes
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or a device would block or not end
            raise ValueError(f"{path}: {what} is not a regular file; give a file")
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as err:
        raise ValueError(f"{path}: cannot read {what} ({err.strerror})") from None
    if len(data) > max_bytes:
        raise ValueError(
            f"{path}: {what} is larger than {max_bytes:,} bytes, the most it may be; shorten it "
            "or split it"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path}: {what} is not UTF-8 text (byte {err.start} is {data[err.start]:#04x}); "
            "save it as UTF-8"
        ) from None


def load_yaml(text: str, source: str, *, max_values: int = MAX_VALUES) -> Any:
    """Parse YAML text with :class:`StrictSafeLoader`, bounded (see the module docstring).

    Args:
        text: the document.
        source: a name for messages, usually the file path.
        max_values: most values the document may hold, aliases expanded.

    Raises:
        ValueError: naming ``source`` and what is wrong where.
    """
    separators = text.count(",") + text.count("\n")
    if separators > max_values:  # before parsing: composing that many nodes alone takes seconds
        raise ValueError(
            f"{source}: the document has {separators:,} commas and lines, more than the "
            f"{max_values:,} values it may hold; write fewer values"
        )
    loader = StrictSafeLoader(text)  # a SafeLoader subclass: no Python objects are built
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_size(node, source, max_values)
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        raise ValueError(f"{source}: not valid YAML: {_one_line(err)}") from None
    except RecursionError:
        raise ValueError(f"{source}: not valid YAML: nested too deep") from None
    finally:
        loader.dispose()  # type: ignore[no-untyped-call]


def _one_line(err: yaml.YAMLError) -> str:
    """A YAML error as one line: where, then what (PyYAML's own text spans several lines and
    quotes the document)."""
    problem = getattr(err, "problem", None) or str(err)
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return (where + " ".join(str(problem).split()))[:300]


def _check_size(root: yaml.Node, source: str, max_values: int) -> None:
    """Refuse a document of more than ``max_values`` values with its aliases expanded, or with
    an alias inside its own anchor. Post-order over the node graph without recursion; each node
    is sized once (an alias is the same node object as its anchor)."""
    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        if not children_done:
            if key in active:
                mark = node.start_mark
                raise ValueError(
                    f"{source}: line {mark.line + 1}: an alias refers to the value that holds "
                    "it (a recursive structure); write the value out"
                )
            active.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
            continue
        active.discard(key)
        sizes[key] = 1 + sum(sizes[id(child)] for child in children)
        if sizes[key] > max_values:
            mark = node.start_mark
            raise ValueError(
                f"{source}: line {mark.line + 1}: the document holds more than {max_values:,} "
                "values with its aliases (*name) expanded; write the values out, or fewer"
            )

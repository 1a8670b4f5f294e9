"""Reading the project's YAML files (matrices, links, parameter lists) strictly and safely.

A :class:`yaml.SafeLoader` (no Python objects are ever constructed) with two changes:

- numbers as YAML 1.2 (and JSON) write them: ``1e30`` and ``1E-3`` are floats. YAML 1.1, which
  PyYAML implements, reads an exponent without a dot as a string, so ``cell_timeout_s: 1e3``
  would be rejected as "a str" with no hint why.
- a key given twice in one mapping is an error naming the key and its line, instead of the last
  value winning silently.

The float resolver is PyYAML's own pattern with the dot made optional before an exponent.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

_FLOAT_12 = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.VERBOSE,
)


class StrictSafeLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 floats and duplicate keys refused."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} is given twice (lines {seen[key]} and {line}); keep one",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


# Replace the inherited float resolver (first characters as PyYAML registers it).
StrictSafeLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:float"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
StrictSafeLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))


def read_text(path: str | Path, what: str) -> str:
    """A file's text as UTF-8, with errors that say which file and what to do.

    Args:
        path: the file.
        what: what the file is, for messages ("the matrix file").

    Raises:
        ValueError: the file cannot be read, or is not UTF-8.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ValueError(f"{path}: cannot read {what} ({err.strerror})") from err
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path}: {what} is not UTF-8 text (byte {err.start} is {data[err.start]:#04x}); "
            "save it as UTF-8"
        ) from None


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML text with :class:`StrictSafeLoader`.

    Raises:
        ValueError: naming ``source`` and what is wrong where.
    """
    try:
        return yaml.load(text, Loader=StrictSafeLoader)  # a SafeLoader subclass
    except yaml.YAMLError as err:
        raise ValueError(f"{source}: not valid YAML: {err}") from err

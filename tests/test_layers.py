"""The layers of docs/design.md, kept by the code: which package may import which, lazy imports
included, and no import cycle anywhere.

Every import statement of every module is read from its source (``ast``): at module level, inside
functions and methods, and under ``if`` (only ``if TYPE_CHECKING:`` blocks are left out: they run
for the type checker alone).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDERS = {"commprof": "commprof", "actors": "commprof.actors", "sweeps": "commprof.sweeps",
           "reporting": "commprof.reporting"}  # fmt: skip
"""Repository folders and the import names a wheel gives them (pyproject.toml)."""

CORE = "core"
APP = "app"
LAYERS: dict[str, tuple[set[str], set[str]]] = {
    # layer: (commprof layers it may import, third-party frameworks it may import)
    CORE: ({CORE}, set()),
    "modeling": ({CORE, "traces", "modeling"}, set()),
    "analysis": ({CORE, "modeling", "analysis"}, set()),
    "traces": ({CORE, "traces"}, set()),
    "reporting": ({CORE, "modeling", "analysis", "reporting"}, set()),
    "profiling": ({CORE, "traces", "profiling"}, {"torch"}),
    "training": ({CORE, "modeling", "traces", "profiling", "training"}, {"torch"}),
    "actors": ({CORE, "modeling", "training", "actors"}, {"ray", "torch"}),
    "sweeps": ({CORE, "modeling", "analysis", "actors", "sweeps"}, {"ray"}),
    "commands": ({CORE, "modeling", "commands"}, set()),
    APP: ({CORE, APP}, set()),  # and anything inside a function (APP_MODULES)
}
"""The table of docs/design.md, "Layers". torch and Ray reach a torch-free layer only through
``commprof.extras.require``, which names the extra that installs them."""
APP_MODULES = {"commprof", "commprof.cli", "commprof.__main__"}
"""The package's front doors (``commprof.attach``, the command line): at module level they import
the core alone; each command or lazy attribute imports what it needs when it is used."""
FRAMEWORKS = {"torch", "ray"}


def layer_of(module: str) -> str:
    """``commprof.traces.analyze`` -> ``traces``; a module directly in commprof/ is core."""
    if module in APP_MODULES:
        return APP
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in LAYERS:
        return parts[1]
    return CORE


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(REPO / folder).with_suffix("").parts]
            parts = [p for p in parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def imports(module: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) of every import statement of ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, lazy) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                    base = f"{up}.{base}" if base else up
                names = [f"{base}.{a.name}" for a in child.names]
                out.extend((n, child.lineno, lazy) for n in [base, *names])
            visit(child, lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(tree, False)
    return out


MODULES = modules()


def _internal(name: str) -> str | None:
    """The project module ``name`` refers to (a module, or the module a name comes from)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def test_every_module_is_in_a_layer_of_the_table() -> None:
    assert {layer_of(m) for m in MODULES} <= set(LAYERS)
    assert {"commprof.traces.analyze", "commprof.profiling.comm_hooks"} <= set(MODULES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module: str) -> None:
    layer = layer_of(module)
    allowed, frameworks = LAYERS[layer]
    wrong: set[str] = set()
    for name, line, lazy in imports(module, MODULES[module]):
        if layer == APP and lazy:
            continue
        top = name.partition(".")[0]
        if top in FRAMEWORKS and top not in frameworks:
            wrong.add(f"line {line}: {name} (reach it through commprof.extras.require)")
        target = _internal(name) if top == "commprof" else None
        if target is None:
            continue
        if layer_of(target) not in allowed and target != "commprof":
            wrong.add(f"line {line}: {target} ({layer_of(target)})")
        if layer == "actors" and layer_of(target) == "training" and not lazy:
            wrong.add(f"line {line}: {target} at module level (only inside the rank actor)")
    assert not wrong, f"{module} ({layer}) imports what its layer may not: {sorted(wrong)}"


def test_no_import_cycle_lazy_imports_included() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for name, _, _ in imports(module, path):
            target = _internal(name) if name.startswith("commprof") else None
            if target and target != module and target != "commprof":
                graph[module].add(target)
    cycles = _cycles(graph)
    assert not cycles, f"import cycles: {cycles}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_the_design_document_states_the_same_table() -> None:
    """docs/design.md's "Layers" table names each layer and the layers it may import."""
    text = (REPO / "docs" / "design.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    stated = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        stated[cells[0].strip("`")] = set(re.findall(r"`([a-z]+)`", cells[2]))
    assert stated == {layer: allowed - {layer} for layer, (allowed, _) in LAYERS.items()}

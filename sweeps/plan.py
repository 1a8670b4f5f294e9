"""Which cells of a matrix a driver run selects (``--only``, ``--exclude``).

What runs next of the selected cells is :mod:`commprof.attempts`'s decision.
"""

from __future__ import annotations

from commprof.matrix import Cell


def matches(cell: Cell, term: str) -> bool:
    """Does ``cell`` match a filter term: ``key=value`` on its config, else a cell-id prefix."""
    if "=" in term:
        key, _, value = term.partition("=")
        config = cell.config()
        if key not in config:
            raise ValueError(f"filter {term!r}: no cell key {key!r}; keys: {', '.join(config)}")
        return str(config[key]) == value
    return cell.cell_id.startswith(term)


def select(cells: tuple[Cell, ...], only: tuple[str, ...], exclude: tuple[str, ...]) -> list[Cell]:
    """Apply the --only / --exclude filters."""
    chosen = [c for c in cells if not only or any(matches(c, t) for t in only)]
    return [c for c in chosen if not any(matches(c, t) for t in exclude)]

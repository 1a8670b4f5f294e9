"""A torch.profiler harness: scheduled steps, one compressed trace per rank and cycle.

The harness wraps ``torch.profiler.profile`` with its wait / warm-up / active /
repeat schedule and writes every finished cycle as a gzip-compressed Chrome trace
(``.json.gz``). The file is written under a temporary name in the target folder
and renamed into place, so a reader never sees half a trace. The content is
exactly what Kineto exports, so the files open in Perfetto and chrome://tracing
unchanged (both read gzip-compressed traces).

Example::

    with profiled(out_dir, rank=rank, wait=1, warmup=1, active=3, repeat=1) as prof:
        for batch in batches:
            train_step(batch)
            prof.step()
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerAction, ProfilerActivity

DEFAULT_NAME_TEMPLATE = "rank{rank}_steps{first}-{last}.json.gz"
"""File name of a trace; fields ``rank``, ``first`` and ``last`` (the active step range)."""

GZIP_LEVEL = 6
"""gzip compression level of exported traces (zlib's default trade-off)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class HarnessConfig:
    """Schedule and naming of a profiled run."""

    rank: int
    """Rank of this process; goes into the file name."""
    wait: int = 1
    """Steps skipped at the start of each cycle (profiler off)."""
    warmup: int = 1
    """Steps traced but discarded at the start of each cycle (profiler start-up cost)."""
    active: int = 3
    """Steps traced and exported per cycle."""
    repeat: int = 1
    """Number of cycles; 0 repeats until the context exits (torch's convention)."""
    name_template: str = DEFAULT_NAME_TEMPLATE
    """Format string for a trace's file name; must end in ``.json.gz``."""
    record_shapes: bool = True
    """Record input shapes: gives gloo collectives their message size (bucket matching)."""

    def __post_init__(self) -> None:
        for name in ("rank", "wait", "warmup", "repeat"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if not isinstance(self.active, int) or self.active < 1:
            raise ValueError(f"active must be an int >= 1, got {self.active!r}")
        if not self.name_template.endswith(".json.gz"):
            raise ValueError(f"name_template must end in '.json.gz', got {self.name_template!r}")
        try:
            self.name_template.format(rank=0, first=0, last=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"name_template {self.name_template!r} may use only the fields "
                f"{{rank}}, {{first}} and {{last}}: {exc}"
            ) from exc


def write_trace_atomically(prof: torch.profiler.profile, path: Path) -> None:
    """Export ``prof``'s trace gzip-compressed to ``path`` via a temp file and a rename.

    Args:
        prof: A profiler whose current cycle has finished recording.
        path: Final file name (``.json.gz``); its folder must exist.
    """
    fd, tmp_json = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".json", dir=path.parent)
    os.close(fd)
    tmp_gz = tmp_json + ".gz"
    try:
        prof.export_chrome_trace(tmp_json)
        with open(tmp_json, "rb") as fin, gzip.open(tmp_gz, "wb", compresslevel=GZIP_LEVEL) as fout:
            shutil.copyfileobj(fin, fout)
        os.replace(tmp_gz, path)
    finally:
        for leftover in (tmp_json, tmp_gz):
            if os.path.exists(leftover):
                os.unlink(leftover)


class ProfilerHarness:
    """Scheduled torch.profiler session that writes one trace per rank and cycle.

    Use it as a context manager and call :meth:`step` once at the end of every
    training step. Written files are listed in :attr:`trace_paths`.
    """

    def __init__(self, out_dir: Path | str, config: HarnessConfig) -> None:
        """Prepare a harness writing into ``out_dir`` (created if missing).

        Args:
            out_dir: Folder for the traces.
            config: Schedule and naming.
        """
        self.out_dir = Path(out_dir)
        self.config = config
        self.trace_paths: list[Path] = []
        self._schedule = torch.profiler.schedule(
            wait=config.wait, warmup=config.warmup, active=config.active, repeat=config.repeat
        )
        self._in_step = False
        self._prof: torch.profiler.profile | None = None

    def _active_range(self, prof: torch.profiler.profile) -> tuple[int, int]:
        # on_trace_ready fires inside step() after step_num moved to the next step,
        # or inside stop() at the current step when the context exits mid-cycle.
        last = prof.step_num - 1 if self._in_step else prof.step_num
        first = last
        while first > 0 and self._schedule(first - 1) == ProfilerAction.RECORD:
            first -= 1
        return first, last

    def _on_trace_ready(self, prof: torch.profiler.profile) -> None:
        first, last = self._active_range(prof)
        name = self.config.name_template.format(rank=self.config.rank, first=first, last=last)
        path = self.out_dir / name
        write_trace_atomically(prof, path)
        self.trace_paths.append(path)

    def __enter__(self) -> ProfilerHarness:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(
            activities=activities,
            schedule=self._schedule,
            on_trace_ready=self._on_trace_ready,
            record_shapes=self.config.record_shapes,
            with_stack=False,
        )
        self._prof.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        assert self._prof is not None, "__exit__ without __enter__"
        self._prof.__exit__(*exc_info)
        self._prof = None

    def step(self) -> None:
        """Mark the end of a training step (advances the profiler schedule)."""
        if self._prof is None:
            raise RuntimeError("ProfilerHarness.step() called outside its 'with' block")
        self._in_step = True
        try:
            self._prof.step()
        finally:
            self._in_step = False


@contextmanager
def profiled(
    out_dir: Path | str,
    *,
    rank: int,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    repeat: int = 1,
    name_template: str = DEFAULT_NAME_TEMPLATE,
    record_shapes: bool = True,
) -> Iterator[ProfilerHarness]:
    """Profile the enclosed steps; see :class:`HarnessConfig` for the arguments.

    Args:
        out_dir: Folder for the traces (created if missing).
        rank: This process's rank.
        wait: Steps skipped at the start of each cycle.
        warmup: Steps traced and discarded at the start of each cycle.
        active: Steps traced and exported per cycle.
        repeat: Number of cycles (0: until the block exits).
        name_template: File name format with ``{rank}``, ``{first}``, ``{last}``.
        record_shapes: Record input shapes (message sizes of gloo collectives).

    Returns:
        A context manager yielding the :class:`ProfilerHarness`; call ``.step()``
        after each training step.
    """
    config = HarnessConfig(
        rank=rank,
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=repeat,
        name_template=name_template,
        record_shapes=record_shapes,
    )
    with ProfilerHarness(out_dir, config) as harness:
        yield harness

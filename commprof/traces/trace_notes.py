"""What a trace tells a reader beyond its tables: one plain line per finding, naming the file.

``commprof analyze`` prints these under "Notes" (and ``--json`` lists them): where events
were duplicated, where collectives fell outside every step, where launches left no kernels
(CUDA graphs), where there is no communication at all or the trace is one GPU's, and how far
the GPU ran behind its CPU. Each note is a pure function of a parsed trace.
"""

from __future__ import annotations

from pathlib import Path

from commprof.traces.trace_parser import ParsedTrace
from commprof.traces.windows import LAUNCH_SOURCE

NS_PER_MS = 1_000_000
MIN_LAUNCH_CALLS = 20
"""Launch calls a trace needs before missing kernels are worth a note."""
MAX_KERNEL_SHARE = 0.1
"""Device events per launch call below which the kernels count as missing (graphs)."""
LAG_NOTE_NS = 1_000_000
"""GPU lag (median launch-to-start) past which the note on following the GPU is printed."""


def _ms(ns: float) -> str:
    return f"{ns / NS_PER_MS:.3f} ms"


def trace_notes(parsed: ParsedTrace) -> list[str]:
    """The notes of one parsed trace, each one line that starts with the file's name."""
    name = Path(parsed.source).name
    out = []
    if parsed.num_duplicates:
        out.append(
            f"{parsed.num_duplicates} duplicated events dropped (same category, name, thread or "
            "stream as another, overlapping it, start and end within 1 us: the trace holds its "
            "events twice?)"
        )
    if parsed.num_unfinished:
        out.append(
            f"{parsed.num_unfinished} unfinished events dropped (the profiler saw the op start "
            "or end, not both: dur -1, or ts 0 with an epoch time for dur)"
        )
    if parsed.control_chars_at:
        out.append(
            f"raw control characters inside strings in {len(parsed.control_chars_at)} "
            f"stretch(es) of the JSON (first at byte {parsed.control_chars_at[0]}): invalid JSON, "
            "as a profiler writes a garbled name; read as Python's non-strict decoder reads it"
        )
    outside = parsed.outside
    if len(outside):
        out.append(
            f"{len(outside)} collectives ({_ms(outside['duration_ns'].sum())} of communication) "
            "launched and ran outside every step window (before the first ProfilerStep or "
            "after the last): in no step's figures"
        )
    calls, events = parsed.num_launch_calls, parsed.num_device_events
    if calls >= MIN_LAUNCH_CALLS and events < MAX_KERNEL_SHARE * calls:
        graphs = (
            f", {parsed.num_graph_launches} of them graph launches"
            if parsed.num_graph_launches
            else ""
        )
        out.append(
            f"{calls} kernel launch calls but {events} kernel or copy events{graphs}: the "
            "kernels ran where the profiler did not record them (CUDA graphs without graph "
            "tracing), so the GPU reads as idle; profile with graphs off (eager mode) to see them"
        )
    comm = len(parsed.classes["communication"]) > 0 or len(parsed.collectives) > 0
    if parsed.regime == "cuda-single":
        what = "training" if parsed.has_backward else "inference (no backward pass, no optimizer)"
        out.append(
            f"one GPU and no communication (no distributedInfo, no collective): a single-GPU "
            f"{what} trace, so overlap is n/a"
        )
    elif not comm:
        out.append("no communication at all (no collective, no communication kernel): overlap n/a")
    possible = parsed.possible_comm
    if possible is not None and len(possible):
        out.append(
            f"{int(possible['num_events'].sum())} kernels of {len(possible)} names "
            f"({_ms(possible['time_ns'].sum())}) may be communication that no rule claims: "
            "counted as compute (see 'Possible communication, not counted'; add the line "
            "shown there to a rule file and pass it with --rules to count them)"
        )
    ranges = parsed.possible_ranges
    if ranges is not None and len(ranges):
        out.append(
            f"{int(ranges['num_ranges'].sum())} host ranges of {len(ranges)} names "
            f"({_ms(ranges['host_ns'].sum())} of CPU time) are named like communication but no "
            "counted communication kernel was launched in or ran during them (see 'Possible "
            "communication (host ranges), not counted'): their kernels, if any, count as compute "
            "or were not traced"
        )
    lag = parsed.gpu_lag_ns
    if parsed.step_source == LAUNCH_SOURCE and lag is not None and lag >= LAG_NOTE_NS:
        out.append(
            f"the GPU ran {_ms(lag)} behind the CPU (median from launch to start); each step "
            "window holds what its ProfilerStep launched"
        )
    return [f"{name}: {line}" for line in out]

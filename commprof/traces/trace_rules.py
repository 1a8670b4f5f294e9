"""Rule tables that classify Kineto trace events, one per regime (docs/design.md, Regimes).

Each complete event (``ph == "X"``) of a trace is classified by the first matching
rule of its regime's :class:`RuleTable`; collective metadata in the event args
(``Collective name``) comes before kernel-name patterns, which are only a
fallback. The parser (:mod:`commprof.traces.trace_parser`) applies the tables;
the column builder (:mod:`commprof.traces.column_builder`) reads them to know
which events' ``args`` it must keep.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from commprof.matrix import REGIMES as MATRIX_REGIMES
from commprof.traces.comm_rules import CommRules, default_rules

CLASSES = ("communication", "compute", "memcpy", "memset", "sync", "other")
"""Event classes a rule can assign; ``"ignore"`` drops an event."""
IGNORE = "ignore"
REGIMES = tuple(MATRIX_REGIMES)
"""Every regime has one rule table here (``commprof.matrix.REGIMES`` defines them)."""
MAX_EVENT_DURATION_US = 86_400e6
"""Longest plausible event (one day, in microseconds); longer ones are rejected as corrupt."""
MAX_TS_US = float((2**63 - 1) // 1000 - 1)
"""Latest event end (microseconds) that int64 nanoseconds hold; later ones are corrupt."""
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation"})
LAUNCHED_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
"""Device activities that a host runtime call launches (matched by CUPTI correlation id)."""
UNLAUNCHED_RULES = ("keep", "drop")
"""What the parser does with device activities whose launch is not in the trace."""
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime"})
"""Host runtime and driver calls: kernel launches among them (CUPTI / roctracer correlation)."""
LAUNCH_CALL_PATTERN = re.compile(r"(?i).*launch")
"""Names of the runtime calls that launch device work (``cudaLaunchKernel``, ``cuLaunchKernel``,
``cudaLaunchKernelExC``, ``hipLaunchKernel``, ``hipExtLaunchKernel``, ``cudaGraphLaunch``, ...)."""
GRAPH_LAUNCH_PATTERN = re.compile(r"(?i)(cuda|hip|cu)GraphLaunch")
"""Runtime calls that replay a captured graph (its kernels are traced only with graph tracing)."""
SKIP_CATS = frozenset({
    "python_function", "ac2g", "fwdbwd", "Trace", "overhead", "cpu_instant_event",
    "cuda_profiler_range", "external_correlation", "glow_runtime", "async_cpu_to_gpu",
    "mtia_ccp_events", "mtia_insight", "gpu_pm_counter", "collective_comm",
})  # fmt: skip
"""Kineto categories that no built-in rule, window or launch check reads: decoded as a bare tag
(no name, no args; docs/design.md, Reading traces) unless a rule table names one. Python frames
(PYTHON_FUNCTION_CAT) are read by name where a table has communication rules
(:func:`reads_python_functions`)."""
COMM_OP_PATTERN = r"record_param_comms|nccl:|rccl:|gloo:"
"""Names of the host ops that launch a collective (``record_param_comms`` with its metadata,
``nccl:all_to_all``, ...): kept in every category, so that a communication kernel takes its
type, group, size and sequence number from its launching op. (The dispatcher's
``c10d::allreduce_`` around them says nothing more and is left out: fewer events kept.)"""
LIBRARY_RANGE_PATTERN = (
    r"(?i:.*?(?:deep_?ep|dpsk::ep|pplx|nvshmem|mscclpp|userbuffers|all_?to_?all|moe_?dispatch"
    r"|moe_?combine|ep_?dispatch|ep_?combine))"
)
"""Host ranges (``record_function``, any category) named after a communication library or an
expert-parallel exchange: kept in every category, for the possible-communication check."""
RANGE_LIBRARY_PATTERN = r"(?i:deep_?ep|dpsk::ep|pplx|nvshmem|mscclpp|userbuffers|symm_?mem)"
"""The communication libraries of the rule file, outside PyTorch's process groups, as host
ranges name them (``re.search``)."""
HOST_RANGE_PATTERN = (
    r"(?!(?:_?c10d\w*|aten|record_param_comms)(?:::|$))"
    rf".*?(?:{RANGE_LIBRARY_PATTERN}|(?i:nccl|rccl|gloo)"
    r"|(?<![a-z])(?:[aA]ll_?(?:[rR]educe|[gG]ather|[tT]o_?[aA]ll|2_?[aA]ll)|[rR]educe_?[sS]catter"
    r"|i?[sS]end|i?[rR]ecv|[bB]roadcast)(?![a-z])|(?i:(?:moe|ep)_?(?:dispatch|combine)))"
)
"""Host ranges (``user_annotation``: ``record_function`` and NVTX-style ranges) whose name
reads like communication (``re.match``): a library of the rule file (DeepEP, pplx, NVSHMEM,
MSCCL++, userbuffers, symmetric memory, NCCL, RCCL, gloo) or a collective type of its vocabulary
(all-reduce, all-gather, reduce-scatter, all-to-all, send, recv, broadcast, an expert-parallel
dispatch or combine). The dispatcher's ops (``c10d::``, ``aten::``, ``record_param_comms``) are
left out: they are ``cpu_op`` events, not ranges, and keeping them would cost a kept event per
collective. Kept in every category (a few names); the ranges that no counted communication
kernel accounts for are listed (:func:`commprof.traces.possible_comm.possible_ranges`)."""
HOST_COMM_PATTERN = rf"record_param_comms|c10d::|nccl:|rccl:|{LIBRARY_RANGE_PATTERN}"
"""Host ops whose time is a communication library's: a kernel launched inside one is
communication or its preparation (``re.match``; :mod:`commprof.traces.possible_comm`). The
dispatcher's ``c10d::*`` ops count where their category is kept anyway, but are not kept for
this: each encloses a ``record_param_comms`` that is (a c10d op per collective, kept, cost
a tenth more kept events on a trace of many small collectives)."""
PYTHON_FUNCTION_CAT = "python_function"
"""Kineto's category of Python frames (``with_stack=True``), each named ``path(LINE): function``
with the path relative to its ``sys.path`` entry (``torch/profiler/python_tracer.py``), e.g.
``deep_ep/buffer.py(412): dispatch``; C functions are ``<built-in method ...>``."""
_SEP = r"[/\\]"
PYTHON_COMM_MODULES = (
    rf"deep_ep{_SEP}",  # DeepEP: deep_ep/buffer.py (Buffer.dispatch, combine, low_latency_*)
    rf"pplx_kernels{_SEP}",  # pplx-kernels: pplx_kernels/all_to_all.py (AllToAll.dispatch)
    rf"pplx_garden{_SEP}",  # pplx-garden: pplx_garden/kernels/p2p_all_to_all.py
    rf"nvshmem{_SEP}",  # nvshmem4py: nvshmem/core/collective.py, rma.py
    rf"mscclpp{_SEP}",  # MSCCL++: mscclpp/comm.py, mscclpp/ext/ep/buffer.py
    rf"flashinfer{_SEP}comm{_SEP}",  # FlashInfer: flashinfer/comm/trtllm_ar.py, mnnvl.py, ...
    rf"transformer_engine{_SEP}pytorch{_SEP}(?:cpp_extensions{_SEP}symm_allocator\.py"
    rf"|module{_SEP}base\.py\(\d+\): fill_userbuffers_buffer_for_all_gather$)",  # TE userbuffers
    rf"vllm{_SEP}distributed{_SEP}",  # vLLM: device_communicators/, parallel_state.py, ...
    rf"sglang{_SEP}srt{_SEP}distributed{_SEP}",  # SGLang: the same layout
    rf"torch{_SEP}distributed{_SEP}(?:distributed_c10d\.py|_symmetric_memory{_SEP}"
    rf"|_functional_collectives(?:_impl)?\.py(?!\(\d+\): __torch_dispatch__$)"
    rf"|nn{_SEP}functional\.py|tensor{_SEP}_collective_utils\.py)",  # not FSDP, DDP, DTensor ops
    rf"torch{_SEP}cuda{_SEP}nccl\.py",  # torch.cuda.nccl (all_reduce, broadcast, ...)
    rf"deepspeed{_SEP}comm{_SEP}",  # DeepSpeed: deepspeed/comm/comm.py, torch.py
    rf"megatron{_SEP}core{_SEP}tensor_parallel{_SEP}mappings\.py",  # Megatron-LM's TP collectives
    rf"torchrec{_SEP}distributed{_SEP}comm_ops\.py",  # TorchRec: alltoall_pooled, ...
)
"""Python modules (and a few functions) of communication libraries, as ``python_function`` names
spell them: each library's wrapper of its communication, not the modules that wrap whole
forward passes or compute ops (FSDP, DDP, DTensor's dispatch, ``AsyncCollectiveTensor``'s
``__torch_dispatch__``)."""
PYTHON_COMM_PATTERN = rf"(?:.*{_SEP})?(?:{'|'.join(PYTHON_COMM_MODULES)})"
"""Names of the ``python_function`` events of a communication library (``re.match``; a path may
keep a prefix where its ``sys.path`` entry was not trimmed): the only Python frames the reader
decodes (their names once each a chunk, the events where a name matches), for the
possible-communication check (:mod:`commprof.traces.possible_comm`)."""
STEP_NAME_PATTERN = r"ProfilerStep#"
"""Names of the step annotations, kept in any category (CPU and device ``ProfilerStep#N``)."""
STEP_PATTERN = re.compile(r"^ProfilerStep#(\d+)$")
DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
    "c10::half": 2, "bfloat16": 2, "c10::bfloat16": 2, "int": 4, "int32": 4,
    "long": 8, "long int": 8, "int64": 8, "short": 2, "int16": 2, "char": 1,
    "signed char": 1, "unsigned char": 1, "byte": 1, "uint8": 1, "int8": 1, "bool": 1,
}  # fmt: skip
"""Element sizes of the dtype spellings in Kineto args (``dtype`` and ``Input type``)."""
COLLECTIVE_ARG_KEYS = (
    "Collective name", "Seq", "seq_num", "Process Group Name", "In msg nelems", "dtype",
    "Group size", "Input Dims", "Input type",
)  # fmt: skip
"""The ``args`` keys a collective's row reads (name, sequence: ``Seq``, newer Kineto
``seq_num``; group, message size), on the kernel or on its launching op."""
RAW_ARG_KEYS = frozenset({"Input Dims", "Input type"})
"""Arg keys decoded only for the events kept with args (lists, costly to build for every op)."""
TEXT_ARG_KEYS = frozenset({"Collective name", "Process Group Name", "dtype"})
"""Arg keys whose values are strings that repeat (a few distinct a trace): kept as one object per
distinct string (:class:`commprof.traces.kept_args.KeptArgsBuilder`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """One row of a rule table: an event predicate and the class it assigns.

    All given predicates must hold; ``None`` means "any".
    """

    target: str
    """Class assigned: one of CLASSES, or "ignore"."""
    why: str
    """One line saying what the rule catches (shown to users extending tables)."""
    cats: frozenset[str] | None = None
    """Event categories (``cat``), exact."""
    name: str | None = None
    """Regular expression that must match the start of the event name."""
    has_arg: str | None = None
    """Key that must be present in the event's ``args`` (collective metadata)."""
    comm_thread: bool | None = None
    """True: event on (or launched from) a communication thread; False: not."""
    collective: bool = False
    """Each matching event is one collective (a row of ``ParsedTrace.collectives``)."""
    not_compute: bool = False
    """Carve the event's time out of compute even where a compute event encloses it."""

    def __post_init__(self) -> None:
        if self.target not in CLASSES and self.target != IGNORE:
            raise ValueError(
                f"Rule.target must be one of {CLASSES} or 'ignore', got {self.target!r}"
            )
        if self.name is not None:
            re.compile(self.name)


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleTable:
    """Ordered rules of one regime; the first matching rule wins, unmatched events are ignored."""

    regime: str
    """Regime name, e.g. "cpu-gloo"."""
    rules: tuple[Rule, ...]
    """Rules in priority order."""
    comm_thread_marker: str | None = None
    """Regex on event names; a thread with such an event is a communication thread."""
    comm: CommRules | None = None
    """The communication rules its kernel rules come from (device regimes), else None."""


_GLOO = r"gloo:"
DEFAULT_COMM = default_rules()
"""The shipped communication rules (``comm_rules.yaml``; :mod:`commprof.traces.comm_rules`)."""
COMM_KERNEL_PATTERN = re.compile(DEFAULT_COMM.comm_pattern())
"""Any communication kernel name the shipped rules claim (regime detection, reports)."""
COLLECTIVE_TYPES = (
    ("all_reduce", re.compile(r"all_?reduce|cross_device_reduce|quickreduce", re.I)),
    ("reduce_scatter", re.compile(r"reduce_?scatter", re.I)),
    ("all_gather", re.compile(r"all_?gather", re.I)),
    ("all_to_all", re.compile(r"all_?(?:to|2)_?all", re.I)),
    ("dispatch", re.compile(r"dispatch", re.I)),
    ("combine", re.compile(r"combine", re.I)),
    ("send_recv", re.compile(r"send|recv", re.I)),
    ("broadcast", re.compile(r"broadcast|bcast", re.I)),
    ("reduce", re.compile(r"reduce", re.I)),
    ("gather", re.compile(r"gather", re.I)),
    ("scatter", re.compile(r"scatter", re.I)),
    ("barrier", re.compile(r"barrier", re.I)),
)
"""Collective type of a collective's name (``Collective name`` arg, else the kernel or
annotation name), first match wins; "unknown" where none matches (RCCL's
``ncclDevKernel_Generic`` without metadata)."""


def collective_type(name: Any) -> str:
    """The collective type of a collective's name (see COLLECTIVE_TYPES)."""
    return _collective_type(str(name))


@functools.lru_cache(maxsize=4096)
def _collective_type(text: str) -> str:
    for kind, pattern in COLLECTIVE_TYPES:
        if pattern.search(text):
            return kind
    return "unknown"


def device_rules(comm: CommRules) -> tuple[Rule, ...]:
    """The rules of the device regimes (cuda-nccl, cuda-single) for communication rules
    ``comm``: collective metadata in a kernel's args first, then ``comm``'s entries in their
    order (consecutive entries of one target as one rule), then compute and the other classes."""
    claimed = tuple(
        Rule(target="communication" if is_comm else "compute", cats=frozenset({"kernel"}),
             name=pattern, collective=is_comm,
             why="kernel a communication rule claims" if is_comm
             else "kernel of a communication library that only computes (a rule says so)")
        for is_comm, pattern in comm.runs()
    )  # fmt: skip
    return (
        Rule(target="communication", cats=frozenset({"kernel"}), has_arg="Collective name",
             collective=True, why="kernel with collective metadata in its args"),
        *claimed,
        Rule(target="compute", cats=frozenset({"kernel"}), why="every other GPU kernel"),
        Rule(target="memcpy", cats=frozenset({"gpu_memcpy"}), why="device copies"),
        Rule(target="memset", cats=frozenset({"gpu_memset"}), why="device memsets"),
        Rule(target="sync", cats=frozenset({"cuda_sync"}), why="device-side waits"),
    )  # fmt: skip


DEVICE_REGIMES = ("cuda-nccl", "cuda-single")
"""Regimes whose communication is GPU kernels (the communication rules apply)."""


def rule_tables(comm: CommRules) -> dict[str, RuleTable]:
    """Every regime's table, the device regimes' built from communication rules ``comm``."""
    return {
        name: replace(table, rules=device_rules(comm), comm=comm)
        if name in DEVICE_REGIMES else table
        for name, table in RULES.items()
    }  # fmt: skip


_CUDA_NCCL_RULES = device_rules(DEFAULT_COMM)
RULES: dict[str, RuleTable] = {
    "cpu-gloo": RuleTable(
        regime="cpu-gloo",
        comm_thread_marker=_GLOO,
        rules=(
            Rule(target="communication", cats=frozenset({"user_annotation"}), name=_GLOO,
                 collective=True, why="gloo collective on a gloo worker thread (transfer time)"),
            Rule(target=IGNORE, cats=frozenset({"cpu_op"}), comm_thread=True,
                 why="ops inside a gloo worker's collective are part of the transfer"),
            Rule(target="other", cats=frozenset({"cpu_op"}), name=r"(c10d::|record_param_comms)",
                 not_compute=True, why="collective enqueue on the main thread, not compute"),
            Rule(target="compute", cats=frozenset({"cpu_op"}), comm_thread=False,
                 why="forward, backward and optimizer ops on the training threads"),
        ),
    ),
    "cuda-nccl": RuleTable(regime="cuda-nccl", rules=_CUDA_NCCL_RULES, comm=DEFAULT_COMM),
    "cuda-gloo": RuleTable(
        regime="cuda-gloo",
        comm_thread_marker=_GLOO,
        rules=(
            Rule(target="communication", cats=frozenset({"user_annotation"}), name=_GLOO,
                 collective=True, why="gloo collective on a host worker thread"),
            Rule(target="communication", cats=frozenset({"gpu_memcpy"}), comm_thread=True,
                 why="device<->host staging copies launched by gloo threads"),
            Rule(target="compute", cats=frozenset({"kernel"}), why="GPU kernels"),
            Rule(target="memcpy", cats=frozenset({"gpu_memcpy"}), why="other device copies"),
            Rule(target="memset", cats=frozenset({"gpu_memset"}), why="device memsets"),
            Rule(target="sync", cats=frozenset({"cuda_sync"}), why="device-side waits"),
        ),
    ),
    "cuda-single": RuleTable(regime="cuda-single", rules=_CUDA_NCCL_RULES, comm=DEFAULT_COMM),
}  # fmt: skip
"""The rule table of each regime; extend one with ``dataclasses.replace``. ``cuda-single`` is a
trace-only regime (no matrix cell runs it): one GPU process with no communication backend in
the trace (no distributedInfo, no collective; single-GPU inference or training), classified as
cuda-nccl would be, so that a communication kernel still counts."""
TRACE_REGIMES = tuple(RULES)
"""Every regime a trace can be read in: the matrix's and ``cuda-single``."""


def needed_cats(tables: Iterable[RuleTable]) -> frozenset[str] | None:
    """Categories of the events that ``tables`` can use (None: any may matter).

    The rules' categories and the launches (correlation ids); a table with a rule on any
    category needs every event. Events of other categories whose name :func:`needed_names`
    matches are needed too (the ``ProfilerStep#N`` annotations, the launching ops): a
    ``user_annotation`` of the user's own is read only where a rule reads the category.
    """
    cats: set[str] = set(LAUNCH_CATS)
    for table in tables:
        for rule in table.rules:
            if rule.cats is None:
                return None
            cats |= rule.cats
    return frozenset(cats)


def needed_names(tables: tuple[RuleTable, ...]) -> re.Pattern[str]:
    """Names of the events needed whatever their category: the tables' communication-thread
    markers (a name in any category marks its thread), the ops that launch collectives
    (COMM_OP_PATTERN: their metadata types the kernels), the step annotations and, where more
    than one table may apply, the communication kernels (:func:`detect_regime` reads every
    name)."""
    names = [t.comm_thread_marker for t in tables if t.comm_thread_marker is not None]
    names += [COMM_OP_PATTERN, STEP_NAME_PATTERN]
    if any(t.comm is not None for t in tables):  # possible communication (possible_comm)
        names += [LIBRARY_RANGE_PATTERN, HOST_RANGE_PATTERN]
    if len(tables) > 1:
        names += [t.comm.comm_pattern() for t in tables if t.comm is not None]
    return re.compile("|".join(f"(?:{n})" for n in names))


def reads_python_functions(tables: tuple[RuleTable, ...]) -> bool:
    """Whether the Python frames of communication libraries (PYTHON_COMM_PATTERN) are kept, for
    the possible-communication check: where a table has communication rules (device regimes)."""
    return any(t.comm is not None for t in tables)


def tables_for_meta(tables: tuple[RuleTable, ...], meta: dict[str, Any]) -> tuple[RuleTable, ...]:
    """The candidate tables once the trace's top-level keys are known: a trace whose
    ``distributedInfo`` names an NCCL backend is cuda-nccl (as :func:`detect_regime` decides),
    so only that table's events need to be kept."""
    info = meta.get("distributedInfo")
    nccl = isinstance(info, dict) and "nccl" in str(info.get("backend", "")).lower()
    every = [t.regime for t in tables] == list(RULES)
    return tuple(t for t in tables if t.regime == "cuda-nccl") if nccl and every else tables


def candidate_tables(
    regime: str | None, rules: RuleTable | None, comm: CommRules | None = None
) -> tuple[RuleTable, ...]:
    """The rule tables a parse may apply: the given one, the regime's, or all (detect later),
    the device regimes' built from communication rules ``comm`` (default: the shipped ones).

    Raises:
        ValueError: If ``regime`` names no table and no ``rules`` are given.
    """
    if rules is not None:
        return (rules,)
    tables = RULES if comm is None or comm is DEFAULT_COMM else rule_tables(comm)
    if regime is None:
        return tuple(tables.values())
    if regime not in tables:
        raise ValueError(f"regime must be one of {sorted(tables)}, got {regime!r}")
    return (tables[regime],)


def detect_regime(
    trace: dict[str, Any],
    cats: Iterable[Any],
    names: Iterable[Any],
    comm_kernel: re.Pattern[str] = COMM_KERNEL_PATTERN,
) -> str:
    """Guess the regime from distributedInfo's backend and the presence of device events.

    A device trace without distributedInfo is cuda-nccl where a communication kernel ran,
    cuda-gloo where gloo annotations are, else cuda-single (one GPU, nothing communicated).

    Args:
        trace: The trace's top-level keys (``distributedInfo`` is read).
        cats: The distinct event categories.
        names: The distinct event names.
        comm_kernel: Names of communication kernels (``CommRules.comm_pattern``).

    Returns:
        One of TRACE_REGIMES.
    """
    backend = str((trace.get("distributedInfo") or {}).get("backend", "")).lower()
    has_device = bool(set(cats) & {"kernel", "gpu_memcpy", "gpu_memset"})
    if "nccl" in backend:
        return "cuda-nccl"
    if "gloo" in backend:
        return "cuda-gloo" if has_device else "cpu-gloo"
    if has_device:
        names = [str(n) for n in names]
        if any(comm_kernel.match(n) for n in names):
            return "cuda-nccl"
        return "cuda-gloo" if any(n.startswith("gloo:") for n in names) else "cuda-single"
    return "cpu-gloo"

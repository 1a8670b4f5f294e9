"""Build the benchmark's Kineto trace shapes: what users' traces look like, each ~1M events.

- ``kernel_heavy``: an LLM step of many small kernels (about 40 % kernels, 45 % runtime calls,
  the rest ops, copies and annotations; the shape of the held-out 1.05M-event trace of issue
  #29: 418k kernels, 470k runtime calls), Kineto's full kernel args, compact JSON.
- ``cpu_heavy``: a ``with_stack=True`` profile: Python frames (``python_function``, about two
  thirds of the events) around ``cpu_op`` trees, few kernels.
- ``comm_heavy``: FSDP-like, many small all-gathers and reduce-scatters a step, as a ROCm rank
  writes them: RCCL's ``ncclDevKernel_Generic`` kernels whose metadata is only on the launching
  ``record_param_comms`` op, and a GPU running behind its CPU by more than a step.
- ``mixed``: the GPT-2-small DDP rank of ``make_nccl_trace.py`` (cpu ops with shapes, launches,
  kernels, copies, NCCL all-reduces with metadata on the kernels, flows).
- ``kernel_heavy_150k``: issue #43's kernel-heavy trace of 150k collectives in 1M events (not in
  the default set): per 3 collectives 5 compute kernels and a synchronising runtime call; each
  collective an NCCL kernel (all-reduce, all-gather, reduce-scatter in turn) launched under its
  ``record_param_comms`` op, the metadata on both, as PyTorch writes a CUDA rank (about 40 %
  kernels, 45 % runtime calls, 15 % ops).

and ``--ranks N`` small ranks of the comm_heavy shape (one job: the same collectives, sequence
numbers and process groups on every rank, each rank's clock shifted by its own offset).

One step is laid out once (seeded: byte for byte reproducible), then repeated with shifted
timestamps and fresh correlation ids and sequence numbers until the trace holds at least
``--min-events`` events.

Usage::

    python benchmarks/make_trace_shapes.py --out-dir /tmp/commprof-bench/shapes [--min-events N]
    python benchmarks/make_trace_shapes.py --out-dir /tmp/commprof-bench/ranks --ranks 128 \\
        --shape comm_heavy --min-events 20000
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import make_nccl_trace

SHAPES = ("kernel_heavy", "cpu_heavy", "comm_heavy", "mixed")
"""The shapes built by default."""
ALL_SHAPES = (*SHAPES, "kernel_heavy_150k")
PID, MAIN_TID, DEVICE = 4321, 4321, 0
COMPUTE_STREAM, COMM_STREAM = 7, 13
STEP_GAP_NS = 20_000


@dataclass(slots=True)
class _Step:
    """One step's events as Kineto text templates; times in ns from the step's start."""

    rng: random.Random
    lines: list[tuple[str, int, int]] = field(default_factory=list)
    """(template, ts_ns, kind): kind 1 holds %(corr)d, 2 %(seq)d as well."""
    num_corr: int = 0
    num_seq: int = 0
    end_ns: int = 0

    def add(self, text: str, ts_ns: int, dur_ns: int = 0, kind: int = 0) -> None:
        self.lines.append((text, ts_ns, kind))
        self.end_ns = max(self.end_ns, ts_ns + dur_ns)


def _us(ns: int) -> str:
    q, r = divmod(ns, 1000)
    return f"{q}.{r:03d}"


def _x(cat: str, name: str, pid: int, tid: int, dur_ns: int, args: str = "") -> str:
    """An X event's text with a %(ts)s placeholder (and the args' own placeholders)."""
    name_text = json.dumps(name).replace("%", "%%").replace("%%(step)d", "%(step)d")
    tail = f',"args":{{{args}}}' if args else ""
    return (
        f'{{"ph":"X","cat":"{cat}","name":{name_text},"pid":{pid},"tid":{tid},'
        f'"ts":%(ts)s,"dur":{_us(dur_ns)}{tail}}}'
    )


def _kernel_args(stream: int, rng: random.Random) -> str:
    grid = rng.choice((108, 132, 264, 528, 1024))
    return (
        f'"External id":%(corr)d,"queued":0,"device":{DEVICE},"context":1,"stream":{stream},'
        f'"correlation":%(corr)d,"registers per thread":{rng.choice((32, 64, 128, 168))},'
        f'"shared memory":{rng.choice((0, 16384, 49152))},"blocks per SM":{grid / 132:.6f},'
        f'"warps per SM":{grid * 4 / 132:.6f},"grid":[{grid},1,1],"block":[128,1,1],'
        f'"est. achieved occupancy %%":{rng.choice((12, 25, 50, 100))}'
    )


class _Corr:
    """Correlation ids local to the step (offset per replica by the writer)."""

    def __init__(self, step: _Step) -> None:
        self.step = step

    def next(self) -> int:
        self.step.num_corr += 1
        return self.step.num_corr


def _launch(
    s: _Step, host_ns: int, gpu_ns: int, name: str, dur_ns: int, stream: int,
    *, runtime: str = "cudaLaunchKernel", kernel_args: str | None = None,
) -> int:  # fmt: skip
    """A runtime launch on the main thread and its kernel; returns the runtime call's end."""
    corr = _Corr(s).next()
    rt_dur = s.rng.randint(3_000, 7_000)
    args = '"External id":%(corr)d,"cbid":211,"correlation":%(corr)d'
    s.add(
        _x("cuda_runtime", runtime, PID, MAIN_TID, rt_dur, args).replace(
            "%(corr)d", "%(c" + str(corr) + ")d"
        ),
        host_ns,
        rt_dur,
        1,
    )
    kargs = kernel_args if kernel_args is not None else _kernel_args(stream, s.rng)
    s.add(
        _x("kernel", name, DEVICE, stream, dur_ns, kargs).replace(
            "%(corr)d", "%(c" + str(corr) + ")d"
        ),
        gpu_ns,
        dur_ns,
        1,
    )
    return host_ns + rt_dur


NCCL_ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
RCCL_GENERIC = "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"
KERNELS = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)",  # noqa: E501
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)",  # noqa: E501
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t> >(pytorch_flash::Flash_fwd_params)",  # noqa: E501
    "triton_poi_fused_add_mul_silu_0",
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1",
)
OPS = ("aten::add", "aten::mm", "aten::layer_norm", "aten::_flash_attention_forward",
       "aten::silu", "aten::mul", "aten::to", "aten::copy_")  # fmt: skip


def _kernel_heavy(rng: random.Random) -> _Step:
    """Many small kernels: per op one launch and one kernel, some copies and memsets."""
    s = _Step(rng)
    s.add(_x("user_annotation", "ProfilerStep#%(step)d", PID, MAIN_TID, 0), 0, 0)
    host, gpu = 5_000, 40_000
    for i in range(1_200):
        op_dur = rng.randint(6_000, 12_000)
        if i % 4 == 0:
            s.add(_x("cpu_op", OPS[i % len(OPS)], PID, MAIN_TID, op_dur * 4,
                     '"External id":%(corr)d,"Record function id":0'), host, op_dur)  # fmt: skip
        dur = rng.randint(2_000, 40_000)
        gpu = max(gpu, host + 25_000)
        host = _launch(s, host + 500, gpu, KERNELS[i % len(KERNELS)], dur, COMPUTE_STREAM)
        gpu += dur + rng.randint(500, 2_000)
        if i % 9 == 0:  # a synchronising runtime call with no kernel
            s.add(_x("cuda_runtime", "cudaStreamIsCapturing", PID, MAIN_TID, 900), host, 900)
        if i % 50 == 0:
            corr = _Corr(s).next()
            tag = f'"correlation":%(c{corr})d'
            s.add(_x("cuda_runtime", "cudaMemsetAsync", PID, MAIN_TID, 4_000, tag), host, 4_000, 1)
            s.add(_x("gpu_memset", "Memset (Device)", DEVICE, COMPUTE_STREAM, 1_500, tag), gpu,
                  1_500, 1)  # fmt: skip
            gpu += 1_500
    _nccl_with_kernel_args(s, host, gpu, 2)
    s.lines[0] = (
        _x("user_annotation", "ProfilerStep#%(step)d", PID, MAIN_TID, host + 50_000),
        0,
        0,
    )
    return s


def _nccl_with_kernel_args(s: _Step, host: int, gpu: int, num: int) -> None:
    for _ in range(num):
        seq = s.num_seq
        s.num_seq += 1
        corr = _Corr(s).next()
        meta = (f'"Collective name":"allreduce","In msg nelems":{s.rng.randint(1, 9) * 2**20},'
                f'"Group size":8,"dtype":"BFloat16","Process Group Name":"0",'
                f'"Seq":%(s{seq})d')  # fmt: skip
        tag = f'"correlation":%(c{corr})d'
        where = f'"device":{DEVICE},"stream":{COMM_STREAM},'
        s.add(_x("cuda_runtime", "cudaLaunchKernelExC", PID, MAIN_TID, 5_000, tag), host, 5_000, 1)
        dur = s.rng.randint(300_000, 900_000)
        gpu = max(gpu, host + 25_000)
        s.add(_x("kernel", NCCL_ALLREDUCE,
                 DEVICE, COMM_STREAM, dur, f"{where}{tag},{meta}"), gpu, dur, 2)  # fmt: skip
        host += 20_000
        gpu += dur


PY_FRAMES = (
    "torch/nn/modules/module.py(1736): _wrapped_call_impl",
    "torch/nn/modules/module.py(1747): _call_impl",
    "model.py(212): forward",
    "model.py(147): forward",
    "torch/nn/modules/linear.py(125): forward",
    "torch/nn/functional.py(2910): layer_norm",
    "<built-in method linear of type object at 0x7f3c2b1a9d20>",
)


def _cpu_heavy(rng: random.Random) -> _Step:
    """A with_stack profile: each op under a few Python frames; a kernel every few ops."""
    s = _Step(rng)
    s.add("", 0, 0)  # the step annotation, written last with its length
    t = 3_000
    for i in range(800):
        depth = rng.randint(3, 6)
        op_dur = rng.randint(15_000, 60_000)
        for d in range(depth):
            args = f'"Python parent id":{i * 8 + d},"Python id":{i * 8 + d + 1},"Ev Idx":{i}'
            frame = PY_FRAMES[(i + d) % len(PY_FRAMES)]
            s.add(_x("python_function", frame, PID, MAIN_TID, op_dur + (depth - d) * 4_000, args),
                  t + d * 1_000, 0)  # fmt: skip
        op_t = t + depth * 1_000
        s.add(_x("cpu_op", OPS[i % len(OPS)], PID, MAIN_TID, op_dur,
                 '"External id":%(corr)d,"Input Dims":[[4096, 4096], [4096]],'
                 '"Input type":["c10::BFloat16", "c10::BFloat16"],"Ev Idx":1'),
              op_t, op_dur)  # fmt: skip
        for j in range(2):  # the op's own children
            s.add(_x("cpu_op", "aten::empty", PID, MAIN_TID, 2_000, '"External id":%(corr)d'),
                  op_t + 1_000 + j * 3_000, 0)  # fmt: skip
        if i % 6 == 0:
            _launch(s, op_t + 9_000, op_t + 30_000, KERNELS[i % len(KERNELS)],
                    rng.randint(5_000, 30_000), COMPUTE_STREAM)  # fmt: skip
        t += op_dur + depth * 4_000 + 2_000
    _nccl_with_kernel_args(s, t, t + 50_000, 1)
    s.lines[0] = (_x("user_annotation", "ProfilerStep#%(step)d", PID, MAIN_TID, t + 30_000), 0, 0)
    return s


NCCL_COLLECTIVES = (
    ("allreduce", NCCL_ALLREDUCE),
    ("_allgather_base", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
    ("reduce_scatter_tensor",
     "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
)  # fmt: skip
COLLECTIVES_PER_STEP = 600
"""kernel_heavy_150k: 600 collectives in 4001 events a step, so 1M events hold 150k."""


def _kernel_heavy_150k(rng: random.Random) -> _Step:
    """Many small kernels and a collective after every one or two of them: per 3 collectives
    5 compute kernels (launch and kernel each) and a synchronising runtime call; each collective
    its ``record_param_comms`` op around the launch of its NCCL kernel, both with metadata."""
    s = _Step(rng)
    s.add("", 0, 0)  # the step annotation, written last with its length
    host, gpu, gpu_comm = 5_000, 40_000, 40_000
    for i in range(COLLECTIVES_PER_STEP):
        for k in range(1 if i % 3 == 0 else 2):  # the compute the collective follows
            dur = rng.randint(2_000, 40_000)
            gpu = max(gpu, host + 25_000)
            host = _launch(s, host + 500, gpu, KERNELS[(i + k) % len(KERNELS)], dur, COMPUTE_STREAM)
            gpu += dur + rng.randint(500, 2_000)
        if i % 3 == 0:
            s.add(_x("cuda_runtime", "cudaStreamIsCapturing", PID, MAIN_TID, 900), host, 900)
            host += 1_000
        coll, kernel = NCCL_COLLECTIVES[i % len(NCCL_COLLECTIVES)]
        seq = s.num_seq
        s.num_seq += 1
        meta = (f'"Collective name":"{coll}","In msg nelems":{rng.randint(1, 256) * 4096},'
                f'"Group size":8,"dtype":"BFloat16","Process Group Name":"0",'
                f'"Seq":%(s{seq})d')  # fmt: skip
        s.add(_x("cpu_op", "record_param_comms", PID, MAIN_TID, 30_000,
                 f'{meta},"External id":%(corr)d'), host, 30_000, 2)  # fmt: skip
        corr = _Corr(s).next()
        tag = f'"correlation":%(c{corr})d'
        launch = f'"External id":%(c{corr})d,"cbid":430,{tag}'
        s.add(_x("cuda_runtime", "cudaLaunchKernelExC", PID, MAIN_TID, 5_000, launch),
              host + 10_000, 5_000, 1)  # fmt: skip
        dur = rng.randint(20_000, 120_000)
        start = max(gpu_comm, gpu, host + 35_000)  # after the compute it reduces
        where = f'"device":{DEVICE},"stream":{COMM_STREAM},'
        s.add(_x("kernel", kernel, DEVICE, COMM_STREAM, dur, f"{where}{tag},{meta}"), start, dur, 2)
        gpu_comm = start + dur
        host += 32_000
    s.lines[0] = (
        _x("user_annotation", "ProfilerStep#%(step)d", PID, MAIN_TID, host + 20_000),
        0,
        0,
    )
    return s


COMM_LAG_NS = 60_000_000
"""The comm_heavy GPU runs 60 ms behind its CPU (more than a step)."""


def _comm_heavy(rng: random.Random) -> _Step:
    """FSDP-like: per layer an all-gather before and a reduce-scatter after its compute;
    RCCL generic kernels, metadata only on the launching op; the GPU lags by COMM_LAG_NS."""
    s = _Step(rng)
    s.add("", 0, 0)
    host, gpu_compute, gpu_comm = 10_000, COMM_LAG_NS, COMM_LAG_NS
    for layer in range(160):
        for coll, pg in (("_allgather_base", "1"), ("reduce_scatter_tensor", "2")):
            seq = s.num_seq
            s.num_seq += 1
            meta = (f'"Collective name":"{coll}","Process Group Name":"{pg}","Group size":8,'
                    f'"In msg nelems":{rng.randint(1, 64) * 4096},"dtype":"BFloat16",'
                    f'"Seq":%(s{seq})d,"External id":%(corr)d')  # fmt: skip
            s.add(_x("cpu_op", "c10d::" + coll.strip("_") + "_", PID, MAIN_TID, 60_000), host, 0)
            s.add(_x("cpu_op", "record_param_comms", PID, MAIN_TID, 50_000, meta), host + 4_000,
                  0, 2)  # fmt: skip
            s.add(_x("user_annotation", "nccl:" + coll.strip("_"), PID, MAIN_TID, 30_000),
                  host + 9_000, 0)  # fmt: skip
            dur = rng.randint(15_000, 60_000)
            start = max(gpu_comm, host + 20_000 + COMM_LAG_NS)
            _launch(s, host + 20_000, start, RCCL_GENERIC,
                    dur, COMM_STREAM, runtime="hipExtLaunchKernel",
                    kernel_args='"device":0,"stream":13,"correlation":%(corr)d')  # fmt: skip
            gpu_comm = start + dur
            host += 70_000
            for k in range(3):  # the layer's compute
                dur = rng.randint(10_000, 40_000)
                start = max(gpu_compute, host + 20_000 + COMM_LAG_NS)
                s.add(
                    _x("cpu_op", OPS[k], PID, MAIN_TID, 15_000, '"External id":%(corr)d'), host, 0
                )
                _launch(s, host + 2_000, start, KERNELS[(layer + k) % len(KERNELS)], dur,
                        COMPUTE_STREAM, runtime="hipLaunchKernel")  # fmt: skip
                gpu_compute = start + dur
                host += 18_000
    s.lines[0] = (_x("user_annotation", "ProfilerStep#%(step)d", PID, MAIN_TID, host), 0, 0)
    s.end_ns = host  # the next step starts on the CPU: its GPU work queues behind this one's
    return s


def _header(shape: str, rank: int, world_size: int) -> dict[str, Any]:
    info: dict[str, Any] = {"backend": "nccl", "rank": rank, "world_size": world_size}
    return {"schemaVersion": 1, "distributedInfo": info, "traceName": f"{shape} rank {rank}",
            "displayTimeUnit": "ms", "baseTimeNanoseconds": 1_764_669_600_000_000_000}  # fmt: skip


def _open(path: Path) -> IO[str]:
    return gzip.open(path, "wt", encoding="ascii", compresslevel=1, newline="\n")


def write_shape(
    shape: str, out_dir: Path, *, min_events: int, seed: int = 0, rank: int = 0,
    world_size: int = 8, offset_ns: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """Write one trace of ``shape`` into ``out_dir``; returns its summary."""
    if shape == "mixed":
        spec = make_nccl_trace.TraceSpec(min_events=min_events, seed=seed, rank=rank,
                                         world_size=world_size)  # fmt: skip
        return make_nccl_trace.write_trace(spec, out_dir)
    build = {"kernel_heavy": _kernel_heavy, "cpu_heavy": _cpu_heavy, "comm_heavy": _comm_heavy,
             "kernel_heavy_150k": _kernel_heavy_150k}  # fmt: skip
    step = build[shape](random.Random(seed))
    lines = [ln for ln in step.lines if ln[0]]
    num_steps = max(1, -(-min_events // len(lines)))
    period = step.end_ns + STEP_GAP_NS
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"rank{rank}.{shape}.pt.trace.json.gz"
    base = 6_452_910_117_123 + offset_ns
    with _open(path) as fh:
        header = json.dumps(_header(shape, rank, world_size))[:-1]
        fh.write(header + ',"traceEvents":[\n')
        first = True
        for k in range(num_steps):
            shift = base + k * period
            values: dict[str, Any] = {"step": k}
            values.update({f"c{i}": k * step.num_corr + i for i in range(1, step.num_corr + 1)})
            values.update({f"s{i}": k * step.num_seq + i for i in range(step.num_seq)})
            chunk = []
            for text, ts, _ in lines:
                values["ts"] = _us(shift + ts)
                values["corr"] = k * step.num_corr
                chunk.append(text % values)
            fh.write(("" if first else ",\n") + ",\n".join(chunk))
            first = False
        names = [
            {"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": "python"}},
            {"name": "process_name", "ph": "M", "pid": DEVICE, "tid": 0, "args": {"name": "GPU 0"}},
            {"name": "thread_name", "ph": "M", "pid": DEVICE, "tid": COMM_STREAM,
             "args": {"name": f"stream {COMM_STREAM}"}},
        ]  # fmt: skip
        fh.write(",\n" + ",\n".join(json.dumps(n) for n in names) + "\n]}\n")
    return {"path": str(path), "shape": shape, "num_events": num_steps * len(lines) + len(names),
            "num_steps": num_steps, "file_bytes": path.stat().st_size, "seed": seed}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--shape", choices=ALL_SHAPES, action="append",
                    help=f"default: {', '.join(SHAPES)}")  # fmt: skip
    ap.add_argument("--min-events", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=0, help="N small ranks of one job (one shape)")
    args = ap.parse_args(argv)
    shapes = args.shape or list(SHAPES)
    if args.ranks:
        if len(shapes) != 1:
            ap.error("--ranks needs exactly one --shape")
        out = [
            write_shape(
                shapes[0],
                args.out_dir,
                min_events=args.min_events,
                rank=r,
                world_size=args.ranks,
                offset_ns=(r * 7919) % 5_000_000,
            )
            for r in range(args.ranks)
        ]
    else:
        out = [write_shape(s, args.out_dir / s, min_events=args.min_events) for s in shapes]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

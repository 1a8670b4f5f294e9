"""Build a synthetic but real-shaped cuda-nccl Kineto trace of one DDP rank.

The trace imitates what ``torch.profiler`` (Kineto) writes for one rank of a
GPT-2-small-like DDP job on CUDA with NCCL: a ``ProfilerStep#N`` per step,
``cpu_op`` events with shapes, ``cuda_runtime`` launches, ``kernel``,
``gpu_memcpy`` and ``gpu_memset`` activities on CUDA stream 7, NCCL all-reduce
kernels on their own stream (20) launched from the autograd thread under
``nccl:all_reduce`` / ``record_param_comms`` with the collective metadata in
``args``, ``gpu_user_annotation`` projections, ``ac2g`` flows,
and the top-level ``schemaVersion``, ``deviceProperties``, ``distributedInfo``
and ``baseTimeNanoseconds`` keys. The layout (field order, one event over a
few lines, float microsecond timestamps with three decimals) follows the
traces in HolisticTraceAnalysis' ``tests/data`` and Kineto's
``ChromeTraceLogger``.

One step template is simulated once (seeded, so the output is byte for byte
reproducible), then replicated with shifted timestamps and fresh correlation /
external ids until the trace holds at least ``--min-events`` events. DDP
buckets follow DDP's rules (reverse parameter order, 25 MiB cap, first bucket
1 MiB); each all-reduce lasts the ring cost ``alpha + 2 (p-1)/p n / bw``
(Patarasuk and Yuan 2009) on a 100 GbE link, so communication partly overlaps
backward compute and partly runs exposed after it.

Deliberate coverage: bucket all-reduces use the NCCL >= 2.19 kernel name
(``ncclDevKernel_*``) and the per-step loss all-reduce uses the older
``ncclKernel_*`` name, so a parser must handle both families.

Usage::

    python benchmarks/make_nccl_trace.py --out-dir /tmp/commprof-bench/nccl_trace
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

# Kineto ids and layout constants (values seen in real H100 traces).
PID = 2345
"""Host process id; also the main thread id."""
AUTOGRAD_TID = 2401
"""Thread id of the CUDA autograd worker (pt_autograd_0)."""
DEVICE = 0
COMPUTE_STREAM = 7
NCCL_STREAM = 20
BASE_TS_NS = 6_452_910_117_123
"""First event time, ns since baseTimeNanoseconds (ts = 6452910117.123 us)."""
STEP_GAP_NS = 18_250
"""Host time between the end of one ProfilerStep and the start of the next."""

CBID_LAUNCH = 211  # cudaLaunchKernel
CBID_LAUNCH_EXC = 430  # cudaLaunchKernelExC_v11060 (NCCL >= 2.19)
CBID_MEMCPY = 41  # cudaMemcpyAsync
CBID_SYNC = 131  # cudaStreamSynchronize
CBID_EVENT_RECORD = 135  # cudaEventRecord
CBID_WAIT_EVENT = 147  # cudaStreamWaitEvent

GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"  # noqa: E501
GEMM_NN = "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x256x32_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"  # noqa: E501
GEMM_NT = "sm90_xmma_gemm_f32f32_tf32f32_f32_nt_n_tilesize256x128x32_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"  # noqa: E501
LAYER_NORM = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*, float const*, float const*, float*, float*, float*)"  # noqa: E501
LAYER_NORM_BWD_IN = "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<float, float>(float const*, float const*, float const*, float const*, float const*, float*, int)"  # noqa: E501
LAYER_NORM_BWD_W = "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel_32x32<float, float>(long, long, float const*, float const*, float const*, float const*, float*, float*)"  # noqa: E501
FLASH_FWD = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::half_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::half_t> >, false, true, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)"  # noqa: E501
FLASH_BWD_DOT = "void pytorch_flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<64, 128, 128, 8, 2, 4, 2, false, false, cutlass::half_t, Flash_kernel_traits<64, 128, 128, 8, cutlass::half_t> > >(pytorch_flash::Flash_bwd_params)"  # noqa: E501
FLASH_BWD = "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8, 2, 4, 2, false, false, cutlass::half_t, Flash_kernel_traits<64, 128, 128, 8, cutlass::half_t> >, true, true, false, false, false, true, false, false>(pytorch_flash::Flash_bwd_params)"  # noqa: E501
FLASH_BWD_CVT = "void pytorch_flash::flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8, 2, 4, 2, false, false, cutlass::half_t, Flash_kernel_traits<64, 128, 128, 8, cutlass::half_t> > >(pytorch_flash::Flash_bwd_params, int)"  # noqa: E501
DROPOUT = "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float, float, unsigned int, 1, 4, bool>(at::cuda::detail::TensorInfo<float const, unsigned int>, at::cuda::detail::TensorInfo<float, unsigned int>, at::cuda::detail::TensorInfo<bool, unsigned int>, unsigned int, float, at::PhiloxCudaState)"  # noqa: E501
MASKED_SCALE = "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::masked_scale_kernel<bool, float, float>(at::Tensor&, at::Tensor const&, at::Tensor const&, float)::{lambda(float, bool)#1}, std::array<char*, 3ul> >(int, at::native::(anonymous namespace)::masked_scale_kernel<bool, float, float>(at::Tensor&, at::Tensor const&, at::Tensor const&, float)::{lambda(float, bool)#1}, std::array<char*, 3ul>)"  # noqa: E501
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)"  # noqa: E501
GELU = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>)"  # noqa: E501
GELU_BWD = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float, float)#1}, std::array<char*, 3ul> >(int, at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(float, float)#1}, std::array<char*, 3ul>)"  # noqa: E501
REDUCE_SUM = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4>)"  # noqa: E501
COPY = "void at::native::vectorized_elementwise_kernel<4, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>)"  # noqa: E501
INDEX_SELECT = "void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo<float, unsigned int>, at::cuda::detail::TensorInfo<float const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, unsigned int, long)"  # noqa: E501
EMB_BWD = "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float, float, long>(long const*, float const*, float*, int, long, int, int)"  # noqa: E501
RADIX_SORT = "void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<at_cuda_detail::cub::DeviceRadixSortPolicy<long, long, int>::Policy900, false, long, long, int, int, at_cuda_detail::cub::detail::identity_decomposer_t>(int*, int*, long*, long const*, long*, long*, long const*, long*, int, int, int, at_cuda_detail::cub::detail::identity_decomposer_t)"  # noqa: E501
LOG_SOFTMAX = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)"  # noqa: E501
LOG_SOFTMAX_BWD = "void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>(float*, float const*, float const*, long)"  # noqa: E501
NLL = "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, float*, float const*, long const*, float const*, bool, long, long, long, long)"  # noqa: E501
NLL_BWD = "void at::native::(anonymous namespace)::nll_loss_backward_reduce_cuda_kernel_2d<float, long>(float*, float const*, long const*, float const*, float const*, bool, int, int, long, long)"  # noqa: E501
ADAMW = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, float*, float*>(at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, float*, float*)"  # noqa: E501
NCCL_DEV = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_LEGACY = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceSpec:
    """What to build."""

    min_events: int = 1_000_000
    """Replicate steps until the trace holds at least this many events."""
    seed: int = 0
    """Seed of the one-step template (durations, host overheads)."""
    num_layers: int = 12
    """Transformer blocks of the GPT-2-small-like model."""
    world_size: int = 8
    """Ranks of the (simulated) job; enters the ring all-reduce time."""
    rank: int = 0
    """Rank written in distributedInfo."""
    bucket_cap_bytes: int = 25 * 2**20
    """DDP bucket_cap_mb (25 MiB default); the first bucket is capped at 1 MiB."""
    link_bytes_per_s: float = 12.5e9
    """Per-direction link bandwidth (100 GbE, IEEE 802.3ba: 12.5 GB/s)."""
    nccl_alpha_ns: int = 18_000
    """Per-collective latency term of the ring model."""
    gzip_output: bool = True
    """Write .json.gz (Kineto's tensorboard_trace_handler(use_gzip=True)); else .json."""

    def __post_init__(self) -> None:
        if self.min_events < 1:
            raise ValueError(f"min_events must be >= 1, got {self.min_events}")
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if self.world_size < 2:
            raise ValueError(f"world_size must be >= 2, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size), got {self.rank}")
        if self.bucket_cap_bytes <= 0 or self.link_bytes_per_s <= 0:
            raise ValueError("bucket_cap_bytes and link_bytes_per_s must be > 0")


@dataclass(slots=True)
class _Event:
    """One template event; ids are local to the step and offset per replica."""

    ph: str
    cat: str
    name: str
    pid: int
    tid: int
    ts_ns: int
    dur_ns: int | None = None
    args: dict[str, Any] = field(default_factory=dict)
    flow_id: int | None = None


@dataclass(slots=True)
class _Sim:
    """Mutable state of the one-step simulation."""

    rng: random.Random
    events: list[_Event] = field(default_factory=list)
    next_corr: int = 1
    next_ext: int = 1
    next_ev_idx: int = 0
    stream_free_ns: dict[int, int] = field(default_factory=dict)
    ext_stack: list[int] = field(default_factory=list)

    def jitter(self, mean_ns: int, rel: float = 0.06) -> int:
        return max(1, int(self.rng.gauss(mean_ns, mean_ns * rel)))


def _us(ns: int) -> str:
    """Kineto's float-microsecond text with three decimals (ns precision)."""
    q, r = divmod(ns, 1000)
    return f"{q}.{r:03d}"


def _cpu(sim: _Sim, cat: str, name: str, tid: int, ts: int, dur: int, **extra: Any) -> _Event:
    ext = sim.next_ext
    sim.next_ext += 1
    args: dict[str, Any] = {"External id": ext}
    if cat == "cpu_op":
        args["Record function id"] = 0
        args["Ev Idx"] = sim.next_ev_idx
        sim.next_ev_idx += 1
    args.update(extra)
    ev = _Event("X", cat, name, PID, tid, ts, dur, args)
    sim.events.append(ev)
    return ev


def _launch(
    sim: _Sim,
    *,
    tid: int,
    ts: int,
    ext: int,
    cat: str,
    name: str,
    stream: int,
    dur_ns: int,
    ready_ns: int = 0,
    runtime: str = "cudaLaunchKernel",
    cbid: int = CBID_LAUNCH,
    gpu_args: dict[str, Any] | None = None,
) -> tuple[int, int]:
    """Emit runtime call + GPU activity + ac2g flow; return (runtime end, gpu end)."""
    corr = sim.next_corr
    sim.next_corr += 1
    rt_dur = sim.jitter(4_800 if cbid != CBID_MEMCPY else 7_200)
    rt = _Event(
        "X",
        "cuda_runtime",
        runtime,
        PID,
        tid,
        ts,
        rt_dur,
        {"External id": ext, "cbid": cbid, "correlation": corr},
    )
    start = max(
        ts + sim.jitter(2_900), sim.stream_free_ns.get(stream, 0) + sim.jitter(1_300), ready_ns
    )
    args: dict[str, Any] = {"External id": ext, "queued": 0, "device": DEVICE, "context": 1}
    args["stream"] = stream
    args["correlation"] = corr
    if cat == "kernel":
        args.update(
            {
                "registers per thread": sim.rng.choice((32, 40, 64, 96, 128, 168)),
                "shared memory": sim.rng.choice((0, 4096, 16384, 49152)),
                "blocks per SM": round(sim.rng.uniform(0.5, 12.0), 6),
                "warps per SM": round(sim.rng.uniform(2.0, 48.0), 6),
                "grid": [sim.rng.choice((132, 264, 768, 2048)), 1, 1],
                "block": [sim.rng.choice((128, 256, 512)), 1, 1],
                "est. achieved occupancy %": sim.rng.randint(12, 100),
            }
        )
    if gpu_args:
        args.update(gpu_args)
    gpu = _Event("X", cat, name, DEVICE, stream, start, dur_ns, args)
    sim.stream_free_ns[stream] = start + dur_ns
    sim.events.append(rt)
    sim.events.append(gpu)
    sim.events.append(_Event("s", "ac2g", "ac2g", PID, tid, ts, flow_id=corr))
    sim.events.append(_Event("f", "ac2g", "ac2g", DEVICE, stream, start, flow_id=corr))
    return ts + rt_dur, start + dur_ns


def _op(
    sim: _Sim,
    tid: int,
    ts: int,
    name: str,
    kernels: list[tuple[str, int]],
    *,
    child: str | None = None,
    shapes: list[list[int]] | None = None,
    ready_ns: int = 0,
    extra: dict[str, Any] | None = None,
) -> tuple[int, int]:
    """A cpu_op (optionally wrapping one child op) that launches kernels.

    Returns:
        (host end ns, end ns of the last kernel).
    """
    dims = shapes or [[8, 1024, 768]]
    args = {"Input Dims": dims, "Input type": ["float"] * len(dims), **(extra or {})}
    outer = _cpu(sim, "cpu_op", name, tid, ts, 0, **args)
    t = ts + sim.jitter(6_000)
    inner = None
    if child is not None:
        inner = _cpu(sim, "cpu_op", child, tid, t, 0, **args)
        t += sim.jitter(3_500)
    ext = (inner or outer).args["External id"]
    gpu_end = 0
    for kname, kdur in kernels:
        t, gpu_end = _launch(
            sim,
            tid=tid,
            ts=t,
            ext=ext,
            cat="kernel",
            name=kname,
            stream=COMPUTE_STREAM,
            dur_ns=sim.jitter(kdur),
            ready_ns=ready_ns,
        )
        t += sim.jitter(1_500)
    if inner is not None:
        inner.dur_ns = t - inner.ts_ns
        t += sim.jitter(1_200)
    outer.dur_ns = t - ts + sim.jitter(1_000)
    return outer.ts_ns + outer.dur_ns, gpu_end


# Per-block forward ops: (op, child op, kernels[(name, mean ns)]).
_FWD_BLOCK: list[tuple[str, str | None, list[tuple[str, int]]]] = [
    ("aten::layer_norm", "aten::native_layer_norm", [(LAYER_NORM, 58_000)]),
    ("aten::linear", "aten::addmm", [(GEMM, 410_000)]),
    (
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention",
        [(FLASH_FWD, 360_000)],
    ),
    ("aten::linear", "aten::addmm", [(GEMM, 150_000)]),
    ("aten::dropout", "aten::native_dropout", [(DROPOUT, 41_000)]),
    ("aten::add", None, [(ADD, 46_000)]),
    ("aten::layer_norm", "aten::native_layer_norm", [(LAYER_NORM, 58_000)]),
    ("aten::linear", "aten::addmm", [(GEMM, 560_000)]),
    ("aten::gelu", None, [(GELU, 118_000)]),
    ("aten::linear", "aten::addmm", [(GEMM, 555_000)]),
    ("aten::dropout", "aten::native_dropout", [(DROPOUT, 41_000)]),
    ("aten::add", None, [(ADD, 46_000)]),
]
# Per-block backward nodes, in backward order: (node, kernels, params made ready).
_BWD_BLOCK: list[tuple[str, list[tuple[str, int]], list[str]]] = [
    ("NativeDropoutBackward0", [(MASKED_SCALE, 44_000)], []),
    (
        "AddmmBackward0",
        [(GEMM_NN, 560_000), (GEMM_NT, 575_000), (REDUCE_SUM, 21_000)],
        ["mlp_proj"],
    ),
    ("GeluBackward0", [(GELU_BWD, 160_000)], []),
    ("AddmmBackward0", [(GEMM_NN, 570_000), (GEMM_NT, 580_000), (REDUCE_SUM, 33_000)], ["mlp_fc"]),
    (
        "NativeLayerNormBackward0",
        [(LAYER_NORM_BWD_IN, 71_000), (LAYER_NORM_BWD_W, 39_000)],
        ["ln2"],
    ),
    ("AddBackward0", [(ADD, 46_000)], []),
    ("NativeDropoutBackward0", [(MASKED_SCALE, 44_000)], []),
    (
        "AddmmBackward0",
        [(GEMM_NN, 155_000), (GEMM_NT, 160_000), (REDUCE_SUM, 19_000)],
        ["attn_proj"],
    ),
    (
        "ScaledDotProductFlashAttentionBackward0",
        [(FLASH_BWD_DOT, 28_000), (FLASH_BWD, 820_000), (FLASH_BWD_CVT, 24_000)],
        [],
    ),
    (
        "AddmmBackward0",
        [(GEMM_NN, 420_000), (GEMM_NT, 430_000), (REDUCE_SUM, 27_000)],
        ["attn_qkv"],
    ),
    (
        "NativeLayerNormBackward0",
        [(LAYER_NORM_BWD_IN, 71_000), (LAYER_NORM_BWD_W, 39_000)],
        ["ln1"],
    ),
]
_BLOCK_PARAMS: dict[str, list[tuple[str, int]]] = {
    # name -> [(param suffix, numel)]; GPT-2 small, width 768.
    "ln1": [("ln_1.weight", 768), ("ln_1.bias", 768)],
    "attn_qkv": [("attn.c_attn.weight", 768 * 2304), ("attn.c_attn.bias", 2304)],
    "attn_proj": [("attn.c_proj.weight", 768 * 768), ("attn.c_proj.bias", 768)],
    "ln2": [("ln_2.weight", 768), ("ln_2.bias", 768)],
    "mlp_fc": [("mlp.c_fc.weight", 768 * 3072), ("mlp.c_fc.bias", 3072)],
    "mlp_proj": [("mlp.c_proj.weight", 3072 * 768), ("mlp.c_proj.bias", 768)],
}


def _ring_allreduce_ns(spec: TraceSpec, num_bytes: int) -> int:
    """T = alpha + 2 (p-1)/p n / bw (Patarasuk and Yuan 2009, one alpha per call)."""
    p = spec.world_size
    return spec.nccl_alpha_ns + int(2 * (p - 1) / p * num_bytes / spec.link_bytes_per_s * 1e9)


def _comm_args(spec: TraceSpec, numel: int, seq: int) -> dict[str, Any]:
    return {
        "Collective name": "allreduce",
        "In msg nelems": numel,
        "Out msg nelems": numel,
        "Group size": spec.world_size,
        "dtype": "Float",
        "In split size": "[]",
        "Out split size": "[]",
        "Process Group Name": "0",
        "Process Group Description": "default_pg",
        "Process Group Ranks": "[" + ", ".join(str(r) for r in range(spec.world_size)) + "]",
        "Rank": spec.rank,
        "Seq": seq,
    }


def _allreduce(
    sim: _Sim,
    spec: TraceSpec,
    *,
    tid: int,
    ts: int,
    numel: int,
    ready_ns: int,
    kernel: str,
    seq: int,
) -> tuple[int, int]:
    """DDP's hook path: nccl:all_reduce > record_param_comms > launches. Returns (host, gpu) end."""
    ann = _cpu(sim, "user_annotation", "nccl:all_reduce", tid, ts, 0)
    t = ts + sim.jitter(4_000)
    meta = _comm_args(spec, numel, seq)
    rpc = _cpu(sim, "cpu_op", "record_param_comms", tid, t, 0, **meta)
    ext = rpc.args["External id"]
    t += sim.jitter(9_000)
    for rt_name, cbid in (
        ("cudaEventRecord", CBID_EVENT_RECORD),
        ("cudaStreamWaitEvent", CBID_WAIT_EVENT),
    ):
        corr = sim.next_corr
        sim.next_corr += 1
        dur = sim.jitter(2_100)
        sim.events.append(
            _Event(
                "X",
                "cuda_runtime",
                rt_name,
                PID,
                tid,
                t,
                dur,
                {"External id": ext, "cbid": cbid, "correlation": corr},
            )
        )
        t += dur + sim.jitter(700)
    t, gpu_end = _launch(
        sim,
        tid=tid,
        ts=t,
        ext=ext,
        cat="kernel",
        name=kernel,
        stream=NCCL_STREAM,
        dur_ns=_ring_allreduce_ns(spec, 4 * numel),
        ready_ns=ready_ns,
        runtime="cudaLaunchKernelExC_v11060",
        cbid=CBID_LAUNCH_EXC,
        gpu_args=meta,
    )
    rpc.dur_ns = t - rpc.ts_ns + sim.jitter(2_000)
    ann.dur_ns = rpc.ts_ns + rpc.dur_ns - ts + sim.jitter(1_500)
    gpu = sim.events[-3]
    sim.events.append(
        _Event(
            "X",
            "gpu_user_annotation",
            "nccl:all_reduce",
            DEVICE,
            NCCL_STREAM,
            gpu.ts_ns,
            gpu.dur_ns,
            {"External id": ann.args["External id"]},
        )
    )
    return ann.ts_ns + ann.dur_ns, gpu_end


def _param_list(spec: TraceSpec) -> list[tuple[str, int]]:
    """Parameters in registration order (DDP buckets them in reverse)."""
    params = [("transformer.wte.weight", 50257 * 768), ("transformer.wpe.weight", 1024 * 768)]
    for i in range(spec.num_layers):
        for group in ("ln1", "attn_qkv", "attn_proj", "ln2", "mlp_fc", "mlp_proj"):
            params += [(f"transformer.h.{i}.{s}", n) for s, n in _BLOCK_PARAMS[group]]
    return [*params, ("transformer.ln_f.weight", 768), ("transformer.ln_f.bias", 768)]


def _buckets(spec: TraceSpec) -> list[list[str]]:
    """DDP's bucketing: reverse order, first bucket capped at 1 MiB, then bucket_cap_bytes."""
    buckets: list[list[str]] = [[]]
    size = 0
    cap = min(2**20, spec.bucket_cap_bytes)
    for name, numel in reversed(_param_list(spec)):
        buckets[-1].append(name)
        size += 4 * numel
        if size >= cap:
            buckets.append([])
            size = 0
            cap = spec.bucket_cap_bytes
    return [b for b in buckets if b]


def build_step(spec: TraceSpec) -> tuple[list[_Event], int]:
    """Simulate one training step; return its events and its period in ns."""
    sim = _Sim(rng=random.Random(spec.seed))
    numel = dict(_param_list(spec))
    bucket_of = {p: i for i, b in enumerate(_buckets(spec)) for p in b}
    buckets = _buckets(spec)
    pending = [len(b) for b in buckets]
    ready_gpu = [0] * len(buckets)
    step = _cpu(sim, "user_annotation", "ProfilerStep#0", PID, 0, 0)
    t = sim.jitter(9_000)
    dl = _cpu(
        sim,
        "user_annotation",
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
        PID,
        t,
        sim.jitter(780_000),
    )
    t = dl.ts_ns + (dl.dur_ns or 0) + sim.jitter(12_000)
    for _ in range(2):  # input ids and targets, pinned -> device
        op = _cpu(
            sim,
            "cpu_op",
            "aten::to",
            PID,
            t,
            0,
            **{"Input Dims": [[8, 1024]], "Input type": ["long int"]},
        )
        inner = _cpu(sim, "cpu_op", "aten::copy_", PID, t + sim.jitter(5_000), 0)
        end, _ = _launch(
            sim,
            tid=PID,
            ts=inner.ts_ns + sim.jitter(3_000),
            ext=inner.args["External id"],
            cat="gpu_memcpy",
            name="Memcpy HtoD (Pinned -> Device)",
            stream=COMPUTE_STREAM,
            dur_ns=sim.jitter(5_600),
            runtime="cudaMemcpyAsync",
            cbid=CBID_MEMCPY,
            gpu_args={"bytes": 65536, "memory bandwidth (GB/s)": 11.7},
        )
        inner.dur_ns = end - inner.ts_ns + sim.jitter(1_000)
        op.dur_ns = inner.ts_ns + inner.dur_ns - t + sim.jitter(1_000)
        t = op.ts_ns + op.dur_ns + sim.jitter(3_000)
    _cpu(sim, "user_annotation", "Optimizer.zero_grad#AdamW.zero_grad", PID, t, sim.jitter(31_000))
    t += 40_000
    fwd = _cpu(sim, "user_annotation", "DistributedDataParallel.forward", PID, t, 0)
    fwd_gpu_start = sim.stream_free_ns.get(COMPUTE_STREAM, 0)
    t += sim.jitter(25_000)
    seq = 0
    fwd_seq: list[int] = []
    t, _ = _op(
        sim,
        PID,
        t,
        "aten::embedding",
        [(INDEX_SELECT, 31_000)],
        child="aten::index_select",
        extra={"Sequence number": seq},
    )
    t, _ = _op(
        sim,
        PID,
        t,
        "aten::embedding",
        [(INDEX_SELECT, 9_000)],
        child="aten::index_select",
        extra={"Sequence number": seq + 1},
    )
    t, _ = _op(sim, PID, t, "aten::add", [(ADD, 46_000)])
    seq += 2
    for _layer in range(spec.num_layers):
        for name, child, kernels in _FWD_BLOCK:
            t, _ = _op(sim, PID, t, name, kernels, child=child, extra={"Sequence number": seq})
            fwd_seq.append(seq)
            seq += 1
    t, _ = _op(
        sim, PID, t, "aten::layer_norm", [(LAYER_NORM, 58_000)], child="aten::native_layer_norm"
    )
    t, _ = _op(
        sim,
        PID,
        t,
        "aten::linear",
        [(GEMM, 3_050_000)],
        child="aten::mm",
        shapes=[[8192, 768], [768, 50257]],
    )
    fwd.dur_ns = t - fwd.ts_ns + sim.jitter(4_000)
    sim.events.append(
        _Event(
            "X",
            "gpu_user_annotation",
            "DistributedDataParallel.forward",
            DEVICE,
            COMPUTE_STREAM,
            fwd_gpu_start,
            sim.stream_free_ns[COMPUTE_STREAM] - fwd_gpu_start,
            {"External id": fwd.args["External id"]},
        )
    )
    t = fwd.ts_ns + fwd.dur_ns + sim.jitter(3_000)
    t, _ = _op(
        sim,
        PID,
        t,
        "aten::cross_entropy",
        [(LOG_SOFTMAX, 640_000), (NLL, 14_000)],
        child="aten::log_softmax",
        shapes=[[8192, 50257], [8192]],
    )
    # Backward on the autograd thread; the main thread waits, unrecorded.
    tb = t + sim.jitter(30_000)
    tb, _ = _op(
        sim,
        AUTOGRAD_TID,
        tb,
        "autograd::engine::evaluate_function: NllLossBackward0",
        [(NLL_BWD, 12_000)],
        child="NllLossBackward0",
    )
    tb, _ = _op(
        sim,
        AUTOGRAD_TID,
        tb,
        "autograd::engine::evaluate_function: LogSoftmaxBackward0",
        [(LOG_SOFTMAX_BWD, 690_000)],
        child="LogSoftmaxBackward0",
    )
    tb, _ = _op(
        sim,
        AUTOGRAD_TID,
        tb,
        "autograd::engine::evaluate_function: MmBackward0",
        [(GEMM_NN, 3_100_000), (GEMM_NT, 3_150_000)],
        child="MmBackward0",
    )
    ar_seq = 0

    def grads_ready(params: list[str], tb: int) -> int:
        nonlocal ar_seq
        for p in params:
            tb, _ = _op(
                sim,
                AUTOGRAD_TID,
                tb,
                "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
                [(COPY, max(4_000, numel[p] // 220))],
                child="torch::autograd::AccumulateGrad",
            )
            b = bucket_of[p]
            pending[b] -= 1
            ready_gpu[b] = max(ready_gpu[b], sim.stream_free_ns[COMPUTE_STREAM])
            # DDP launches buckets strictly in order once each is complete.
            while ar_seq < len(buckets) and pending[ar_seq] == 0:
                n = sum(numel[q] for q in buckets[ar_seq])
                tb, _ = _allreduce(
                    sim,
                    spec,
                    tid=AUTOGRAD_TID,
                    ts=tb + sim.jitter(6_000),
                    numel=n,
                    ready_ns=ready_gpu[ar_seq],
                    kernel=NCCL_DEV,
                    seq=ar_seq,
                )
                ar_seq += 1
        return tb

    tb = grads_ready(["transformer.ln_f.weight", "transformer.ln_f.bias"], tb)
    block_groups = {g: [s for s, _ in ps] for g, ps in _BLOCK_PARAMS.items()}
    for layer in reversed(range(spec.num_layers)):
        for i, (node, kernels, groups) in enumerate(_BWD_BLOCK):
            fseq = fwd_seq[layer * len(_FWD_BLOCK) + min(i, len(_FWD_BLOCK) - 1)]
            tb, _ = _op(
                sim,
                AUTOGRAD_TID,
                tb,
                f"autograd::engine::evaluate_function: {node}",
                kernels,
                child=node,
                extra={"Fwd thread id": 0, "Sequence number": fseq},
            )
            for g in groups:
                tb = grads_ready([f"transformer.h.{layer}.{s}" for s in block_groups[g]], tb)
    tb, _ = _op(
        sim,
        AUTOGRAD_TID,
        tb,
        "autograd::engine::evaluate_function: EmbeddingBackward0",
        [],
        child="EmbeddingBackward0",
    )
    # embedding backward: zero the dense grad (memset) then sort + scatter.
    ext = sim.events[-1].args["External id"]
    tb, _ = _launch(
        sim,
        tid=AUTOGRAD_TID,
        ts=tb,
        ext=ext,
        cat="gpu_memset",
        name="Memset (Device)",
        stream=COMPUTE_STREAM,
        dur_ns=sim.jitter(61_000),
        runtime="cudaMemsetAsync",
        cbid=51,
        gpu_args={"bytes": 50257 * 768 * 4, "memory bandwidth (GB/s)": 2540.1},
    )
    tb, _ = _op(
        sim,
        AUTOGRAD_TID,
        tb,
        "aten::embedding_dense_backward",
        [(RADIX_SORT, 19_000), (RADIX_SORT, 19_000), (EMB_BWD, 96_000)],
        child="aten::embedding_backward",
    )
    tb = grads_ready(["transformer.wpe.weight", "transformer.wte.weight"], tb)
    assert ar_seq == len(buckets), "every bucket must have been all-reduced"
    nccl_end = sim.stream_free_ns[NCCL_STREAM]
    # Optimizer: DDP's finalize makes the compute stream wait for the last all-reduce.
    t = max(t, tb) + sim.jitter(40_000)
    opt = _cpu(sim, "user_annotation", "Optimizer.step#AdamW.step", PID, t, 0)
    opt_gpu_start = max(sim.stream_free_ns[COMPUTE_STREAM], nccl_end)
    t, _ = _op(
        sim,
        PID,
        t + sim.jitter(8_000),
        "aten::_fused_adamw_",
        [(ADAMW, 310_000)] * 8,
        ready_ns=nccl_end,
        shapes=[[148]],
    )
    opt.dur_ns = t - opt.ts_ns + sim.jitter(3_000)
    sim.events.append(
        _Event(
            "X",
            "gpu_user_annotation",
            "Optimizer.step#AdamW.step",
            DEVICE,
            COMPUTE_STREAM,
            opt_gpu_start + 1_000,
            sim.stream_free_ns[COMPUTE_STREAM] - opt_gpu_start - 1_000,
            {"External id": opt.args["External id"]},
        )
    )
    # Loss all-reduce for logging (older NCCL kernel name), then loss.item().
    t, loss_end = _allreduce(
        sim,
        spec,
        tid=PID,
        ts=t + sim.jitter(5_000),
        numel=1,
        ready_ns=0,
        kernel=NCCL_LEGACY,
        seq=ar_seq,
    )
    item = _cpu(
        sim,
        "cpu_op",
        "aten::item",
        PID,
        t + sim.jitter(4_000),
        0,
        **{"Input Dims": [[]], "Input type": ["float"]},
    )
    inner = _cpu(sim, "cpu_op", "aten::_local_scalar_dense", PID, item.ts_ns + sim.jitter(3_000), 0)
    t, dtoh_end = _launch(
        sim,
        tid=PID,
        ts=inner.ts_ns + sim.jitter(2_500),
        ext=inner.args["External id"],
        cat="gpu_memcpy",
        name="Memcpy DtoH (Device -> Pageable)",
        stream=COMPUTE_STREAM,
        dur_ns=sim.jitter(2_300),
        ready_ns=loss_end,
        runtime="cudaMemcpyAsync",
        cbid=CBID_MEMCPY,
        gpu_args={"bytes": 4, "memory bandwidth (GB/s)": 0.002},
    )
    sync_end = max(t, dtoh_end) + sim.jitter(6_000)
    corr = sim.next_corr
    sim.next_corr += 1
    sim.events.append(
        _Event(
            "X",
            "cuda_runtime",
            "cudaStreamSynchronize",
            PID,
            PID,
            t + 500,
            sync_end - t - 500,
            {"External id": inner.args["External id"], "cbid": CBID_SYNC, "correlation": corr},
        )
    )
    inner.dur_ns = sync_end - inner.ts_ns + sim.jitter(1_500)
    item.dur_ns = inner.ts_ns + inner.dur_ns - item.ts_ns + sim.jitter(1_500)
    step.dur_ns = item.ts_ns + item.dur_ns + sim.jitter(9_000)
    gpu_start = min(e.ts_ns for e in sim.events if e.pid == DEVICE)
    sim.events.append(
        _Event(
            "X",
            "gpu_user_annotation",
            "ProfilerStep#0",
            DEVICE,
            COMPUTE_STREAM,
            gpu_start,
            sim.stream_free_ns[COMPUTE_STREAM] - gpu_start,
            {"External id": step.args["External id"]},
        )
    )
    period = max(step.dur_ns, max(e.ts_ns + (e.dur_ns or 0) for e in sim.events)) + STEP_GAP_NS
    sim.events.sort(key=lambda e: (e.ts_ns, e.pid != PID))
    return sim.events, period


def _header(spec: TraceSpec) -> dict[str, Any]:
    ranks = list(range(spec.world_size))
    return {
        "schemaVersion": 1,
        "deviceProperties": [
            {
                "id": DEVICE,
                "name": "NVIDIA H100 80GB HBM3",
                "totalGlobalMem": 85029158912,
                "computeMajor": 9,
                "computeMinor": 0,
                "maxThreadsPerBlock": 1024,
                "maxThreadsPerMultiprocessor": 2048,
                "regsPerBlock": 65536,
                "warpSize": 32,
                "sharedMemPerBlock": 49152,
                "numSms": 132,
                "regsPerMultiprocessor": 65536,
                "sharedMemPerBlockOptin": 232448,
                "sharedMemPerMultiprocessor": 233472,
            }
        ],
        "distributedInfo": {
            "backend": "nccl",
            "rank": spec.rank,
            "world_size": spec.world_size,
            "pg_count": 1,
            "pg_config": [
                {
                    "pg_name": "0",
                    "pg_desc": "default_pg",
                    "backend_config": "cuda:nccl",
                    "pg_size": spec.world_size,
                    "ranks": ranks,
                }
            ],
            "nccl_version": "2.21.5",
        },
        "cupti_version": 24,
        "cuda_runtime_version": 12040,
        "cuda_driver_version": 12040,
        "record_shapes": 1,
        "with_stack": 0,
        "profile_memory": 0,
        "trace_id": f"{spec.seed:016X}",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1_764_669_600_000_000_000,
    }


def _metadata_events() -> list[str]:
    """Kineto's process/thread naming ("M") events, as it writes them."""
    rows = [
        (PID, 0, "process_name", {"name": "python"}),
        (PID, 0, "process_labels", {"labels": "CPU"}),
        (PID, 0, "process_sort_index", {"sort_index": PID}),
        (DEVICE, 0, "process_name", {"name": "python"}),
        (DEVICE, 0, "process_labels", {"labels": f"GPU {DEVICE}"}),
        (DEVICE, 0, "process_sort_index", {"sort_index": 5000000}),
        (PID, PID, "thread_name", {"name": "thread 2345 (python)"}),
        (PID, AUTOGRAD_TID, "thread_name", {"name": "thread 2401 (pt_autograd_0)"}),
        (DEVICE, COMPUTE_STREAM, "thread_name", {"name": f"stream {COMPUTE_STREAM} "}),
        (DEVICE, NCCL_STREAM, "thread_name", {"name": f"stream {NCCL_STREAM} "}),
    ]
    out = []
    for pid, tid, name, args in rows:
        out.append(
            f'  {{\n    "name": "{name}", "ph": "M", "ts": {_us(BASE_TS_NS)}, '
            f'"pid": {pid}, "tid": {tid},\n'
            f'    "args": {json.dumps(args)}\n  }}'
        )
    return out


def _template(ev: _Event) -> tuple[str, bool]:
    """Kineto text of an event with %(ts)s, %(corr)d, %(ext)d, ... placeholders."""
    name = json.dumps(ev.name).replace("%", "%%")
    head = f'"ph": "{ev.ph}", "cat": "{ev.cat}", "name": {name}, "pid": {ev.pid}, "tid": {ev.tid},'
    if ev.ph in ("s", "f"):
        bp = ', "bp": "e"' if ev.ph == "f" else ""
        return f'  {{\n    {head}\n    "ts": %(ts)s, "id": %(flow)d{bp}\n  }}', True
    body = f'    "ts": %(ts)s, "dur": {_us(ev.dur_ns or 0)}'
    if not ev.args:
        return f"  {{\n    {head}\n{body}\n  }}", False
    parts = []
    for k, v in ev.args.items():
        if k in ("External id", "correlation", "Ev Idx", "Seq"):
            key = {"External id": "ext", "correlation": "corr", "Ev Idx": "evidx", "Seq": "seq"}[k]
            parts.append(f'"{k}": %({key})d')
        else:
            parts.append(f"{json.dumps(k)}: {json.dumps(v)}".replace("%", "%%"))
    name_fmt = head.replace("ProfilerStep#0", "ProfilerStep#%(step)d")
    return (
        f'  {{\n    {name_fmt}\n{body},\n    "args": {{\n      {", ".join(parts)}\n    }}\n  }}',
        False,
    )


def _open_text(path: Path, gz: bool) -> IO[str]:
    """Text writer; gzip level 1 keeps the build fast (reading speed is the same)."""
    if gz:
        return gzip.open(path, "wt", encoding="ascii", compresslevel=1, newline="\n")
    return open(path, "w", encoding="ascii", newline="\n")


def write_trace(spec: TraceSpec, out_dir: Path) -> dict[str, Any]:
    """Write the trace; return a summary (path, events, steps, bytes)."""
    events, period = build_step(spec)
    num_corr = 1 + max((e.args or {}).get("correlation", 0) for e in events)
    num_ext = 1 + max((e.args or {}).get("External id", 0) for e in events)
    num_evidx = 1 + max((e.args or {}).get("Ev Idx", 0) for e in events)
    num_seq = 1 + max((e.args or {}).get("Seq", 0) for e in events)
    meta = _metadata_events()
    num_steps = max(1, -(-(spec.min_events - len(meta)) // len(events)))
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = ".pt.trace.json.gz" if spec.gzip_output else ".pt.trace.json"
    path = out_dir / f"rank-{spec.rank}.synthetic_nccl{suffix}"
    for old in out_dir.iterdir():  # HTA reads every trace file in the folder
        if old.name.endswith((".json", ".json.gz")) and old != path:
            raise ValueError(f"{out_dir} holds another trace ({old.name}); use an empty --out-dir")
    templates = [_template(e) for e in events]
    header = json.dumps(_header(spec), indent=2)[:-2]  # drop the closing "\n}"
    with _open_text(path, spec.gzip_output) as fh:
        fh.write(header + ',\n  "traceEvents": [\n')
        fh.write(",\n".join(meta))
        for s in range(num_steps):
            shift = BASE_TS_NS + s * period
            chunk = []
            for ev, (fmt, is_flow) in zip(events, templates, strict=True):
                if is_flow:
                    chunk.append(
                        fmt
                        % {"ts": _us(ev.ts_ns + shift), "flow": (ev.flow_id or 0) + s * num_corr}
                    )
                    continue
                a = ev.args or {}
                chunk.append(
                    fmt
                    % {
                        "ts": _us(ev.ts_ns + shift),
                        "corr": a.get("correlation", 0) + s * num_corr,
                        "ext": a.get("External id", 0) + s * num_ext,
                        "evidx": a.get("Ev Idx", 0) + s * num_evidx,
                        "seq": a.get("Seq", 0) + s * num_seq,
                        "step": s,
                    }
                )
            fh.write(",\n" + ",\n".join(chunk))
        fh.write('\n  ],\n  "traceName": "' + path.name + '"\n}\n')
    return {
        "path": str(path),
        "num_events": len(meta) + num_steps * len(events),
        "num_events_per_step": len(events),
        "num_steps": num_steps,
        "step_period_ns": period,
        "file_bytes": path.stat().st_size,
        "seed": spec.seed,
        "gzip": spec.gzip_output,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, required=True, help="empty folder for the trace")
    parser.add_argument("--min-events", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plain", action="store_true", help="write .json instead of .json.gz")
    args = parser.parse_args(argv)
    spec = TraceSpec(min_events=args.min_events, seed=args.seed, gzip_output=not args.plain)
    print(json.dumps(write_trace(spec, args.out_dir), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

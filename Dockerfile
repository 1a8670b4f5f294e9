# syntax=docker/dockerfile:1
# commprof for GPU nodes: the project, a CUDA build of torch, Ray, and `commprof check` as the
# health check.
#
# CUDA pairing (change these two together):
#   torch 2.14.1  - its Linux x86_64 wheel on the default package index is the CUDA 13.0 build
#                   (it depends on nvidia-cuda-runtime 13.0.x and cuda-toolkit 13.0.x)
#   nvidia/cuda:13.0.0-runtime-ubuntu24.04 - the matching CUDA 13.0 runtime base image
# The host needs an NVIDIA driver for CUDA 13.0 (R580 or newer) and the NVIDIA Container
# Toolkit. For an older driver, pair a CUDA 12.8 build of torch ("+cu128" wheels from PyTorch's
# own wheel index) with nvidia/cuda:12.8.1-runtime-ubuntu24.04 instead.
#
#   docker build -t commprof:cu130 .
#   docker run --rm --gpus all --ipc=host commprof:cu130 commprof check
#   docker run --rm --gpus all --ipc=host -v "$PWD/results:/opt/commprof/results" \
#       commprof:cu130 python sweeps/run_matrix.py --matrix sweeps/smoke.yaml
#
# Run the driver as `python sweeps/run_matrix.py` from /opt/commprof (the working directory):
# it then ships this source tree to Ray workers and writes results/ under it.
FROM nvidia/cuda:13.0.0-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Ubuntu 24.04's python3 is 3.12 and externally managed (PEP 668): install into a venv.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv procps \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

# torch first, in its own layer (several GB): the project accepts any torch >= 2.4 and keeps it.
ARG TORCH_VERSION=2.14.1
ARG TORCH_CUDA=13.0
RUN pip install "torch==${TORCH_VERSION}" \
    && python -c "import sys, torch; c = torch.version.cuda or 'cpu'; \
print('torch', torch.__version__, 'cuda', c); \
sys.exit(0 if c.startswith('${TORCH_CUDA}') else 'torch CUDA ' + c + ' != ${TORCH_CUDA}')"

# Ray on the image must match the Ray of the cluster it joins (cluster.yaml pins the same).
ARG RAY_VERSION=2.60.0
RUN pip install "ray[default,data]==${RAY_VERSION}"

WORKDIR /opt/commprof
COPY . .
# From outside the source tree, so that the check reads the installed package's own data files.
RUN pip install ".[run]" && cd / && commprof --help >/dev/null && commprof check smoke >/dev/null

HEALTHCHECK --interval=5m --timeout=2m --start-period=30s --retries=3 \
    CMD commprof check > /dev/null || exit 1

CMD ["commprof", "check"]

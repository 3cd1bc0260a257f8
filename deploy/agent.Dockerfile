# syntax=docker/dockerfile:1
# The GPU Share agent for NVIDIA GPUs, and the runtime image its Docker sandbox runs each
# job in (the same image: `python` on PATH with gpu_share and its runtimes installed).
#
#   docker build -f docker/agent.Dockerfile -t gpu-share-agent:latest .
#
# Run it with install.sh --docker, or as compose.yaml's agent service shows: `--gpus all`,
# the Docker socket (jobs run in sibling containers with only their assigned GPUs) and the
# data folder at the same path inside and out. Not built in CI (no Docker engine there).

ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${CUDA_IMAGE}
# onnxruntime-gpu for CUDA 12 and cuDNN 9, which the base image carries.
ARG ONNXRUNTIME_GPU_VERSION=1.22.0
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The distribution's Python (3.12) as the base image's release has it; the image tag pins it.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=wheel /wheels /tmp/wheels
RUN python3 -m venv /opt/gpu-share/venv \
    && wheel="$(ls /tmp/wheels/gpu_share-*.whl)" \
    && /opt/gpu-share/venv/bin/pip install "${wheel}[agent,catboost]" \
        "onnxruntime-gpu==${ONNXRUNTIME_GPU_VERSION}" \
    && rm -rf /tmp/wheels

# uid 10001 is what install.sh --docker hands the data folder to (AGENT_UID there).
RUN useradd --system --uid 10001 --user-group --create-home \
        --home-dir /var/lib/gpu-share-agent gpu-share
ENV PATH=/opt/gpu-share/venv/bin:$PATH \
    GPUSHARE_AGENT_DATA_DIR=/var/lib/gpu-share-agent
USER 10001:10001
WORKDIR /var/lib/gpu-share-agent
# CMD, not ENTRYPOINT: the Docker sandbox runs jobs in this image with their own command.
CMD ["gpu-share", "agent"]

# syntax=docker/dockerfile:1
# The GPU Share coordinator (`gpu-share server`), as compose.yaml runs it on PostgreSQL.
#
#   docker build -f docker/coordinator.Dockerfile -t gpu-share-coordinator:latest .
#   docker run -p 8080:8080 -v gpu-share:/var/lib/gpu-share gpu-share-coordinator:latest
#
# Settings are the GPUSHARE_* variables of README ("Running a server"). Alone it keeps
# SQLite and the artifacts in /var/lib/gpu-share. Not built in CI (no Docker engine there).

ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=wheel /wheels /tmp/wheels
RUN python -m venv /opt/gpu-share/venv \
    && wheel="$(ls /tmp/wheels/gpu_share-*.whl)" \
    && /opt/gpu-share/venv/bin/pip install "${wheel}[server]" \
    && rm -rf /tmp/wheels
RUN useradd --system --uid 10001 --user-group --create-home \
        --home-dir /var/lib/gpu-share gpu-share
ENV PATH=/opt/gpu-share/venv/bin:$PATH \
    GPUSHARE_HOST=0.0.0.0 \
    GPUSHARE_PORT=8080 \
    GPUSHARE_DATA_DIR=/var/lib/gpu-share
USER 10001:10001
WORKDIR /var/lib/gpu-share
VOLUME ["/var/lib/gpu-share"]
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=4)"]
CMD ["gpu-share", "server"]

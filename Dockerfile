# syntax=docker/dockerfile:1
# bigfleet-trio: one image for both binaries (`bigfleet-trio operator`, `bigfleet-trio pod-controller`).
#   docker build -t bigfleet-trio:0.1.0 .
# Multi-stage: the builder makes a self-contained venv; the final stage copies only that venv onto
# a clean slim base (no compilers, no pip), runs as uid 65532 and works with a read-only root fs.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first (better layer caching), then the package itself.
COPY pyproject.toml README.md ./
COPY bigfleet_trio ./bigfleet_trio
RUN pip install --upgrade pip wheel \
 && pip wheel --wheel-dir /wheels . \
 && pip install --no-index --find-links /wheels bigfleet-trio \
 && python -m compileall -q /opt/venv/lib \
 && (pip uninstall -y pip wheel setuptools || true)

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="bigfleet-trio" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.description="BigFleet per-cluster agent (operator + pod controller) on Trio" \
      org.opencontainers.image.licenses="Apache-2.0"
# No pip/setuptools in the runtime image either.
RUN (python -m pip uninstall -y pip setuptools wheel >/dev/null 2>&1 || true) \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin nonroot
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
WORKDIR /tmp
EXPOSE 8770 8080
ENTRYPOINT ["bigfleet-trio"]
CMD ["--help"]

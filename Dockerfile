# bigfleet-trio: one image for both binaries (`bigfleet-trio operator`, `bigfleet-trio pod-controller`).
#   docker build --build-arg VERSION=0.1.0 -t bigfleet-trio:0.1.0 .
# The production image (the default, last stage) carries no simulation: bigfleet_trio/sim is left
# out before the install, so `sim` and `demo` are not among its commands. The demo image adds it:
#   docker build --build-arg VERSION=0.1.0 --target demo -t bigfleet-trio-demo:0.1.0 .
# VERSION must equal pyproject.toml's version (the build checks it); it becomes the version label.
# Multi-stage: the builder makes a self-contained venv; the final stage copies only that venv onto
# a clean slim base (no compilers, no pip), runs as uid 65532 and works with a read-only root fs.
# Where the public base cannot be pulled, build on a local one: --build-arg PYTHON_IMAGE=...
# (scripts/image-smoke makes one).

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Layer 1, dependencies: exactly the pinned runtime closure (constraints.txt) and the build backend.
# Nothing of the package is copied yet, so a change to it re-uses this layer.
COPY constraints.txt ./
RUN pip install --require-virtualenv -r constraints.txt setuptools==84.2.1
# Layer 2, the package: no dependency resolution (--no-deps), then pip check proves the pinned set
# satisfies pyproject.toml (a dependency added there but not to constraints.txt fails here).
COPY pyproject.toml README.md ./
COPY bigfleet_trio ./bigfleet_trio
ARG VERSION
RUN rm -rf bigfleet_trio/sim \
 && python -c "import sys, tomllib; want = tomllib.load(open('pyproject.toml', 'rb'))['project']['version']; \
sys.exit(0 if '${VERSION}' == want else f'build with --build-arg VERSION={want} (got \"${VERSION}\")')" \
 && pip install --no-deps --no-build-isolation . \
 && pip check \
 && python -m compileall -q /opt/venv/lib \
 && (pip uninstall -y pip setuptools wheel || true)

# The demo's venv: the production one plus the simulation package (its files and package data,
# compiled like the rest).
FROM builder AS builder-demo
COPY bigfleet_trio/sim /src/sim
# From / and in isolated mode: in /src, `import bigfleet_trio` would find the source tree in the
# working directory instead of the installed package, and the sim would land beside the wrong one.
WORKDIR /
RUN python -I -c "import os, shutil, bigfleet_trio as b; \
assert b.__file__.startswith('/opt/venv/'), b.__file__; \
shutil.copytree('/src/sim', os.path.join(os.path.dirname(b.__file__), 'sim'))" \
 && python -m compileall -q /opt/venv/lib

FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION
LABEL org.opencontainers.image.title="bigfleet-trio" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.description="BigFleet per-cluster agent (operator + pod controller) on Trio" \
      org.opencontainers.image.licenses="Apache-2.0"
# No pip/setuptools in the runtime image either.
RUN (python -m pip uninstall -y pip setuptools wheel >/dev/null 2>&1 || true) \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin nonroot
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
WORKDIR /tmp
# metrics (operator, pod controller; served beyond loopback only with --metrics-addr=:PORT and
# --metrics-auth, as the Deployments do) and the probes' own port (--health-probe-addr=:8081)
EXPOSE 8770 8080 8081
ENTRYPOINT ["bigfleet-trio"]
CMD ["--help"]

# `--target demo`: the same image with the simulation (`bigfleet-trio demo`, `sim ...`).
FROM runtime AS demo
COPY --from=builder-demo /opt/venv /opt/venv

# The production image (default target).
FROM runtime
COPY --from=builder /opt/venv /opt/venv

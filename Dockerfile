# syntax=docker/dockerfile:1
# The prescaler operator image.
#
#   docker build -t REGISTRY/prescaler:0.1.0 .
#
# Two stages on the same slim Python base:
# - build: installs the project and its pinned dependencies into the virtualenv /opt/venv
#   with hack/image/install.sh, from wheels only (nothing is compiled; the project itself
#   is built into a wheel first, so no source tree reaches the image);
# - final: only /opt/venv, a numeric non-root user (10001, the Helm chart's runAsUser), no
#   compilers. It runs with a read-only root filesystem when /tmp is writable (an emptyDir):
#   HOME, matplotlib's cache and cmdstan's output files all live under /tmp.
# tests/image/test_image_install.py runs the same install script and hack/image/smoke.py
# in a fresh virtualenv, where no container engine is at hand.

FROM python:3.11-slim-bookworm AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY forecasting ./forecasting
COPY hack/image/install.sh ./hack/image/install.sh
RUN --mount=type=cache,target=/root/.cache/pip \
    sh hack/image/install.sh /opt/venv /src


FROM python:3.11-slim-bookworm

# kopf's peering identity asks for the user name, so the uid needs a passwd entry.
RUN groupadd --system --gid 10001 prescaler \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin prescaler

COPY --from=build /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:$PATH \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

USER 10001:10001
WORKDIR /tmp

# The CLI starts, no compiler is on PATH, and Prophet fits with its bundled Stan model,
# as the image's user; the check's files in /tmp are removed.
RUN --mount=type=bind,source=hack/image/smoke.py,target=/opt/smoke.py \
    python /opt/smoke.py && rm -rf /tmp/matplotlib

ENTRYPOINT ["prescaler"]
CMD ["run"]

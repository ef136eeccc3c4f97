# Flex-DSA worker image: Celery workers running optimisation jobs (`flexdsa worker`).
# Build from the repository root: docker build -f docker/worker.Dockerfile .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, in their own layer (see api.Dockerfile).
COPY pyproject.toml ./
RUN mkdir -p flexdsa_core service workers \
    && touch README.md flexdsa_core/__init__.py service/__init__.py workers/__init__.py \
    && pip install . \
    && pip uninstall -y flexdsa \
    && rm -rf flexdsa_core service workers build *.egg-info README.md

COPY README.md ./
COPY flexdsa_core ./flexdsa_core
COPY service ./service
COPY workers ./workers
COPY stack ./stack
COPY migrations ./migrations
RUN pip install --no-deps -e . \
    && useradd --system --uid 10001 --home-dir /data flexdsa \
    && mkdir -p /data/artifacts \
    && chown -R flexdsa /data

# Vendor toolchains baked into the image, each in its own virtual environment (never this one):
#   docker build -f docker/worker.Dockerfile --build-arg TOOLCHAINS="rockchip qualcomm amd" .
# Empty (the default): bundles for those targets ship uncompiled, with the command to finish elsewhere.
ARG TOOLCHAINS=""
ENV FLEXDSA_TOOLCHAINS_DIR=/opt/flexdsa/toolchains
RUN if [ -n "$TOOLCHAINS" ]; then flexdsa toolchains install $TOOLCHAINS --root /opt/flexdsa/toolchains; fi

USER flexdsa
ENV FLEXDSA_DATA_DIR=/data \
    FLEXDSA_ARTIFACT_DIR=/data/artifacts
VOLUME ["/data"]

# Alive = this worker's Celery node answers a ping through the broker. The node is named celery@<hostname>,
# the container's hostname.
HEALTHCHECK --interval=30s --timeout=15s --start-period=60s --retries=3 \
    CMD ["sh", "-c", "celery -A workers.app inspect ping --destination celery@$(hostname) --timeout 10 >/dev/null"]

# Each worker process takes one job at a time; scale with --concurrency or `docker compose up --scale worker=N`.
CMD ["flexdsa", "worker"]

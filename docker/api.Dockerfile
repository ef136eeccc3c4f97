# Flex-DSA API image: the FastAPI service (`flexdsa serve`) and the `flexdsa db upgrade` / `flexdsa keys`
# commands. Build from the repository root: docker build -f docker/api.Dockerfile .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, in their own layer: source and README edits then rebuild in seconds (only
# pyproject.toml invalidates it; README.md is a stub here). The stub packages only
# let pip resolve the project's dependencies; the real project is installed below.
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
# Editable, so `migrations/` (not part of the wheel) sits beside the `service` package where
# service.core.db.migrations_dir() looks for it, and the `flexdsa.cli` entry points are registered.
RUN pip install --no-deps -e . \
    && useradd --system --uid 10001 --home-dir /data flexdsa \
    && mkdir -p /data/artifacts \
    && chown -R flexdsa /data

USER flexdsa
# Data (the artifact store) lives on a volume shared with the workers; see docker-compose.yml.
ENV FLEXDSA_DATA_DIR=/data \
    FLEXDSA_ARTIFACT_DIR=/data/artifacts \
    FLEXDSA_HOST=0.0.0.0 \
    FLEXDSA_PORT=8000
VOLUME ["/data"]
EXPOSE 8000

# Ready = database reachable and migrated, broker and Redis reachable, artifact store writable.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4)"]

CMD ["flexdsa", "serve"]

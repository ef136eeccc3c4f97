# The two commands of the quick start, and the benchmarks. Everything installs itself into .venv/.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: serve test test-fast bench bench-large bench-service bench-targets install toolchains docker docs docs-serve

# Install, optimise the example model shipped in the repo, then start the service on embedded defaults.
serve: $(VENV)/.installed
	$(BIN)/flexdsa optimize examples/tiny_bert.onnx --target cpu-ort -o out/tiny_bert
	$(BIN)/flexdsa serve

# The whole test suite: compiler core, service and workers against real PostgreSQL, Redis and Celery
# workers, and the dashboard in headless Chromium. In two runs, both always run:
# - everything but the services and the browser (the compiler, the API on SQLite, the models, the vendor
#   compilers) on TEST_PROCESSES pytest-xdist processes, each taking the next test as it is free;
# - the tests on the services and in Chromium in one process: they share the Redis databases, which each
#   session flushes at its start, and the Celery workers each session starts.
TEST_PROCESSES ?= 2
test: $(VENV)/.installed-test $(VENV)/.installed-docs
	scripts/check-test-services.sh
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_PROCESSES) --dist worksteal -m "not services and not browser" --durations=25; \
	compiler=$$?; \
	$(BIN)/python -m pytest -q -m "services or browser" --durations=15; \
	services=$$?; \
	echo "make test: compiler and models exit $$compiler, services and browser exit $$services"; \
	test $$compiler -eq 0 -a $$services -eq 0

# The compiler core and the API on SQLite, without Celery workers, real-architecture models or Chromium:
# the loop to run while changing code (the whole suite still runs in CI).
test-fast: $(VENV)/.installed-test
	$(BIN)/ruff check .
	FLEXDSA_TEST_TOOLCHAINS=skip $(BIN)/python -m pytest -q -n 2 -m "not models and not services and not browser" --durations=10 \
		--ignore=tests/workers

# Vendor compilers that install here, each in its own environment under ~/.cache/flexdsa/toolchains (minutes
# the first time; a ready one is skipped). Without them the vendor tests skip and bundles ship uncompiled.
# amd (AMD Quark with a CPU torch): about 3 minutes.
TOOLCHAINS ?= rockchip qualcomm amd
toolchains: $(VENV)/.installed
	$(BIN)/flexdsa toolchains install $(TOOLCHAINS)

# The docker-compose.yml stack (api, worker, postgres, redis) built, started, and checked the way a user would
# use it (scripts/docker-smoke.sh: readiness, an API key, a job on the example model, its bundle.zip). Writes
# .env with a random POSTGRES_PASSWORD when there is none. Leaves the stack running: `$(COMPOSE) down -v`
# removes it and its data. Vendor toolchains: FLEXDSA_TOOLCHAINS="rockchip ..." make docker. Not run by CI.
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
docker:
	test -f .env || (umask 077 && echo "POSTGRES_PASSWORD=$$(openssl rand -hex 16)" > .env)
	$(COMPOSE) build
	$(COMPOSE) up -d
	COMPOSE="$(COMPOSE)" scripts/docker-smoke.sh

# The manual (docs/, mkdocs.yml) as a static site in site/: strict (a broken link, a missing page or a
# reference page that cannot be generated fails), nothing fetched from elsewhere. docs-serve: at
# http://127.0.0.1:8001 while you edit.
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve -a 127.0.0.1:8001

bench-targets: $(VENV)/.installed-test
	$(BIN)/python -m bench.targets

bench: $(VENV)/.installed-bench
	$(BIN)/python -m bench

bench-large: $(VENV)/.installed-bench
	$(BIN)/python -m bench.large

bench-service: $(VENV)/.installed-test
	$(BIN)/python -m bench.service

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test]'
	scripts/install-browser.sh
	scripts/install-s3-server.sh
	touch $@

$(VENV)/.installed-docs: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install -q -e '.[docs]'
	touch $@

$(VENV)/.installed-bench: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install -q -e '.[test,bench]'
	# torch only builds the bench models (once). --no-deps: its declared setuptools pin would upgrade the
	# venv's setuptools and drop pkg_resources, which celery's click plugins still import.
	$(BIN)/pip install -q --no-deps torch==2.13.0
	$(BIN)/pip install -q filelock fsspec networkx sympy jinja2 typing-extensions
	touch $@

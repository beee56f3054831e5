# One target per routine. `make demo` and `make test` do all the set-up on a fresh machine:
# `make demo` only what the demo needs (install-demo), the rest comes with `make install`.
PY := .venv/bin/python
PYTEST_ARGS ?=
# pytest-xdist workers of `make test` (each its own Redis server and MariaDB database names;
# tests/conftest.py). Measured on the 2-core machine: see docs/decisions.md.
TEST_WORKERS ?= 2

.PHONY: install install-demo services test test-fast lint typecheck fmt demo bench bench-results clean compose-check

install:
	@bash scripts/bootstrap.sh

## What `make demo` needs: the package and its MariaDB driver's build packages, no test tools.
install-demo:
	@bash scripts/bootstrap.sh --demo

services:
	@bash scripts/ensure-services.sh

## The test command (CI runs exactly this): real MariaDB, Redis, celery workers, files, HTTP.
test: install services
	@$(PY) -m compileall -q orbit_tasks >/dev/null  # every `orbit` and worker process the tests start reads these, even under PYTHONDONTWRITEBYTECODE
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

## Unit tests only (pure logic, no servers).
test-fast: install
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

lint: install
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy orbit_tasks celeryconfig.py
	.venv/bin/lint-imports  # the layer contract of docs/architecture.md (pyproject.toml)

typecheck: install
	.venv/bin/mypy orbit_tasks celeryconfig.py

fmt: install
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

## End-to-end demo on the embedded default (SQLite + local files + filesystem broker, no servers).
demo: install-demo
	.venv/bin/orbit demo

## Benchmarks (separate from tests); results go to bench/RESULTS.md.
bench: install services
	@command -v pt-archiver >/dev/null || (apt-get update -qq && apt-get install -y -qq percona-toolkit >/dev/null)
	$(PY) bench/run.py

## Rebuild bench/RESULTS.md from the committed bench/*.json (runs no benchmark).
bench-results: install
	$(PY) bench/run.py --render

clean:
	rm -rf var .pytest_cache .mypy_cache .ruff_cache build *.egg-info

## Validate compose/docker-compose.yml offline with both database profiles, the S3 and RabbitMQ
## profiles and the example env file (installs Debian's docker-compose if missing).
compose-check:
	@command -v docker-compose >/dev/null || (apt-get update -qq && apt-get install -y -qq docker-compose >/dev/null)
	COMPOSE_PROFILES=mysql docker-compose --env-file compose/.env.example -f compose/docker-compose.yml config -q
	COMPOSE_PROFILES=mariadb docker-compose --env-file compose/.env.example -f compose/docker-compose.yml config -q
	COMPOSE_PROFILES=mysql,s3 docker-compose --env-file compose/.env.example -f compose/docker-compose.yml config -q
	COMPOSE_PROFILES=mysql,rabbitmq CELERY_BROKER_URL=amqp://orbit:x@rabbitmq:5672// docker-compose --env-file compose/.env.example -f compose/docker-compose.yml config -q
	@echo "compose: valid"

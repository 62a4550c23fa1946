.DEFAULT_GOAL := help
.PHONY: help install fmt lint test test-all services-up migrate dev bench contracts docs docs-examples

help: ## List the tasks
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

install: ## Install Python and every dependency (uv)
	uv sync --locked

fmt: ## Format and autofix
	uv run ruff format .
	uv run ruff check --fix .

lint: ## Ruff, formatting, the CI workflow (actionlint), layering contracts, strict types and migration drift
	uv run ruff check .
	uv run ruff format --check .
	uv run actionlint
	uv run lint-imports
	uv run mypy
	uv run python -m mailroom.devtools.ci_checks alembic-check

test: ## The whole test suite (starts its own servers)
	uv run pytest

test-all: lint test ## Everything CI runs

services-up: ## Run the embedded stack and every process (same as `uv run mailroom dev`)
	uv run mailroom dev

dev: services-up ## Alias of services-up

migrate: ## Upgrade the configured database
	uv run mailroom migrate

contracts: ## Regenerate the JSON Schemas, the AsyncAPI document and the documented rules of the NATS contract
	uv run python -m mailroom.recognition.contract --write

bench: ## Run every benchmark in quick mode
	for script in bench/*.py; do uv run python $$script --quick || exit 1; done

docs: ## Build the documentation site into .site/ (strict: a broken link fails)
	uv run mkdocs build --strict -f docs/mkdocs.yml

docs-examples: ## Rewrite the docs' generated examples and the configuration reference
	uv run python -m mailroom.devtools.docs_examples --write
	uv run python -m mailroom.settings.reference --write

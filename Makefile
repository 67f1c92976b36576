# `make demo` and `make test` set everything up from scratch: a .venv with exactly the versions of
# requirements.lock (a CPU build of torch unless TORCH_INDEX names another).
SHELL := /bin/bash
VENV ?= .venv
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export LANCE_ASSETS_DATA ?= $(CURDIR)/data
# Lance warns on every DataReplacement commit (how column writes attach new files); keep errors.
export LANCE_LOG ?= error
export LANCE_ASSETS_SOURCE
BIN := $(VENV)/bin

.PHONY: setup demo lint test dev clean bench-loaders lock lock-upgrade lock-check

setup:
	@VENV=$(VENV) ./scripts/bootstrap.sh
	@mkdir -p "$(DAGSTER_HOME)"
	@ln -sf "$(CURDIR)/dagster.yaml" "$(DAGSTER_HOME)/dagster.yaml"

## Re-resolve requirements.lock after editing pyproject.toml (pins that still fit are kept).
lock:
	@VENV=$(VENV) ./scripts/lock.sh

## Every package to the newest version pyproject.toml allows (torch held; see scripts/lock.sh),
## then run `make test`.
lock-upgrade:
	@VENV=$(VENV) ./scripts/lock.sh --upgrade

## Fail when requirements.lock is not what pyproject.toml resolves to.
lock-check:
	@VENV=$(VENV) ./scripts/lock.sh --check

# curation_ablation on the demo's small corpus: a quarter of its default budget (the end_to_end
# job's config too: lance_assets.defs.training.ablation.DEMO_RUN_CONFIG).
DEMO_RUN_CONFIG := {"ops": {"curation_ablation": {"config": {"token_budget": 65536}}}}

## Materialize every asset end to end (synthetic corpus, tiny model) into $(LANCE_ASSETS_DATA).
demo: setup
	$(BIN)/dagster asset materialize -m lance_assets.definitions --select '*' \
	  --config-json '$(DEMO_RUN_CONFIG)'

## The linter (ruff, configured in pyproject.toml).
lint: setup
	$(BIN)/ruff check .

## The linter, Dagster's check of the code location (`dg check defs`: loads
## lance_assets.definitions:defs as `dagster dev` would; [tool.dg] in pyproject.toml), then the
## test suite on every core (pytest-xdist: a module or a named group per unit of work, the most
## expensive first; docs/testing.md). `make test PYTEST_ARGS='-k resume'` runs a part of it.
## Two workers more than the cores: many tests wait (on subprocesses, a browser, a lease) and
## the extra workers fill those waits (on two cores: 13:02 with two workers, 12:04 with three,
## 11:18 with four for the whole suite).
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 2 )))
test: lint
	$(BIN)/dg check defs
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

## The web UI on http://127.0.0.1:3000, on the same instance as `make demo`.
dev: setup
	$(BIN)/dagster dev -m lance_assets.definitions -h 127.0.0.1 -p 3000

## Loader A/B (every arm, MDS included) in its own environment: see docs/benchmarks.md.
bench-loaders: setup
	@./scripts/mds_venv.sh
	$(BIN)/python -m benchmarks.loaders $(BENCH_ARGS)

clean:
	rm -rf data data-* .dagster_home

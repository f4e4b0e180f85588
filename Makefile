# zktasks: developer tasks. `make` (or `make help`) lists the targets.
#
# Needs GNU make, bash, Python 3.12+ and (for tests and the demo) Apache ZooKeeper,
# which `make zookeeper` installs with apt-get when run as root on Debian/Ubuntu.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

VENV   := .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ZOOKEEPER_JAR := /usr/share/java/zookeeper.jar

# Extra arguments: make test PYTEST_ARGS="-k pipeline -x", make demo DEMO_ARGS=--no-wait,
# make bench BENCH_ARGS=...; PYTHON=/path/to/python3.12 picks the interpreter for .venv.
PYTEST_ARGS ?=
DEMO_ARGS   ?=
BENCH_ARGS  ?=
PYTHON      ?=
# Only a PYTHON given on the command line counts: some environments export PYTHON.
VENV_PYTHON := $(if $(filter command line,$(origin PYTHON)),$(PYTHON))

# The demo project's settings; DEBUG=1 lets SECRET_KEY fall back to its demo default.
DJANGO_ENV := DJANGO_SETTINGS_MODULE=project.settings DEBUG=1

PY_OK := import sys; assert sys.version_info >= (3, 12)

# find_zookeeper() installs the Debian package when root (else explains how).
ZK_CHECK := import sys; sys.excepthook = lambda t, e, tb: print(e, file=sys.stderr); \
  from zktasks.testing import find_zookeeper; z = find_zookeeper(); \
  print(f"ZooKeeper: {z.origin}, Java {z.java_version} ({z.java})")

# Prints the absolute path of a Python 3.12+ interpreter, or explains what to
# install and fails. Plain sh, one line for make. The version check also weeds out
# pyenv shims (python3.12, python3.13) whose version is not selected: they exist
# on PATH but exit with "pyenv: python3.13: command not found".
FIND_PYTHON = \
  ok() { "$$1" -c '$(PY_OK)' >/dev/null 2>&1; }; \
  found() { "$$1" -c 'import sys; print(sys.executable)'; exit 0; }; \
  if [ -n "$(VENV_PYTHON)" ]; then \
    if ok "$(VENV_PYTHON)"; then found "$(VENV_PYTHON)"; fi; \
    echo "PYTHON=$(VENV_PYTHON) is not a working Python 3.12+." >&2; exit 1; \
  fi; \
  for c in python3.13 python3.12 python3; do \
    p="$$(command -v "$$c" 2>/dev/null)" || continue; \
    if ok "$$p"; then found "$$p"; fi; \
  done; \
  root=""; \
  if command -v pyenv >/dev/null 2>&1; then root="$$(pyenv root 2>/dev/null || true)"; \
  elif [ -d "$${PYENV_ROOT:-$${HOME:-/nonexistent}/.pyenv}/versions" ]; then root="$${PYENV_ROOT:-$${HOME:-/nonexistent}/.pyenv}"; fi; \
  if [ -n "$$root" ]; then \
    for p in $$(ls -d "$$root"/versions/3.1[2-9]*/bin/python 2>/dev/null | sort -rV); do \
      if ok "$$p"; then found "$$p"; fi; \
    done; \
  fi; \
  { echo "Python 3.12+ is needed and none was found (tried python3.13, python3.12, python3"; \
    echo "and pyenv's versions). Install one, then run make again:"; \
    echo "  Debian/Ubuntu: apt-get install python3.12 python3.12-venv  (or python3.13 python3.13-venv)"; \
    echo "  pyenv:         pyenv install 3.13 && pyenv global 3.13"; \
    echo "  or point at one: make venv PYTHON=/path/to/python3.12"; } >&2; \
  exit 1

.PHONY: chromium help python venv zookeeper test lint demo bench clean screenshots

help: ## List the targets
	@echo "zktasks - make targets:"
	@grep -E '^[a-z][a-zA-Z_-]*:.*## ' $(firstword $(MAKEFILE_LIST)) \
	  | sed -E 's/^([a-zA-Z_-]+):.*## (.*)/  \1\t\2/' | expand -t 14
	@echo
	@echo "Variables: PYTEST_ARGS='...' (test), DEMO_ARGS=--no-wait (demo), BENCH_ARGS (bench),"
	@echo "           PYTHON=/path/to/python3.12+ (venv)"

python: ## Show which Python 3.12+ would build .venv
	@$(FIND_PYTHON)

venv: ## Create .venv (Python 3.12+) and pip install -e '.[test]' when pyproject.toml changed
	@if [ -e $(VENV) ] && ! $(VPY) -c '$(PY_OK)' >/dev/null 2>&1; then \
	  echo "$(VENV) has no working Python 3.12+; recreating it"; rm -rf $(VENV); fi
	@$(MAKE) --no-print-directory --silent $(STAMP)

$(STAMP): pyproject.toml
	@if [ ! -x $(VPY) ]; then \
	  py="$$($(FIND_PYTHON))"; \
	  echo "Creating $(VENV) with $$py ($$("$$py" -V 2>&1))"; \
	  "$$py" -m venv $(VENV) || { rm -rf $(VENV); exit 1; }; \
	fi
	@echo "$(VPY) -m pip install -e '.[test]'"
	@$(VPY) -m pip install --disable-pip-version-check -e '.[test]'
	@touch $@

zookeeper: venv ## Make sure ZooKeeper and Java are installed (apt-get as root on Debian)
	@if [ ! -f $(ZOOKEEPER_JAR) ] && [ -z "$${ZOOKEEPER_HOME:-}$${ZKTASKS_ZOOKEEPER_CLASSPATH:-}" ] \
	    && [ "$${ZKTASKS_ZOOKEEPER_INSTALL:-1}" != 0 ] && [ "$$(id -u)" = 0 ] \
	    && command -v apt-get >/dev/null; then \
	  echo "$(ZOOKEEPER_JAR) is missing: apt-get update && apt-get install -y zookeeper"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get -o DPkg::Lock::Timeout=300 update; \
	  apt-get -o DPkg::Lock::Timeout=300 install -y zookeeper; \
	fi
	@$(VPY) -c '$(ZK_CHECK)'

chromium: ## Make sure Debian's Chromium is installed for the dashboard's browser tests
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "/usr/bin/chromium is missing: apt-get install -y chromium chromium-driver"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get -o DPkg::Lock::Timeout=300 update; \
	    apt-get -o DPkg::Lock::Timeout=300 install -y chromium chromium-driver; \
	  else \
	    echo "The browser tests need Debian's Chromium: sudo apt-get install -y chromium chromium-driver" >&2; \
	    exit 1; \
	  fi; \
	fi

# The whole suite runs as two pytest processes at once (tests/halves.py says why);
# PYTEST_ARGS runs one process with just those arguments.
test: venv zookeeper chromium ## Lint, Django checks, migrations check, then pytest in two processes (PYTEST_ARGS=...: one)
	$(VENV)/bin/ruff check .
	$(DJANGO_ENV) $(VPY) manage.py check
	$(DJANGO_ENV) $(VPY) manage.py makemigrations --check --dry-run
	env -u DJANGO_SETTINGS_MODULE $(if $(strip $(PYTEST_ARGS)),$(VPY) -m pytest $(PYTEST_ARGS),$(VPY) tests/halves.py)

screenshots: venv zookeeper chromium ## Take the README's dashboard screenshots again (docs/screenshots/)
	env -u DJANGO_SETTINGS_MODULE ZKTASKS_SCREENSHOTS=docs/screenshots \
	  $(VPY) -m pytest tests/dashboard/test_browser.py -k "screenshot or traceback" -p no:cacheprovider

lint: venv ## ruff check
	$(VENV)/bin/ruff check .

demo: venv zookeeper ## Run the demo: ZooKeeper, 2 workers, the site and sample tasks
	$(VPY) project/demo.py $(DEMO_ARGS)

# The benchmark's peers (Celery, RQ, Huey, Dramatiq, django-tasks-db): the `bench` extra,
# installed into .venv on the first `make bench`, never a runtime dependency.
BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): pyproject.toml $(STAMP)
	@echo "$(VPY) -m pip install -e '.[test,bench]'  (the benchmark's peers)"
	@$(VPY) -m pip install --disable-pip-version-check -e '.[test,bench]'
	@touch $@

bench: venv zookeeper $(BENCH_STAMP) ## Benchmarks: zktasks vs its peers, failover, a 1M-job backlog, the targets (BENCH_ARGS=...)
	@for pkg in redis-server:redis-server postgresql:initdb; do \
	  bin="$${pkg#*:}"; \
	  if ! command -v "$$bin" >/dev/null && ! ls /usr/lib/postgresql/*/bin/$$bin >/dev/null 2>&1 \
	      && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "$$bin is missing: apt-get install -y $${pkg%%:*}"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get -o DPkg::Lock::Timeout=300 update; \
	    apt-get -o DPkg::Lock::Timeout=300 install -y "$${pkg%%:*}"; \
	  fi; \
	done
	$(VPY) bench/run.py $(BENCH_ARGS)

clean: ## Remove .venv, var/ and caches
	rm -rf $(VENV) var .pytest_cache .ruff_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

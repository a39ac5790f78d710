# Two commands do everything on a fresh clone:
#   make lab    set up .venv and open the workbook in JupyterLab
#   make test   set up .venv and run the whole test suite
# Instructors: make setup (the virtualenv, bubblewrap for the grading sandbox, `workbook check`).

# --- the virtualenv (the student edition's Makefile has this part too) ---
# Python 3.11 to 3.14: the newest one on PATH, else python3; another: make lab PYTHON=/path/to/python3.13
PYTHONS := 3.14 3.13 3.12 3.11
PYTHON  ?= $(shell for v in $(PYTHONS); do p=$$(command -v python$$v) && $$p -c '' 2>/dev/null && { echo $$p; exit; }; done; command -v python3)
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
EXTRAS  ?= dev

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 14))' 2>/dev/null || { \
	  echo "The workbook needs Python 3.11, 3.12, 3.13 or 3.14; '$(PYTHON)' is $$($(PYTHON) --version 2>&1 || echo missing)." >&2; \
	  echo "Get one: Debian/Ubuntu: sudo apt-get install python3 python3-venv (Debian 12 has 3.11, Ubuntu 24.04 3.12);" >&2; \
	  echo "  macOS: brew install python@3.13; Windows or any system: https://www.python.org/downloads/ or uv python install 3.13;" >&2; \
	  echo "then name it if it is not on PATH as python3.1x: make lab PYTHON=/path/to/python3.13" >&2; exit 2; }
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { \
	  echo "'$(PYTHON)' cannot make a virtual environment: install its venv module" >&2; \
	  echo "(Debian/Ubuntu: sudo apt-get install python3-venv, or python3.1x-venv for a python3.1x)" >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet -c constraints.txt -e ".[$(EXTRAS)]"
	touch $(STAMP)
# --- end of the virtualenv ---

# The instructor's set-up: the virtualenv (what ./workbook needs), bubblewrap (the grading
# sandbox) and `workbook check`, which says whether this machine can grade and how to fix it.
setup: $(STAMP) sandbox
	@$(BIN)/python -m autograder.cli check || true

# Opens JupyterLab on work/ (your copies of notebooks/, made on first use, never
# overwritten). JupyterLab options: make lab LAB_ARGS="--port 8890 --no-browser"
lab: $(STAMP)
	$(BIN)/python -m course_lib.workspace $(LAB_ARGS)

# Two pytest workers, pytest-xdist's own --dist loadfile (each file's tests on one worker,
# so a notebook executed for one test serves the others in its file); the graded class is
# built in the background meanwhile (tests/graded_class.py). One process: make test WORKERS=0
# One layer: .venv/bin/python -m pytest tests/unit (or tests/specs, tests/notebooks, tests/grading)
WORKERS ?= 2
XDIST   := $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadfile)

test: $(STAMP) browser sandbox postgres hub lint
	$(BIN)/python -m pytest $(XDIST)

# ruff, with the small rule set of pyproject.toml ([tool.ruff]): errors, not style
lint: $(STAMP)
	$(BIN)/ruff check .

# The JupyterLab end-to-end test drives headless Chromium. Installed here when possible
# (root with apt-get, as on CI); otherwise that test is skipped with a note.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Chromium for the browser tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "note: Chromium not found; the JupyterLab browser test will be skipped"; fi; }

# The grading sandbox: Debian's bubblewrap (`workbook autograde` refuses to grade without
# it, and says how to install it). Installed here when possible (root with apt-get, as on CI).
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap for the grading sandbox"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	  else echo "note: bubblewrap (bwrap) not found: install it (sudo apt-get install bubblewrap) to grade safely"; fi; }

# A PostgreSQL server for the tests of a PostgreSQL gradebook (each test starts its own in a
# temporary folder): Debian's postgresql. Installed here when possible (root with apt-get).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing PostgreSQL for the gradebook tests"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
	  else echo "note: PostgreSQL not found; the PostgreSQL gradebook tests will be skipped"; fi; }

# A course hub's proxy (deploy/jupyterhub): configurable-http-proxy from npm, pinned by
# deploy/jupyterhub/package-lock.json, into deploy/jupyterhub/node_modules (the hub test starts
# a real JupyterHub with it). Node.js and npm are installed here when possible (root with apt-get).
HUB_PROXY := deploy/jupyterhub/node_modules/.bin/configurable-http-proxy

# The hub test also runs Python as the students' and the grader's accounts, which cannot enter
# /root (pyenv's Pythons): a Python 3.11 in /usr/bin (Debian's python3.11) is installed here
# when possible (root with apt-get); otherwise the test uses whichever 3.11 every account can run.
hub: $(HUB_PROXY)
	@test -x /usr/bin/python3.11 || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1 || { \
	  echo "installing Debian's python3.11 for the hub test's accounts"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11 python3.11-venv >/dev/null \
	  || echo "note: python3.11 not installed; the hub test uses a Python 3.11 every account can run, if any"; }

$(HUB_PROXY): deploy/jupyterhub/package.json deploy/jupyterhub/package-lock.json
	@command -v npm >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Node.js and npm for the hub's proxy"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; \
	  fi; }
	@if command -v npm >/dev/null 2>&1; then \
	  npm ci --prefix deploy/jupyterhub --no-audit --no-fund --loglevel=error && touch $(HUB_PROXY); \
	else echo "note: npm not found (install Node.js 20 or later); the JupyterHub test will be skipped"; fi

# Skip notebook execution and nbgrader runs (seconds instead of minutes).
test-fast: $(STAMP) lint
	$(BIN)/python -m pytest $(XDIST) -m "not slow"

# Benchmarks (not tests): every notebook's wall time against its budget, course_lib's
# attention against PyTorch's fused kernel. Run on an otherwise idle machine.
bench: $(STAMP)
	$(BIN)/python benchmarks/notebook_times.py
	$(BIN)/python benchmarks/attention_fast_path.py
	$(BIN)/python benchmarks/explorer_update.py
	PYTHONPATH=. $(BIN)/python benchmarks/intake_limits.py

# Regenerate the student notebooks in notebooks/ from solutions/.
release: $(STAMP)
	$(BIN)/python -m autograder.course.release

check-release: $(STAMP)
	$(BIN)/python -m autograder.course.release --check

clean-grading:
	rm -rf grading

# Two entry points for a newcomer: `make demo` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test check-pythons clean

$(STAMP): pyproject.toml
	@echo "== setting up $(VENV) (first run only)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# torch first, pinned: on these machines this is the CPU build; the project's torch range is then met.
	@# --no-compile: python compiles the modules it imports when it first imports them, not all of them here
	$(BIN)/python -m pip install --quiet --no-compile torch==2.13.0
	$(BIN)/python -m pip install --quiet --no-compile -e '.[cpu,test]'
	rm -f $(VENV)/.installed-* && touch $@

demo: $(STAMP)
	$(BIN)/accscale demo

# one pytest worker per core; a worker steals from another's queue when its own runs dry (the tests vary from
# milliseconds to minutes); the slow ones are ordered first (tests/conftest.py)
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n auto --dist worksteal

# before a release: every Python that pyproject.toml promises (and pyenv has) installs and passes the fast tests
check-pythons:
	bash scripts/check_pythons.sh

clean:
	rm -rf build model_repository/*/ runs

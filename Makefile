# Two commands do all the set-up on a fresh machine:
#   make run   - create .venv, install pinned dependencies, run the main job
#   make test  - the same set-up, then mypy (strict on plan/, system/, model/: pyproject.toml)
#                and the whole test suite; it fails if either fails
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test venv clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/dnnscale optimize --workload adam-imagenet22k --cluster adam-2014 \
		--plot results/adam-imagenet22k-curve.png

test: $(STAMP)
	status=0; $(BIN)/mypy || status=1; $(BIN)/python -m pytest -q || status=1; exit $$status

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

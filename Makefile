# Two entry points, each doing all set-up on a fresh machine:
#   make demo   creates .venv, installs masklab, runs the quick GOTU reproduction
#   make test   creates .venv, installs masklab, runs ruff check and the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

export HF_HUB_OFFLINE := 1
export MPLBACKEND := Agg

.PHONY: demo test bench clean

$(STAMP): pyproject.toml scripts/install-pretrained.sh
	$(PYTHON) -m venv $(VENV)
	bash scripts/install-pretrained.sh $(BIN)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/masklab reproduce gotu --quick --out runs/demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=20

bench: $(STAMP)
	$(BIN)/python benchmarks/attention_overhead.py

clean:
	rm -rf $(VENV) runs

# Two commands set everything up on a fresh machine:
#   make demo   - install, then train a small model on 2 ranks
#   make test   - install, then run the whole test suite (what CI runs)

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
PIP     = $(BIN)/python -m pip
PLUGINS = $(patsubst %/setup.py,%,$(wildcard plugins/*/setup.py))
EXTRAS  = keras,lasagne,test
STAMP   = $(VENV)/.tmpi-installed

.PHONY: install demo test wheels clean

install: $(STAMP)

# Re-installs only when packaging files change; editable installs pick up
# code changes without it.
$(STAMP): setup.py pyproject.toml constraints.txt Makefile $(wildcard plugins/*/setup.py)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --disable-pip-version-check -c constraints.txt wheel \
		-e ".[$(EXTRAS)]" $(addprefix -e ,$(PLUGINS))
	$(BIN)/python -m tmpi_adapters.launch.compat --install-startup-hook
	touch $(STAMP)

demo: install
	$(BIN)/tmpi wrap -n 2 --seed 1 examples/theano_mlp/train.py --epochs 10

test: install
	$(BIN)/python -m pytest -q --durations=20 tests $(addsuffix /tests,$(PLUGINS))

wheels: install
	rm -rf dist && mkdir -p dist
	$(PIP) wheel --quiet --no-deps --no-build-isolation -w dist . $(PLUGINS)

clean:
	rm -rf $(VENV) dist build *.egg-info tmpi_adapters.egg-info

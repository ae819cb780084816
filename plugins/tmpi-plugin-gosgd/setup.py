"""tmpi-plugin-gosgd: Gossip SGD (Blot et al. 2016) as a tmpi rule."""
import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = re.search(r'^__version__ = "([^"]+)"',
                    (HERE / "tmpi_plugin_gosgd" / "__init__.py").read_text(), re.M).group(1)

setup(
    name="tmpi-plugin-gosgd",
    version=VERSION,
    description="Gossip SGD for tmpi: random pairwise pushes mixed by sum-weights, "
                "no global barrier",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    python_requires=">=3.9",
    packages=find_packages(include=["tmpi_plugin_gosgd", "tmpi_plugin_gosgd.*"]),
    install_requires=["tmpi-adapters>=0.1.0", "numpy"],
    # The one line that makes this a tmpi plugin: tmpi loads every module
    # named in the "tmpi" entry-point group and calls the hooks it implements.
    entry_points={"tmpi": ["gosgd = tmpi_plugin_gosgd"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: System :: Distributed Computing",
    ],
)

"""tmpi-plugin-easgd: Elastic Averaging SGD (Zhang, Choromanska, LeCun 2015) as a tmpi rule."""
import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = re.search(r'^__version__ = "([^"]+)"',
                    (HERE / "tmpi_plugin_easgd" / "__init__.py").read_text(), re.M).group(1)

setup(
    name="tmpi-plugin-easgd",
    version=VERSION,
    description="Elastic Averaging SGD for tmpi: workers tied to a center variable, "
                "synchronous or asynchronous",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    python_requires=">=3.9",
    packages=find_packages(include=["tmpi_plugin_easgd", "tmpi_plugin_easgd.*"]),
    install_requires=["tmpi-adapters>=0.1.0", "numpy"],
    # The one line that makes this a tmpi plugin: tmpi loads every module
    # named in the "tmpi" entry-point group and calls the hooks it implements.
    entry_points={"tmpi": ["easgd = tmpi_plugin_easgd"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: System :: Distributed Computing",
    ],
)

"""The public API's annotations: mypy passes on it (the modules pyproject.toml's
``[tool.mypy]`` names), and a plugin author's mistakes against it are reported."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: A plugin as an author writes it, with mistakes that mypy must report: each
#: line marked ``# error: CODE`` and none other.
PLUGIN = '''\
from __future__ import annotations

import tmpi_adapters as tmpi
from tmpi_adapters.plugin import Knob, PerModel, Rule, copies, hookimpl, positive


class Elastic(PerModel):
    def exchange(self) -> None:
        center = copies(self.values())
        self.assign(self.rule.exchanger.allreduce(center, op="mean"))
        self.rule.exchanger.allreduce(center, weight="all")  # error: arg-type


class Mine(Rule):
    name = "mine"
    knobs = {
        "alpha": Knob(float, lambda size: 0.9 / size, "elastic force", check=positive),
        "tau": Knob(int, 4, "period", check="positive"),  # error: arg-type
    }
    per_model = Elastic

    def after_step(self, model: tmpi.ModelProtocol, samples: int) -> None:
        self.exchanger.barrier(timeout="soon")  # error: arg-type
        self.of(model).poll() + " messages"  # error: operator


@hookimpl
def tmpi_rules() -> dict[str, type[Rule]]:
    return {"mine": Mine}


@tmpi.distributed(framework="lasagne", rule="mine", rule_options={"tau": 2})
def main(num_epochs: int = 10) -> float:
    return 0.5


main(num_epochs=3)
main(epochs=3)  # error: call-arg
tmpi.wrap("train.py", ["--epochs", "3"], n="2")  # error: arg-type
'''


def mypy(*args):
    """``python -m mypy ARGS`` from the repository root, with pyproject.toml's
    configuration (and mypy's cache, ``.mypy_cache``, there)."""
    return subprocess.run([sys.executable, "-m", "mypy", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_mypy_passes_on_the_public_api():
    result = mypy()
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("Success: no issues found"), result.stdout


def test_mypy_reports_a_plugin_authors_mistakes(tmp_path):
    plugin = tmp_path / "tmpi_plugin_mine.py"
    plugin.write_text(PLUGIN)
    expected = {(number, code) for number, line in enumerate(PLUGIN.splitlines(), start=1)
                for code in re.findall(r"# error: ([\w-]+)$", line)}
    result = mypy(plugin)
    reported = {(int(number), code) for number, code in
                re.findall(r"^[^:\n]*:(\d+): error: .*\[([\w-]+)\]$", result.stdout, re.M)}
    assert reported == expected, result.stdout + result.stderr

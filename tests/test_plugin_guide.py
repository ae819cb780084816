"""docs/plugins.md runs as written.

Every hook's example is a whole plugin module: each is registered with a
plugin manager that knows the hook specifications (a misspelt hook or
argument fails there), the registries and decisions that need no session are
called, and the rest run in a real 2-rank training run.  The complete rule
example, periodic averaging, is taken from the page, registered (nothing is
installed) and trains the least-squares model of :mod:`tmpi_adapters.testing`
on 2 ranks under real ``mpiexec``, checked against a hand computation.

Run as a script (``mpiexec -n 2 python test_plugin_guide.py averaged``), this
file is that run's driver.
"""
import argparse
import pickle
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from tmpi_adapters.testing import (INITIAL, LR, RuleConformance, batch, build_least_squares,
                                   check, gradient, parameters, rows_of, run_checks, run_driver)

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"
#: The first line of the rule example's code block, and of its tests'.
RULE_MODULE = "# tmpi_plugin_periodic/__init__.py"
RULE_TESTS = "# tests/test_periodic.py"
#: The period the 2-rank run averages with.
PERIOD = 2


# -- reading the guide ----------------------------------------------------------------

def code_blocks(text):
    """``[(line, code)]`` of every ``python`` code block of ``text``."""
    return [(text.count("\n", 0, m.start()) + 2, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```$", text, re.M | re.S)]


def hook_sections():
    """``{hook: [(line, code), ...]}``: the code blocks under each
    ``### `tmpi_...``` heading, up to the next heading."""
    text = GUIDE.read_text()
    sections = {}
    headings = list(re.finditer(r"^#+ .*$", text, re.M))
    for heading, following in zip(headings, headings[1:] + [None]):
        found = re.match(r"^### `(tmpi_\w+)`$", heading.group(0))
        if found:
            body_start = heading.end()
            body = text[body_start:following.start() if following else len(text)]
            offset = text.count("\n", 0, body_start)
            sections[found.group(1)] = [(offset + line, code)
                                        for line, code in code_blocks(body)]
    return sections


def block(first_line):
    """The code block of the guide that starts with ``first_line``."""
    found = [(line, code) for line, code in code_blocks(GUIDE.read_text())
             if code.startswith(first_line + "\n")]
    assert len(found) == 1, "docs/plugins.md needs one python block starting %r" % first_line
    return found[0]


def module_of(name, line, code):
    """Run ``code`` (the block at ``line`` of the guide) as module ``name``."""
    module = types.ModuleType(name)
    exec(compile(code, "%s:%d" % (GUIDE, line), "exec"), module.__dict__)
    return module


def hook_examples():
    """``{hook: module}``: each hook's example, run."""
    return {hook: module_of("guide_" + hook, *blocks[0])
            for hook, blocks in hook_sections().items() if blocks}


def fresh_manager():
    import pluggy
    from tmpi_adapters import hookspecs
    pm = pluggy.PluginManager("tmpi")
    pm.add_hookspecs(hookspecs)
    return pm


# -- the hooks' examples ------------------------------------------------------------

def test_every_hook_has_one_example_that_implements_it():
    from tmpi_adapters import hookspecs
    hooks = {n for n in vars(hookspecs) if n.startswith("tmpi_")}
    sections = hook_sections()
    assert set(sections) == hooks, set(sections) ^ hooks
    examples = hook_examples()
    assert set(examples) == hooks, "hooks without an example: %s" % (hooks - set(examples))
    for hook, module in examples.items():
        pm = fresh_manager()
        pm.register(module, name=hook)  # checks argument names against the spec
        pm.check_pending()              # every tmpi_* function is a hook
        assert getattr(module, hook, None) is not None, "%s's example lacks %s" % (hook, hook)
        assert pm.get_hookcallers(module), hook


def test_the_examples_that_need_no_session_answer():
    from tmpi_adapters import Exchanger, Rule
    examples = hook_examples()
    assert all(issubclass(c, Rule) for c in examples["tmpi_rules"].tmpi_rules().values())
    assert all(issubclass(c, Exchanger)
               for c in examples["tmpi_exchangers"].tmpi_exchangers().values())
    frameworks = examples["tmpi_frameworks"].tmpi_frameworks()
    hints = examples["tmpi_known_plugins"].tmpi_known_plugins()
    assert all(text.startswith("pip install ") for text in hints.values()), hints
    parser = argparse.ArgumentParser()
    examples["tmpi_add_arguments"].tmpi_add_arguments(parser=parser)
    assert parser.parse_args([]) != argparse.Namespace()
    handler, help_text = examples["tmpi_commands"].tmpi_commands()["hello"]
    assert handler(["world"]) == 0 and help_text
    detected = examples["tmpi_detect_framework"].tmpi_detect_framework(
        source="import house_theano\n", path="train.py")
    assert detected in frameworks, detected


# -- the rule example ----------------------------------------------------------------

def test_the_conformance_example_sets_only_what_rule_conformance_reads():
    namespace = module_of("guide_conformance", *block(RULE_TESTS)).__dict__
    classes = [c for c in namespace.values()
               if isinstance(c, type) and issubclass(c, RuleConformance)
               and c is not RuleConformance]
    assert len(classes) == 1, classes
    own = {k for k in vars(classes[0]) if not k.startswith("__")}
    unknown = {k for k in own if not hasattr(RuleConformance, k)}
    assert not unknown, unknown
    assert classes[0].rule == "periodic"


@pytest.mark.mpi
def test_the_rule_example_trains_on_two_ranks():
    # This file is the driver: see averaged() below.
    run_driver(__file__, "periodic", "averaged", ranks=2)


def averaged(session, steps=5):
    """Every rank steps on its own rows; every PERIOD steps all ranks take
    the mean of the models, weighted by rows (equal here); the end averages
    the steps since the last average.  Half-way, the per-model state goes
    through a pickled state_dict() and back."""
    rank, size, rule = session.rank, session.size, session.rule
    assert type(rule).__name__ == "PeriodicAveraging", type(rule)
    train, w, b = build_least_squares()
    models = [INITIAL.copy() for _ in range(size)]
    for step in range(1, steps + 1):
        x, y = batch(step, size)
        train(x, y)
        models = [m - LR * gradient(m, *rows_of(r, x, y)) for r, m in enumerate(models)]
        if step % PERIOD == 0:
            models = [np.mean(models, axis=0)] * size
        check(parameters(w, b), models[rank], "rank %d parameters after step %d" % (rank, step))
        rows = len(rows_of(rank, x, y)[1])
        check(rule.of(train.model).rows, rows * (step % PERIOD), "rows after step %d" % step)
        if step == 3:
            state = pickle.loads(pickle.dumps(rule.state_dict()))
            assert state["models"][train.model.name] == {"rows": rows}, state
            rule.of(train.model).rows = 0
            rule.load_state_dict(state)
    session.finish()
    check(parameters(w, b), np.mean(models, axis=0), "rank %d final parameters" % rank)


def main():
    from tmpi_adapters.pluginmanager import get_plugin_manager
    pm = get_plugin_manager()
    pm.register(module_of("tmpi_plugin_periodic", *block(RULE_MODULE)))
    # The lifecycle hooks' examples run in the same session, for real.
    for hook, module in hook_examples().items():
        pm.register(module, name="guide_" + hook)
    run_checks("periodic", sys.argv[1], {"averaged": averaged}, {"period": str(PERIOD)})


if __name__ == "__main__":
    sys.exit(main())

"""tmpi_adapters.testing: the least-squares problem, the helpers' plumbing and
RuleConformance's parameters (the plugins' suites use them under real mpiexec)."""
import sys

import numpy as np
import pytest

from tmpi_adapters import testing


def test_gradient_is_the_least_squares_gradient():
    x, y = testing.batch(3, 2)
    flat, eps = testing.INITIAL, 1e-6
    numeric = [(testing.loss(flat + eps * e, x, y) - testing.loss(flat - eps * e, x, y))
               / (2 * eps) for e in np.eye(4)]
    np.testing.assert_allclose(testing.gradient(flat, x, y), numeric, rtol=1e-6)


def test_rows_of_cover_the_batch_in_rank_order():
    x, y = testing.batch(0, 3)
    assert x.shape == (3 * testing.ROWS_PER_RANK, 3)
    parts = [testing.rows_of(r, x, y) for r in range(3)]
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x)
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y)


def test_run_drops_tmpi_options_and_runs_theano_in_pure_python(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("TMPI_OPTIONS", "{}")
    monkeypatch.setenv("THEANO_FLAGS", "floatX=float16,mode=FAST_RUN")
    code = ("import os; print(os.environ.get('TMPI_OPTIONS'), os.environ['EXTRA'], "
            "os.environ['THEANO_FLAGS'])")
    stdout = testing.succeeded(testing.run(sys.executable, "-c", code, floatx="float32",
                                           env={"EXTRA": "1"}))
    options, extra, flags = stdout.split()
    assert (options, extra) == ("None", "1")
    assert flags.split(",") == ["mode=FAST_RUN", "floatX=float32", "blas.ldflags=", "cxx=",
                                "optimizer_excluding=fusion"]


def test_val_accuracy_reads_the_last_final_line():
    stdout = "final val_loss 0.5 val_acc 0.9\nepoch 2\nfinal val_loss 0.2 val_acc 0.97\n"
    assert testing.val_accuracy(stdout) == 0.97


def test_final_numbers_reads_the_last_line_of_the_key():
    stdout = "final norms 1.5 2.0e-3\nfinal val_loss 0.5 val_acc 0.9\nfinal norms 3.25 nan\n"
    assert testing.final_numbers(stdout, "val_loss") == [0.5, 0.9]
    assert testing.final_numbers(stdout, "norms")[0] == 3.25


def test_assert_close_is_relative_to_the_larger():
    testing.assert_close([1.0, 1e6], [1.0 + 1e-9, 1e6 + 1e-3], 1e-8)
    with pytest.raises(AssertionError):
        testing.assert_close([1.0], [1.1], 1e-8)


def test_environment_drops_tmpi_options_and_may_compile(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("TMPI_OPTIONS", "{}")
    monkeypatch.setenv("THEANO_FLAGS", "floatX=float32,device=cpu")
    env = testing.environment(pure_python=False, EXTRA=1)
    assert "TMPI_OPTIONS" not in env and env["EXTRA"] == "1"
    assert env["THEANO_FLAGS"].split(",") == ["device=cpu", "floatX=float64", "blas.ldflags="]


def test_each_pytest_xdist_worker_has_a_compile_cache_of_its_own(monkeypatch):
    monkeypatch.setenv("THEANO_FLAGS", "device=cpu")
    flags = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        env = testing.environment(pure_python=False)
        flags[worker] = dict(f.split("=", 1) for f in env["THEANO_FLAGS"].split(","))
        assert flags[worker]["compiledir_format"].endswith("-" + worker)
    assert flags["gw0"]["compiledir_format"] != flags["gw1"]["compiledir_format"]
    # A cache the caller names is kept.
    monkeypatch.setenv("THEANO_FLAGS", "compiledir_format=mine")
    assert testing.environment()["THEANO_FLAGS"].count("compiledir_format") == 1


class _Metafunc:
    """What RuleConformance.pytest_generate_tests uses of pytest's Metafunc."""

    def __init__(self, *fixturenames):
        self.fixturenames = fixturenames
        self.parameters = {}

    def parametrize(self, name, values, ids=None):
        self.parameters[name] = (list(values), ids)


class _EASGDLike(testing.RuleConformance):
    rule, distribution = "r", "tmpi-plugin-r"
    rule_options, asynchronous = ["mode=sync"], False
    other_form = (["mode=async"], True)
    bad_options = [("tau=0", "must be > 0")]
    refused_options = [(["alpha=0.8"], ("beta", "alpha <="))]


def test_rule_conformance_parametrizes_its_tests_from_the_attributes():
    metafunc = _Metafunc("bad_option", "form")
    _EASGDLike().pytest_generate_tests(metafunc)
    cases, _ = metafunc.parameters["bad_option"]
    assert [c.values[0] for c in cases] == [(True, ["tau=0"], "must be > 0"),
                                            (False, ["alpha=0.8"], ("beta", "alpha <="))]
    assert [c.id for c in cases] == ["tau=0", "alpha=0.8 on the ranks"]
    assert [m.name for m in cases[1].marks] == ["mpi"] and not cases[0].marks
    forms, ids = metafunc.parameters["form"]
    assert forms == [(["mode=sync"], False), (["mode=async"], True)]
    assert ids == ["mode=sync synchronous", "mode=async asynchronous"]


def test_rule_conformance_marks_the_tests_that_start_ranks():
    def marks(name):
        return [m.name for m in getattr(getattr(testing.RuleConformance, name),
                                        "pytestmark", [])]
    for name in dir(testing.RuleConformance):
        if name.startswith("test_"):
            starts_ranks = name.startswith(("test_mlp", "test_a_held_back"))
            assert (marks(name) == ["mpi"]) == starts_ranks, name

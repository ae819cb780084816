"""tmpi_adapters.testing: the least-squares problem and the helpers' plumbing
(the plugins' suites use them under real mpiexec)."""
import sys

import numpy as np

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

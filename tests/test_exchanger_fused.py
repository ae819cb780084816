"""The fused exchange: its reduction paths, conversion kernels and borrowed results."""
import sys

import numpy as np
import pytest

from conftest import SCRIPTS, assert_close, check, final_numbers, mpiexec, run, tmpi


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3])
def test_fused_exchange_paths(n):
    result = check(mpiexec(n, sys.executable, SCRIPTS / "fused_exchange.py", timeout=300))
    assert "fused exchange OK on %d rank(s)" % n in result.stdout


@pytest.mark.mpi
def test_fused_exchange_paths_without_compiled_kernels():
    from tmpi_adapters.exchangers.codecs import NO_KERNELS_ENV
    from conftest import rank_env
    result = check(mpiexec(2, sys.executable, SCRIPTS / "fused_exchange.py",
                           env=rank_env(**{NO_KERNELS_ENV: "1"}), timeout=300))
    assert "fused exchange OK on 2 rank(s)" in result.stdout


def edge_values():
    rng = np.random.RandomState(0)
    wide = rng.standard_normal(20000) * 10.0 ** rng.randint(-9, 7, 20000)
    special = [0.0, -0.0, 65504, 65519, 65520, 1e9, -1e9, np.inf, -np.inf, np.nan,
               2 ** -24, 2 ** -25, 3 * 2 ** -26, 2 ** -14, 6e-8, 1 + 2 ** -8, 1 + 3 * 2 ** -8]
    return np.concatenate([wide, special]).astype(np.float32)


@pytest.mark.parametrize("portable", [False, True], ids=["fast", "portable"])
@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_compiled_kernels_match_numpy(fmt, portable):
    from tmpi_adapters.exchangers import codecs
    if codecs.backend() == "numpy":
        pytest.skip("compiled kernels unavailable here: %s" % codecs.unavailable_reason)
    codecs.set_portable(portable)
    try:
        values = edge_values()
        for source, factor in ((values, 1.0), (values.astype(np.float64) * 1.37, 0.5)):
            fast, reference = (np.empty(source.size, np.uint16) for _ in range(2))
            codecs.encode(source, factor, fast, fmt)
            codecs._numpy_encode(source, factor, reference, fmt)
            np.testing.assert_array_equal(fast, reference)
        decoded, expected = np.empty(values.size, np.float32), np.empty(values.size, np.float32)
        codecs.decode(fast, decoded, fmt)
        codecs._numpy_decode(fast, expected, fmt)
        np.testing.assert_array_equal(decoded, expected)
        # Sums in float32, one rounding: three parts, the first also the output.
        parts = [np.empty(1000, np.uint16) for _ in range(3)]
        for i, part in enumerate(parts):
            codecs.encode(values[:1000] * (i + 1), 1.0, part, fmt)
        total = np.empty(1000, np.float32)
        codecs._numpy_decode(parts[0], total, fmt)  # not 0 + ...: keeps -0.0
        for part in parts[1:]:
            step = np.empty(1000, np.float32)
            codecs._numpy_decode(part, step, fmt)
            total += step
        expected_codes = np.empty(1000, np.uint16)
        codecs._numpy_encode(total, 1.0, expected_codes, fmt)
        codecs.reduce_codes(parts, parts[0], fmt)
        np.testing.assert_array_equal(parts[0], expected_codes)
    finally:
        codecs.set_portable(False)


def test_unknown_algorithm_is_a_clear_error(monkeypatch):
    from tmpi_adapters.errors import ConfigError
    from tmpi_adapters.exchangers.mpi import ALGORITHM_ENV, MPIExchanger
    monkeypatch.setenv(ALGORITHM_ENV, "butterfly")
    with pytest.raises(ConfigError, match="butterfly.*auto, allreduce, rsag"):
        MPIExchanger()


@pytest.fixture(scope="module")
def borrowed_plain():
    return check(run([sys.executable, SCRIPTS / "borrowed_gradients.py"]))


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2])
def test_gradients_leaving_the_step_are_not_borrowed(borrowed_plain, n):
    wrapped = check(tmpi("wrap", "-n", str(n), SCRIPTS / "borrowed_gradients.py"))
    for key in ("returned", "stored", "params"):
        assert_close(final_numbers(wrapped.stdout, key),
                     final_numbers(borrowed_plain.stdout, key), 1e-8)

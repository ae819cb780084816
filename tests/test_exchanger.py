"""The shared exchanger suite, against every registered exchanger, on real ranks."""
import sys

import pytest

from conftest import SCRIPTS, check, mpiexec
from tmpi_adapters.pluginmanager import available

EXCHANGERS = sorted(available("exchangers").items())


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("name,cls", EXCHANGERS, ids=[name for name, _ in EXCHANGERS])
def test_exchanger_suite(name, cls, n):
    reason = cls.unavailable_reason(size=n)
    if reason:
        pytest.skip("%s exchanger cannot run here: %s" % (name, reason))
    result = check(mpiexec(n, sys.executable, SCRIPTS / "exchanger_suite.py", name,
                           timeout=300))
    assert "exchanger suite OK: %s on %d rank(s)" % (name, n) in result.stdout


def test_bf16_round_trip_and_rounding():
    import numpy as np
    from tmpi_adapters.exchangers.codecs import bf16_decode, bf16_encode
    values = np.array([0.0, 1.0, -2.5, 3.140625, 1e-3, 65504.0], dtype=np.float32)
    decoded = bf16_decode(bf16_encode(values))
    np.testing.assert_allclose(decoded, values, rtol=2 ** -8)
    # Round to nearest even: 1 + 2^-8 sits halfway between two bf16 values.
    assert bf16_decode(bf16_encode(np.float32([1 + 2 ** -8])))[0] == 1.0
    assert bf16_decode(bf16_encode(np.float32([1 + 3 * 2 ** -8])))[0] == 1 + 2 ** -6


def test_unknown_precision_is_a_clear_error():
    from tmpi_adapters.errors import ConfigError
    from tmpi_adapters.options import check_precision
    with pytest.raises(ConfigError, match="fp8.*native, fp32, fp16, bf16"):
        check_precision("fp8")

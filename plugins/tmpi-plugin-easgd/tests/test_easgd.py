"""tmpi-plugin-easgd under real ``mpiexec`` ranks and real Theano.

Its numerics are checked by ``scripts/easgd_driver.py`` on 3 ranks; what
every rule must pass (training, waiting only in the synchronous form, clear
errors) comes from :class:`tmpi_adapters.testing.RuleConformance`.
"""
from pathlib import Path

import pytest

from tmpi_adapters.testing import RuleConformance, run_driver

DRIVER = Path(__file__).resolve().parent / "scripts" / "easgd_driver.py"


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["sync", "async", "uneven"])
def test_elastic_exchanges_match_hand_computation(mode):
    # sync, async: alpha 0.25, tau 2, the paper's worker and center updates:
    #   parameters and the center after every step, then the final center;
    #   after step 2 the center goes through state_dict()/load_state_dict().
    # uneven (async): ranks take 3, 6 and 9 steps freely: rank 0 finishes
    #   first and must keep answering the others, every push is answered, and
    #   everyone ends holding the same center.
    run_driver(DRIVER, "easgd", mode)


class TestEASGD(RuleConformance):
    rule, distribution = "easgd", "tmpi-plugin-easgd"
    # The synchronous form's exchanges are collectives; the asynchronous form's are not.
    asynchronous, other_form = False, (["mode=async", "tau=2"], True)
    oversubscribed_options = ["mode=async"]  # 4 ranks around a center held by rank 0
    bad_options = [("alpha=0", "must be in (0, 1)"), ("alpha=-0.5", "must be in (0, 1)"),
                   ("alpha=1.5", "must be in (0, 1)"), ("tau=-2", "must be > 0"),
                   ("tau=0", "must be > 0"), ("tau=2.5", "is not a valid int"),
                   ("mode=ring", "must be one of sync, async")]
    # beta = N * alpha = 1.6 > 1 on 2 ranks: the center would move past the workers' mean.
    refused_options = [(["alpha=0.8"], ("beta = N * alpha = 1.6", "alpha <= 0.5"))]

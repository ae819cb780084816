"""tmpi-plugin-gosgd under real ``mpiexec`` ranks and real Theano.

Its numerics are checked by ``scripts/gosgd_driver.py`` on 3 ranks; what
every rule must pass (training, no waiting, clear errors) comes from
:class:`tmpi_adapters.testing.RuleConformance`.
"""
from pathlib import Path

import pytest

from tmpi_adapters.testing import RuleConformance, run_driver

DRIVER = Path(__file__).resolve().parent / "scripts" / "gosgd_driver.py"


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["rounds", "uneven"])
def test_gossip_matches_hand_computation(mode):
    # rounds: p = 0.5, 4 steps taken in turns: pushes and skipped pushes both
    #   happen; each step's parameters and sum-weights, then the final
    #   average, are checked; half-way the state goes through
    #   state_dict()/load_state_dict().
    # uneven: ranks take 3, 6 and 9 steps freely: the weights still add up to
    #   1, the weighted models to the start plus every gradient step, every
    #   message sent was mixed in, and the job ends.
    run_driver(DRIVER, "gosgd", mode)


class TestGoSGD(RuleConformance):
    rule, distribution, asynchronous = "gosgd", "tmpi-plugin-gosgd", True
    oversubscribed_options = ["gossip_probability=0.25"]  # a push after one step in four
    bad_options = [("gossip_probability=1.5", "must be in [0, 1]"),
                   ("gossip_probability=-0.1", "must be in [0, 1]"),
                   ("gossip_probability=often", "is not a valid float"),
                   ("final_average=maybe", "is not a valid boolean"),
                   ("period=3", "has no option 'period'")]

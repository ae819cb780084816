"""tmpi-plugin-asgd under real ``mpiexec`` ranks and real Theano.

Its numerics are checked by ``scripts/asgd_driver.py`` on 3 ranks; what
every rule must pass (training under both names, no waiting, clear errors)
comes from :class:`tmpi_adapters.testing.RuleConformance`.
"""
from pathlib import Path

import pytest

from tmpi_adapters.testing import RuleConformance, run_driver

DRIVER = Path(__file__).resolve().parent / "scripts" / "asgd_driver.py"


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["rounds", "uneven"])
def test_pushes_and_pulls_match_hand_computation(mode):
    # rounds: tau 2, taken in turns: updates accumulate over two steps before
    #   each push; every rank's parameters and the global ones after every
    #   step, then the last pushes at the end; after step 2 the accumulated
    #   updates and global parameters go through state_dict()/load_state_dict().
    # uneven: ranks take 3, 6 and 9 steps freely: rank 0 finishes first and
    #   must keep applying the others' pushes; no step is lost or applied twice.
    run_driver(DRIVER, "asgd", mode)


class TestASGD(RuleConformance):
    rule, aliases, distribution, asynchronous = "asgd", ["downpour"], "tmpi-plugin-asgd", True
    oversubscribed_options = ["tau=2"]  # under its other name, pushing every 2 steps
    bad_options = [("tau=-1", "must be > 0"), ("tau=0", "must be > 0"),
                   ("update_scale=0", "must be > 0"), ("update_scale=-0.5", "must be > 0"),
                   ("alpha=0.5", "has no option 'alpha'")]

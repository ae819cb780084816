"""Theano-MPI ModelClass files and launch_session.cfg run unchanged."""
import sys

import pytest

from conftest import SCRIPTS, check, final_numbers, run, tmpi

PROJECT = SCRIPTS / "theanompi_project"


def in_project(*args, **kwargs):
    return run(list(args), cwd=PROJECT, **kwargs)


@pytest.mark.mpi
def test_launch_session_cfg_trains_and_reports_once():
    result = check(in_project(sys.executable, "-m", "tmpi_adapters.launch.cli", "run", "--config",
                              "launch_session.cfg"))
    assert result.stdout.count("epoch 1/6") == 1, result.stdout
    assert "rule bsp" in result.stdout and "2 rank(s)" in result.stdout
    val_cost, val_error = final_numbers(result.stdout, "val_cost")
    assert val_error < 0.08, result.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("rule", ["bsp", "easgd"])
def test_python_api_mirrors_theano_mpi(rule):
    result = check(in_project(sys.executable, "launch_session.py", rule))
    assert "rule %s" % rule in result.stdout
    assert result.stdout.count("final val_cost") == 1
    assert result.stdout.count("epoch 6/6") == 1
    assert final_numbers(result.stdout, "val_cost")[1] < 0.1


@pytest.mark.mpi
def test_easgd_from_a_launch_session_cfg(tmp_path):
    config = tmp_path / "launch_session.cfg"
    config.write_text("RULE=EASGD\nMODELFILE=models.mlp\nMODELCLASS=MLP\nDEVICES=cuda0,cuda1\n")
    result = check(in_project(sys.executable, "-m", "tmpi_adapters.launch.cli", "run", "--config",
                              config))
    assert "rule easgd" in result.stdout and result.stdout.count("epoch 1/6") == 1
    assert final_numbers(result.stdout, "val_cost")[1] < 0.1


@pytest.mark.mpi
def test_avg_sync_type_and_legacy_contract():
    result = check(in_project(sys.executable, "-m", "tmpi_adapters.launch.cli", "run",
                              "--modelfile", "models.legacy", "--modelclass", "LegacyLogReg",
                              "-n", "2", "--rule-option", "mode=avg"))
    assert "epoch 3/3" in result.stdout
    assert final_numbers(result.stdout, "val_cost")[1] < 0.15


def test_config_mapping():
    from tmpi_adapters.launch.theanompi import session_settings
    assert session_settings("BSP", "cuda0,cuda1,cuda2", "avg", "nccl16") == (
        "bsp", {"mode": "avg"}, 3, "mpi", "fp16")
    assert session_settings("EASGD", ["cuda0", "cuda1"], None, "ar") == (
        "easgd", {}, 2, "mpi", "native")


@pytest.mark.parametrize("text,message", [
    ("RULE=BSP\nMODELFILE=models.mlp\nMODELCLASS=MLP\nWORKERS=4\n", "unknown key WORKERS"),
    ("RULE=BSP\nMODELFILE=models.mlp\nMODELCLASS=MLP\nBSP_SYNC_TYPE=fast\n",
     "BSP_SYNC_TYPE must be one of cdd, avg"),
    ("RULE=BSP\nMODELFILE=models.mlp\nMODELCLASS=MLP\nBSP_EXCH_STRATEGY=smoke\n",
     "BSP_EXCH_STRATEGY must be one of"),
    ("RULE=BSP\nMODELCLASS=MLP\n", "needs a model"),
])
def test_bad_config_is_a_clear_error(tmp_path, text, message):
    config = tmp_path / "launch_session.cfg"
    config.write_text(text)
    result = tmpi("run", "--config", config)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.mpi
def test_model_breaking_the_contract_is_named():
    result = in_project(sys.executable, "-m", "tmpi_adapters.launch.cli", "run", "--modelfile",
                        "models.broken", "--modelclass", "NoVal", "-n", "2")
    assert result.returncode != 0
    assert "NoVal lacks method(s) val_iter" in result.stderr, result.stderr

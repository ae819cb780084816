"""launch_session.py, as for Theano-MPI, with tmpi's import."""
import sys

from tmpi_adapters import BSP, EASGD

rule = EASGD() if sys.argv[1:] == ["easgd"] else BSP()
rule.init(devices=["cpu0", "cpu1"], modelfile="models.mlp", modelclass="MLP")
rule.wait()

"""`tmpi run --config launch_session.cfg` and the Theano-MPI style Python API."""

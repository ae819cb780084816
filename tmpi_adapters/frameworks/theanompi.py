"""The Theano-MPI adapter: ModelClass files written to Theano-MPI's contract."""

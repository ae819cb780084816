"""tmpi's pytest plugin (entry point ``pytest11``): registers the ``mpi``
mark that :class:`tmpi_adapters.testing.RuleConformance` puts on the tests
that start real ranks, so that a plugin's own test suite runs without
"unknown mark" warnings (or errors under ``--strict-markers``)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "mpi: starts real ranks under mpiexec")

"""EASGD: elastic averaging SGD.

Zhang, Choromanska and LeCun, "Deep learning with Elastic Averaging SGD",
NIPS 2015 (arXiv:1412.6651).

Every rank trains its own copy ``x_i`` of the model; a *center variable*
``center`` links them.  Every ``tau`` steps a worker and the center pull
towards each other with the elastic force ``alpha * (x_i - center)``::

    x_i    <- x_i    - alpha * (x_i - center)
    center <- center + alpha * (x_i - center)

The worker loses exactly what the center gains, so the elastic exchange
moves no mass: only gradient steps do.  The paper ties ``alpha`` to the
center's moving rate ``beta = size * alpha``; ``beta = 0.9`` gives the
default ``alpha = 0.9 / size``.

``mode=sync``
    All ranks exchange together: one allreduce of the parameters every
    ``tau`` steps gives every rank the sum of the elastic forces, so each
    rank keeps an identical copy of the center (the paper's synchronous
    EASGD).
``mode=async``
    Rank 0 holds the center.  Every ``tau`` of its steps a worker sends its
    parameters to rank 0 and trains on; rank 0 answers with the elastic
    force, computed against the center at that moment, and moves the center.
    The worker applies the force when the answer arrives (the paper's
    asynchronous EASGD, Algorithm 1).  No worker waits for another, and a
    worker never waits for rank 0 while training: an exchange that falls due
    while the previous one is unanswered is made as soon as the answer is in.

Training ends with the center variable on every rank: it is the model
EASGD trains.
"""
from tmpi_adapters.plugin import (ConfigError, HolderExchange, Knob, PerModel, Rule, copies,
                                  one_of, positive)


def elastic_force(value):
    """Knob check: the fraction of the gap closed per exchange."""
    return None if 0 < value < 1 else "must be in (0, 1); the paper uses alpha = 0.9 / size"


class EASGD(Rule):
    """Elastic averaging SGD, synchronous or with a center held by rank 0.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    alpha : float
        The elastic force: the fraction of the gap between a worker and the
        center that both close at an exchange.  Default ``0.9 / size``.
    tau : int
        The communication period: a rank exchanges every ``tau`` of its steps.
    mode : {"sync", "async"}
        Synchronous (allreduce, center on every rank) or asynchronous (center
        on rank 0, no barrier).
    """

    name = "easgd"
    exchanges = "parameters"
    knobs = {
        "alpha": Knob(float, lambda size: 0.9 / size,
                      "elastic force: fraction of the worker-center gap closed per exchange "
                      "(default 0.9/N, i.e. beta = N * alpha = 0.9)", elastic_force),
        "tau": Knob(int, 4, "communication period: exchange every tau steps", positive),
        "mode": Knob(str, "sync", "sync: allreduce, every rank keeps the center; "
                                  "async: rank 0 holds the center, no barrier",
                     one_of("sync", "async")),
    }

    def __init__(self, session, **options):
        super().__init__(session, **options)
        # (a rounding margin: alpha = 1 / N itself is fine)
        if self.mode == "sync" and self.alpha * self.size > 1 + 1e-9:
            raise ConfigError(
                "easgd: alpha=%g on %d ranks moves the center by beta = N * alpha = %g of "
                "the gap to the workers' mean per exchange, past the mean. Choose "
                "alpha <= %g (the paper uses beta = 0.9, the default alpha = 0.9 / N)."
                % (self.alpha, self.size, self.alpha * self.size, 1.0 / self.size))
        self.per_model = ElasticAsync if self.mode == "async" and self.size > 1 else ElasticSync
        #: Elastic exchanges this rank took part in (answered ones, in async mode).
        self.exchanges_done = 0

    def after_step(self, model, samples):
        # A worker takes the answer to its last push before it pushes again.
        self.poll(model)
        if model.step % self.tau == 0:
            self.of(model).exchange()


class ElasticSync(PerModel):
    """Synchronous EASGD for one model: every rank holds the same center.

    Training ends with the center on every rank (:meth:`finish`); a
    checkpoint keeps the center.
    """

    def __init__(self, rule, model, tag):
        super().__init__(rule, model, tag)
        # After the identical start every worker equals the center.
        self.center = copies(self.values())

    def exchange(self):
        """The synchronous elastic update of every worker and the center, from one
        allreduce of the parameters."""
        rule = self.rule
        workers = self.values()
        total = rule.exchanger.allreduce(workers, op="sum")
        # Both updates use the values from before the exchange.
        self.assign([x - rule.alpha * (x - c) for x, c in zip(workers, self.center)])
        self.center = [c + rule.alpha * (s - rule.size * c)
                       for c, s in zip(self.center, total)]
        rule.exchanges_done += 1

    def finish(self):
        """Every rank ends with the center (a second call changes nothing)."""
        self.assign(copies(self.center))

    def state_dict(self):
        return {"center": copies(self.center)}

    def load_state_dict(self, state):
        self.center = copies(state["center"])


class ElasticAsync(HolderExchange):
    """Asynchronous EASGD for one model: rank 0 holds the center.

    A worker (a rank other than 0) pushes its parameters; rank 0 answers
    with the elastic force, computed against the center at that moment, and
    moves the center; the worker applies the force when the answer arrives.

    The end (:class:`~tmpi_adapters.rules.asynchronous.HolderExchange`): a
    worker waits for the answer to its last push, tells rank 0 it is done
    and receives the final center; rank 0 keeps answering pushes until every
    worker is done, then sends each the center.
    """

    # -- the holder (rank 0) ------------------------------------------------------
    def _pull_center(self, worker):
        """Move the center towards ``worker``; returns the elastic force."""
        force = [self.rule.alpha * (x - c) for x, c in zip(worker, self.center)]
        self.center = [c + f for c, f in zip(self.center, force)]
        self.rule.exchanges_done += 1
        return force

    def answer(self, worker):
        return self._pull_center(worker)

    def exchange_locally(self):
        mine = self.values()
        force = self._pull_center(mine)
        self.assign([x - f for x, f in zip(mine, force)])

    # -- a worker ---------------------------------------------------------------------
    def pushed(self):
        return self.values()

    def take_answer(self, force):
        self.assign([x - f for x, f in zip(self.values(), force)])
        self.rule.exchanges_done += 1

    # -- both ---------------------------------------------------------------------------
    def adopt(self, center):
        self.assign(copies(center))

"""ASGD: asynchronous SGD with a parameter holder, as Downpour SGD.

Dean et al., "Large Scale Distributed Deep Networks", NIPS 2012 (Downpour
SGD), in the form Platoon and Theano-MPI offer it.

Rank 0 holds the global parameters ``center``.  Every rank trains its own
copy ``x`` and remembers ``pulled``, the global parameters it last received;
``x - pulled`` is what its own steps have added since, its *accumulated
update*.  Every ``tau`` of its steps a rank pushes the accumulated update to
rank 0 and pulls fresh parameters::

    center <- center + update_scale * (x - pulled)   # on rank 0, as the push arrives
    x      <- center + (steps taken since the push)
    pulled <- center

``update_scale`` is the learning rate at the holder.  Downpour adds the
workers' updates up (``update_scale = 1``): N workers then move the global
parameters N times as far per round as one process would, which calls for a
smaller learning rate.  The default, ``1 / size``, needs none: under tmpi's
strong scaling each rank computes its gradient on its share of the batch, and
the average of the N updates is the step one process takes on the whole
batch.

A worker never waits while training: it trains on while its push travels,
and keeps the steps it took meanwhile when the fresh parameters arrive (they
are part of its next push).  An exchange that falls due while the previous
one is unanswered is made as soon as the answer is in.  Every step of every
rank reaches the center exactly once, including the last ones, which
:meth:`Downpour.finish` pushes.  Rank 0 trains too and exchanges locally.
"""
from tmpi_adapters.plugin import HolderExchange, Knob, Rule, copies, positive


class Downpour(HolderExchange):
    """The push/pull exchange of one model, on rank 0 or on a worker.

    Rank 0's :attr:`center` is the global parameters; a push carries the
    pusher's accumulated update and is answered with the global parameters.

    The end (:meth:`finish`): a worker waits for the answer to its last
    push, sends its remaining accumulated update marked ``DONE`` and
    receives the final parameters.  Rank 0 applies pushes until every worker
    is done (workers that train longer keep exchanging meanwhile), then
    sends each the result.  A checkpoint keeps the accumulated update, and
    the global parameters on rank 0.
    """

    def __init__(self, rule, model, tag):
        super().__init__(rule, model, tag)
        # After the identical start every rank holds the global parameters.
        self.pulled = copies(self.values())
        self.at_push = None  # a worker's parameters when it last pushed

    # -- state ---------------------------------------------------------------------
    def accumulated(self):
        """``x - pulled``: this rank's steps not yet pushed."""
        return [x - p for x, p in zip(self.values(), self.pulled)]

    def state_dict(self):
        return dict(super().state_dict() or {}, accumulated=self.accumulated())

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if "accumulated" in state:
            self.pulled = [x - a for x, a in zip(self.values(), state["accumulated"])]

    def adopt(self, center):
        """Set the model to the global parameters; nothing accumulated."""
        self.assign(copies(center))
        self.pulled = copies(center)

    # -- rank 0 ----------------------------------------------------------------------
    def _apply(self, update):
        scale = self.rule.update_scale
        self.center = [c + scale * u for c, u in zip(self.center, update)]
        self.rule.pushes += 1

    def answer(self, update):
        self._apply(update)
        return self.center

    def take_done(self, message):
        self._apply(self.mailbox.arrays(message))  # the worker's last steps

    def exchange_locally(self):
        self._apply(self.accumulated())
        self.adopt(self.center)

    def before_end(self):
        self.exchange_locally()  # rank 0's last steps reach the center too

    # -- a worker ----------------------------------------------------------------------
    def pushed(self):
        self.at_push = copies(self.values())
        return self.accumulated()

    def take_answer(self, fresh):
        # Keep the steps taken while the push travelled: they are not in
        # `fresh` yet and will be part of the next push.
        since = [x - a for x, a in zip(self.values(), self.at_push)]
        self.assign([f + s for f, s in zip(fresh, since)])
        self.pulled = fresh
        self.rule.pushes += 1

    def last_pushed(self):
        return self.accumulated()


class ASGD(Rule):
    """Downpour-style asynchronous SGD around a parameter holder on rank 0.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    tau : int
        A rank pushes its accumulated update and pulls fresh parameters every
        ``tau`` of its steps (Downpour's ``n_push = n_fetch``).
    update_scale : float
        What rank 0 multiplies each pushed update by before adding it to the
        global parameters.  Default ``1 / size`` (the workers' average step);
        ``1`` is Downpour's plain sum.
    """

    name = "asgd"
    exchanges = "parameters"
    knobs = {
        "tau": Knob(int, 1, "push accumulated updates to rank 0 and pull fresh parameters "
                            "every tau steps", positive),
        "update_scale": Knob(float, lambda size: 1.0 / size,
                             "rank 0 adds update_scale * each pushed update (default 1/N: "
                             "the workers' average step; 1: Downpour's plain sum)", positive),
    }
    per_model = Downpour

    def __init__(self, session, **options):
        super().__init__(session, **options)
        #: Pushes this rank made (answered ones, on workers) or applied (rank 0,
        #: its own included).
        self.pushes = 0

    def after_step(self, model, samples):
        # A worker takes the fresh parameters before it pushes again.
        self.poll(model)
        if model.step % self.tau == 0:
            self.of(model).exchange()

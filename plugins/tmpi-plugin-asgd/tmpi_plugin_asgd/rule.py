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
:meth:`ASGD.finish` pushes.  Rank 0 trains too and exchanges locally.
"""
import numpy as np

from tmpi_adapters.exchanger import ANY_SOURCE
from tmpi_adapters.options import Knob, positive
from tmpi_adapters.protocol import read_values, write_values
from tmpi_adapters.rules import Rule, flat_size, pack, unpack

#: The rank that holds the global parameters.
HOLDER = 0
#: What a message is, carried in its first element.
PUSH, DONE, FRESH, FINAL = 1.0, 2.0, 3.0, 4.0
#: Elements before the payload: kind, unused.
HEADER = 2
#: Tags of the first model: workers to holder, holder to workers; each further
#: model uses the next pair, so the messages of different models never mix.
BASE_TAG = 22000


def _copies(arrays):
    return [np.array(a, copy=True) for a in arrays]


class ASGD(Rule):
    """Downpour-style asynchronous SGD around a parameter holder on rank 0.

    Parameters
    ----------
    session : tmpi_adapters.session.Session
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

    def __init__(self, session, **options):
        super().__init__(session, **options)
        self._holders = {}
        self._restored = {}
        #: Pushes this rank made (answered ones, on workers) or applied (rank 0,
        #: its own included).
        self.pushes = 0

    # -- the Rule interface --------------------------------------------------
    def start(self, model):
        downpour = Downpour(self, model, BASE_TAG + 2 * len(self._holders))
        self._holders[model] = downpour
        if model.name in self._restored:
            downpour.load(self._restored[model.name])

    def after_step(self, model, samples):
        downpour = self._holders[model]
        downpour.poll()
        if model.step % self.tau == 0:
            downpour.exchange()

    def poll(self, model):
        """Handle what has arrived for ``model`` without waiting (pushes on
        rank 0, fresh parameters on a worker); returns how many messages."""
        return self._holders[model].poll()

    def finish(self, model):
        """Push the last accumulated updates, then give every rank the center.

        Termination: a worker waits for the answer to its last push, sends
        its remaining accumulated update marked ``DONE`` and receives the
        final parameters.  Rank 0 applies pushes until every worker is done
        (workers that train longer keep exchanging meanwhile), then sends
        each the result.
        """
        downpour = self._holders[model]
        if not downpour.finished:
            downpour.finish()
            downpour.finished = True

    def state_dict(self):
        """Each model's accumulated update, and the global parameters on rank 0."""
        return {"models": {model.name: d.state() for model, d in self._holders.items()},
                "pushes": self.pushes}

    def load_state_dict(self, state):
        self._restored = dict(state.get("models", {}))
        for model, downpour in self._holders.items():
            if model.name in self._restored:
                downpour.load(self._restored[model.name])


class Downpour:
    """The push/pull exchange of one model, on rank 0 or on a worker."""

    def __init__(self, rule, model, tag):
        self.rule = rule
        self.exchanger = rule.exchanger
        self.variables = model.params + model.model_state
        self.up, self.down = tag, tag + 1
        values = read_values(self.variables)
        self.dtype = np.result_type(*[np.asarray(v).dtype for v in values])
        self.length = flat_size(values)  # elements in one whole-model message
        self.holds_center = rule.rank == HOLDER
        # After the identical start every rank holds the global parameters.
        self.center = _copies(values) if self.holds_center else []
        self.pulled = _copies(values)
        self.sends = []          # (request, buffer) until each send completes
        self.finished = False
        self.done = set()        # workers that have finished (rank 0)
        self.pending = None      # (request, answer buffer, parameters at the push)
        self.due = False         # an exchange fell due while one was in flight
        self.inbox = np.empty(HEADER + self.length, dtype=self.dtype)
        self.receive = None
        if self.holds_center and rule.size > 1:
            self._listen()

    # -- state ---------------------------------------------------------------------
    def accumulated(self):
        """``x - pulled``: this rank's steps not yet pushed."""
        return [x - p for x, p in zip(read_values(self.variables), self.pulled)]

    def state(self):
        state = {"accumulated": self.accumulated()}
        if self.holds_center:
            state["center"] = _copies(self.center)
        return state

    def load(self, state):
        if "accumulated" in state:
            self.pulled = [x - a for x, a in zip(read_values(self.variables),
                                                 state["accumulated"])]
        if self.holds_center and "center" in state:
            self.center = _copies(state["center"])

    # -- both sides -------------------------------------------------------------------
    def _message(self, kind, arrays=None):
        message = np.zeros(HEADER + (self.length if arrays is not None else 0), dtype=self.dtype)
        message[0] = kind
        if arrays is not None:
            pack(arrays, message, HEADER)
        return message

    def _send(self, message, dest, tag):
        self.sends = [(r, b) for r, b in self.sends if not r.test()]
        self.sends.append((self.exchanger.isend(message, dest, tag), message))

    def _flush_sends(self):
        for request, _ in self.sends:
            request.wait()
        self.sends = []

    def _adopt(self, arrays):
        """Set the model to the global parameters ``arrays``; nothing accumulated."""
        write_values(self.variables, _copies(arrays))
        self.pulled = _copies(arrays)

    def poll(self):
        if self.holds_center:
            return self._serve()
        answered = self._answered()
        if answered and self.due:
            self.due = False
            self._push()
        return answered

    def exchange(self):
        if self.holds_center:
            self._serve()
            self._own_exchange()
        elif self.pending is None:
            self._push()
        else:
            self.due = True

    def finish(self):
        if self.holds_center:
            self._finish_holder()
        else:
            self._finish_worker()

    # -- rank 0 ----------------------------------------------------------------------
    def _listen(self):
        self.receive = self.exchanger.irecv(self.inbox, ANY_SOURCE, self.up)

    def _apply(self, update):
        scale = self.rule.update_scale
        self.center = [c + scale * u for c, u in zip(self.center, update)]
        self.rule.pushes += 1

    def _serve(self):
        """Apply every push that has arrived and answer it; returns how many."""
        handled = 0
        while self.receive is not None and self.receive.test():
            source, _ = self.receive.wait()
            self._apply(unpack(self.inbox, self.center, HEADER))
            if self.inbox[0] == PUSH:
                self._send(self._message(FRESH, self.center), source, self.down)
            else:
                self.done.add(source)
            handled += 1
            self._listen()
        return handled

    def _own_exchange(self):
        self._apply(self.accumulated())
        self._adopt(self.center)

    def _finish_holder(self):
        rule = self.rule
        self._own_exchange()
        workers = [r for r in range(rule.size) if r != HOLDER]

        def missing():
            return "asgd's end of training: no DONE yet from rank(s) %s" % ", ".join(
                str(r) for r in workers if r not in self.done)

        while len(self.done) < len(workers):
            # Each push from a worker still training restarts the stall timeout.
            rule.wait_until(lambda: self._serve() > 0 or len(self.done) == len(workers),
                            missing)
        if self.receive is not None:
            self.receive.cancel()
            self.receive = None
        for worker in workers:
            self._send(self._message(FINAL, self.center), worker, self.down)
        self._flush_sends()
        self._adopt(self.center)

    # -- a worker ----------------------------------------------------------------------
    def _push(self):
        current = read_values(self.variables)
        self._send(self._message(PUSH, self.accumulated()), HOLDER, self.up)
        answer = np.empty(HEADER + self.length, dtype=self.dtype)
        self.pending = (self.exchanger.irecv(answer, HOLDER, self.down), answer,
                        _copies(current))

    def _answered(self):
        """Take the fresh parameters once they are in; returns 0 or 1."""
        if self.pending is None or not self.pending[0].test():
            return 0
        _, answer, at_push = self.pending
        self.pending = None
        fresh = unpack(answer, at_push, HEADER)
        # Keep the steps taken while the push travelled: they are not in
        # `fresh` yet and will be part of the next push.
        since = [x - a for x, a in zip(read_values(self.variables), at_push)]
        write_values(self.variables, [(f + s).astype(f.dtype, copy=False)
                                      for f, s in zip(fresh, since)])
        self.pulled = fresh
        self.rule.pushes += 1
        return 1

    def _finish_worker(self):
        if self.pending is not None:
            self.pending[0].wait()
            self._answered()
        self._send(self._message(DONE, self.accumulated()), HOLDER, self.up)
        final = np.empty(HEADER + self.length, dtype=self.dtype)
        self.exchanger.irecv(final, HOLDER, self.down).wait()
        self._flush_sends()
        self._adopt(unpack(final, self.pulled, HEADER))

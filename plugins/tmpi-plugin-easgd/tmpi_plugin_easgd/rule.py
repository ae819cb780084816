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
import numpy as np

from tmpi_adapters.errors import ConfigError
from tmpi_adapters.exchanger import ANY_SOURCE
from tmpi_adapters.options import Knob, one_of, positive
from tmpi_adapters.protocol import read_values, write_values
from tmpi_adapters.rules import Rule, flat_size, pack, unpack

#: The rank that holds the center variable in the asynchronous form.
HOLDER = 0
#: What a message is, carried in its first element.
PUSH, DONE, FORCE, FINAL = 1.0, 2.0, 3.0, 4.0
#: Elements before the parameters: kind, unused.
HEADER = 2
#: Tags of the first model: workers to holder, holder to workers; each further
#: model uses the next pair, so the messages of different models never mix.
BASE_TAG = 20000


def elastic_force(value):
    """Knob check: the fraction of the gap closed per exchange."""
    return None if 0 < value < 1 else "must be in (0, 1); the paper uses alpha = 0.9 / size"


class EASGD(Rule):
    """Elastic averaging SGD, synchronous or with a center held by rank 0.

    Parameters
    ----------
    session : tmpi_adapters.session.Session
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
        self._elastic = {}
        self._restored = {}
        #: Elastic exchanges this rank took part in (answered ones, in async mode).
        self.exchanges_done = 0

    # -- the Rule interface --------------------------------------------------
    def start(self, model):
        kind = ElasticAsync if self.mode == "async" and self.size > 1 else ElasticSync
        elastic = kind(self, model, BASE_TAG + 2 * len(self._elastic))
        if model.name in self._restored and elastic.holds_center:
            elastic.center = [np.array(a, copy=True) for a in self._restored[model.name]]
        self._elastic[model] = elastic

    def after_step(self, model, samples):
        elastic = self._elastic[model]
        elastic.poll()
        if model.step % self.tau == 0:
            elastic.exchange()

    def poll(self, model):
        """Handle what has arrived for ``model`` without waiting.

        Only the asynchronous form has anything to handle: the holder's
        incoming pushes, a worker's answer.  :meth:`after_step` does this after
        every step.  Returns the number of messages handled.
        """
        return self._elastic[model].poll()

    def finish(self, model):
        """Drain every exchange, then give every rank the center variable.

        Asynchronous termination: a worker waits for the answer to its last
        push, tells rank 0 it is done and receives the final center.  Rank 0
        keeps answering pushes until every worker is done (workers that train
        longer keep exchanging meanwhile), then sends each the center.
        """
        elastic = self._elastic[model]
        if not elastic.finished:
            elastic.finish()
            elastic.finished = True

    def state_dict(self):
        """The center variable of each model (on the ranks that hold it)."""
        return {"center": {model.name: [np.array(a, copy=True) for a in e.center]
                           for model, e in self._elastic.items() if e.holds_center},
                "exchanges": self.exchanges_done}

    def load_state_dict(self, state):
        self._restored = dict(state.get("center", {}))
        for model, elastic in self._elastic.items():
            if model.name in self._restored and elastic.holds_center:
                elastic.center = [np.array(a, copy=True) for a in self._restored[model.name]]


class ElasticSync:
    """Synchronous EASGD for one model: every rank holds the same center."""

    holds_center = True

    def __init__(self, rule, model, tag):
        self.rule = rule
        self.variables = model.params + model.model_state
        # After the identical start every worker equals the center.
        self.center = [np.array(a, copy=True) for a in read_values(self.variables)]
        self.finished = False

    def poll(self):
        return 0

    def exchange(self):
        """The synchronous elastic update of every worker and the center, from one
        allreduce of the parameters."""
        rule = self.rule
        workers = read_values(self.variables)
        total = rule.exchanger.allreduce(workers, op="sum")
        # Both updates use the values from before the exchange.
        write_values(self.variables, [x - rule.alpha * (x - c)
                                      for x, c in zip(workers, self.center)])
        self.center = [c + rule.alpha * (s - rule.size * c)
                       for c, s in zip(self.center, total)]
        rule.exchanges_done += 1

    def finish(self):
        write_values(self.variables, [np.array(c, copy=True) for c in self.center])


class ElasticAsync:
    """Asynchronous EASGD for one model: rank 0 holds the center.

    Workers (ranks other than 0) have at most one exchange in flight: a push
    of their parameters, answered by the elastic force.  Rank 0 keeps one
    receive posted for pushes from any worker and answers each at once.
    """

    def __init__(self, rule, model, tag):
        self.rule = rule
        self.exchanger = rule.exchanger
        self.variables = model.params + model.model_state
        self.up, self.down = tag, tag + 1
        values = read_values(self.variables)
        self.dtype = np.result_type(*[np.asarray(v).dtype for v in values])
        self.length = flat_size(values)  # elements in one whole-model message
        self.holds_center = rule.rank == HOLDER
        self.center = [np.array(a, copy=True) for a in values] if self.holds_center else []
        self.sends = []          # (request, buffer) until each send completes
        self.finished = False
        self.done = set()        # workers that have finished (holder)
        self.pending = None      # the answer a worker waits for
        self.due = False         # an exchange fell due while one was in flight
        self.inbox = np.empty(HEADER + self.length, dtype=self.dtype)
        self.receive = None
        if self.holds_center:
            self._listen()

    # -- both sides ------------------------------------------------------------
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

    # -- the holder (rank 0) ------------------------------------------------------
    def _listen(self):
        self.receive = self.exchanger.irecv(self.inbox, ANY_SOURCE, self.up)

    def _serve(self):
        """Answer every push that has arrived; returns how many messages."""
        handled = 0
        while self.receive is not None and self.receive.test():
            source, _ = self.receive.wait()
            if self.inbox[0] == PUSH:
                worker = unpack(self.inbox, self.center, HEADER)
                force = self._pull_center(worker)
                self._send(self._message(FORCE, force), source, self.down)
            else:
                self.done.add(source)
            handled += 1
            self._listen()
        return handled

    def _pull_center(self, worker):
        """Move the center towards ``worker``; returns the elastic force."""
        force = [self.rule.alpha * (x - c) for x, c in zip(worker, self.center)]
        self.center = [c + f for c, f in zip(self.center, force)]
        self.rule.exchanges_done += 1
        return force

    def _own_exchange(self):
        mine = read_values(self.variables)
        force = self._pull_center(mine)
        write_values(self.variables, [(x - f).astype(x.dtype, copy=False)
                                      for x, f in zip(mine, force)])

    def _finish_holder(self):
        rule = self.rule
        workers = [r for r in range(rule.size) if r != HOLDER]

        def missing():
            return "easgd's end of training: no DONE yet from rank(s) %s" % ", ".join(
                str(r) for r in workers if r not in self.done)

        while len(self.done) < len(workers):
            # Each push from a worker still training restarts the stall timeout.
            rule.wait_until(lambda: self._serve() > 0 or len(self.done) == len(workers),
                            missing)
        self.receive.cancel()
        self.receive = None
        for worker in workers:
            self._send(self._message(FINAL, self.center), worker, self.down)
        self._flush_sends()
        write_values(self.variables, [np.array(c, copy=True) for c in self.center])

    # -- a worker ---------------------------------------------------------------------
    def _push(self):
        self._send(self._message(PUSH, read_values(self.variables)), HOLDER, self.up)
        answer = np.empty(HEADER + self.length, dtype=self.dtype)
        self.pending = (self.exchanger.irecv(answer, HOLDER, self.down), answer)

    def _answered(self):
        """Apply the elastic force once rank 0's answer is in; returns 0 or 1."""
        if self.pending is None or not self.pending[0].test():
            return 0
        answer = self.pending[1]
        self.pending = None
        mine = read_values(self.variables)
        force = unpack(answer, mine, HEADER)
        write_values(self.variables, [(x - f).astype(x.dtype, copy=False)
                                      for x, f in zip(mine, force)])
        self.rule.exchanges_done += 1
        return 1

    def _finish_worker(self):
        if self.pending is not None:
            self.pending[0].wait()
            self._answered()
        self._send(self._message(DONE), HOLDER, self.up)
        final = np.empty(HEADER + self.length, dtype=self.dtype)
        self.exchanger.irecv(final, HOLDER, self.down).wait()
        self._flush_sends()
        write_values(self.variables, unpack(final, read_values(self.variables), HEADER))

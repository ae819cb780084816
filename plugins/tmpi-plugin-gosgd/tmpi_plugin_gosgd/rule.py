"""GoSGD: gossip stochastic gradient descent.

Blot, Picard, Cord and Thome, "Gossip training for deep learning", 2016
(arXiv:1611.09726).

Every rank trains its own copy of the model and holds a *sum-weight*
``w`` (``1/size`` at the start, so the weights of all ranks add up to 1).
After each of its steps a rank, with probability ``gossip_probability``,
halves its weight and pushes its parameters with that half to one peer drawn
at random.  A receiver mixes what arrives by sum-weights::

    x_r <- (w_r * x_r + w_s * x_s) / (w_r + w_s)
    w_r <- w_r + w_s

Both moves keep ``sum_r w_r`` and ``sum_r w_r * x_r`` unchanged, so only the
gradient steps move the weighted average of the ranks' models: gossip spreads
information without biasing it.

No rank ever waits for another while training.  Sends are non-blocking and
each rank keeps one receive posted for its peers' messages (all of them on
one tag of the one communicator), which it handles after every step: the
:class:`Gossip` of each model does this with a
:class:`~tmpi_adapters.rules.asynchronous.Mailbox`, and
:meth:`Gossip.finish` ends the exchange without losing a message.
"""
import numpy as np

from tmpi_adapters.plugin import Knob, Mailbox, PerModel, Rule, parse_bool, probability

#: What a message is, carried in its first element.
GOSSIP, DONE = 1.0, 2.0
#: Elements before the parameters: kind, sum-weight.
HEADER = 2
#: Unfinished sends a rank may have before it skips a gossip round: a peer
#: that is busy elsewhere must never make a training rank wait.
MAX_PENDING_SENDS = 4


def boolean(text):
    """``true``/``false`` (or yes/no, on/off, 1/0); named for error messages."""
    return parse_bool(text)


class Gossip(PerModel):
    """The gossip state of one model on one rank: its sum-weight and its mailbox.

    Every message of the model travels on its one tag (``self.tag``): MPI
    keeps one sender's messages on one tag in order, so a peer's ``DONE``
    comes after all of its gossip.
    """

    def __init__(self, rule, model, tag):
        super().__init__(rule, model, tag)
        #: The sum-weight: ``1/size`` at the start, so all ranks' add up to 1.
        self.weight = 1.0 / rule.size
        self.mailbox = Mailbox(rule.exchanger, self.values(), HEADER)
        self.finished = False
        # The one receive every peer's message lands in.
        self.mailbox.listen(self.tag)

    def poll(self):
        """Mix in every message that has arrived, without waiting; returns how many."""
        return self.mailbox.handle(self.arrived)

    def arrived(self, source, message):
        """One message from ``source``: a peer's gossip to mix in, or its DONE."""
        if message[0] == GOSSIP:
            self.mix(float(message[1]), self.mailbox.arrays(message))
        else:
            self.mailbox.done.add(source)

    def mix(self, weight, theirs):
        """Sum-weight mixing of a peer's model into this rank's."""
        total = self.weight + weight
        self.assign([(self.weight * a + weight * b) / total
                     for a, b in zip(self.values(), theirs)])
        self.weight = total
        self.rule.received += 1

    def push(self, peer):
        """Send half of this rank's weight and its model to ``peer`` (non-blocking).

        Returns ``peer``, or ``None`` when too many sends are still unfinished.
        """
        if self.mailbox.unfinished() >= MAX_PENDING_SENDS:
            self.rule.skipped += 1
            return None
        message = self.mailbox.message(GOSSIP, self.values())
        # The weight travels in the message's dtype: keep exactly what was
        # not sent, so the weights of all ranks still add up to 1.
        message[1] = self.weight / 2
        self.weight -= float(message[1])
        self.mailbox.send(message, peer, self.tag)
        self.rule.sent += 1
        return peer

    def finish(self):
        """End the gossip without losing a message, then (optionally) average.

        Termination protocol: every rank sends ``DONE`` to every peer after its
        last push, then keeps mixing in what arrives until it has a ``DONE``
        from every peer; once every ``DONE`` is in, nothing more can arrive.
        Ranks that stop early wait for the others here, mixing in their
        pushes; each arrival restarts the stall timeout (a peer that still
        gossips is alive, only slower).
        """
        if self.finished:
            return
        rule = self.rule
        peers = [r for r in range(rule.size) if r != rule.rank]
        for peer in peers:
            self.mailbox.send(self.mailbox.message(DONE), peer, self.tag)
        self.mailbox.await_done(rule, peers, self.arrived)
        self.mailbox.flush()
        self.finished = True
        if rule.final_average and rule.size > 1:
            self.average()

    def average(self):
        """Replace the model by the sum-weighted average over ranks (a collective)."""
        self.assign(self.rule.exchanger.allreduce(self.values(), op="mean",
                                                  weight=self.weight))
        self.weight = 1.0 / self.rule.size

    def state_dict(self):
        """The sum-weight.  Mixing depends only on the ratio of weights, so
        ranks restarted from one rank's checkpoint (equal weights everywhere)
        gossip correctly."""
        return {"weight": self.weight}

    def load_state_dict(self, state):
        self.weight = state["weight"]


class GoSGD(Rule):
    """Gossip SGD: random pairwise pushes mixed by sum-weights, no global barrier.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    gossip_probability : float
        Probability that a rank pushes its model to a random peer after one
        of its steps (the paper's ``p``).
    final_average : bool
        When training ends, replace every rank's model by the sum-weighted
        average of all of them (one collective), so all ranks hold the same
        model.  ``False`` leaves each rank with its own.
    """

    name = "gosgd"
    exchanges = "parameters"
    knobs = {
        "gossip_probability": Knob(float, 0.1, "probability that a rank pushes its model to "
                                               "a random peer after a step (the paper's p)",
                                   probability),
        "final_average": Knob(boolean, True, "end with the sum-weighted average of all "
                                             "ranks' models on every rank"),
    }
    per_model = Gossip

    def __init__(self, session, **options):
        super().__init__(session, **options)
        self._rng = None
        #: Messages pushed, mixed in, and gossip rounds skipped because
        #: :data:`MAX_PENDING_SENDS` sends were still unfinished.
        self.sent = self.received = self.skipped = 0
        #: The peer this rank pushed to after its latest step (``None``: none).
        self.last_peer = None

    @property
    def rng(self):
        """This rank's random stream, seeded from the session's seed and the rank.

        A stream of its own per rank: the peers differ between ranks, and the
        user's numpy generator (identical on every rank) is left alone.  Made
        on first use, once the session has drawn its seed.
        """
        if self._rng is None:
            self._rng = np.random.default_rng([getattr(self.session, "seed", 0) or 0,
                                               self.rank])
        return self._rng

    def after_step(self, model, samples):
        self.poll(model)
        self.last_peer = None
        if self.size > 1 and self.rng.random() < self.gossip_probability:
            self.last_peer = self.of(model).push(self.random_peer())

    def random_peer(self):
        """A rank other than this one, uniformly."""
        peer = int(self.rng.integers(self.size - 1))
        return peer + 1 if peer >= self.rank else peer

    def rule_state(self):
        """The random stream's state (each model's weight is its own state)."""
        return {"rng": None if self._rng is None else self._rng.bit_generator.state}

    def load_rule_state(self, state):
        if state.get("rng") is not None:
            self._rng = np.random.default_rng()
            self._rng.bit_generator.state = state["rng"]

"""Building blocks of asynchronous rules: whole-model messages over the
Exchanger's point-to-point calls.

:class:`Mailbox`
    One model's messages on one rank: message buffers, the one receive kept
    posted for any rank's messages, the unfinished sends, and the end of the
    exchange (handle what arrives until every peer said ``DONE``).  GoSGD's
    gossip is built on it directly.
:class:`HolderExchange`
    The exchange of a rule whose rank 0 holds the parameters that the other
    ranks push to and pull from (EASGD's center variable, Downpour's global
    parameters): the protocol, with the arithmetic left to a subclass.

Both follow the rules of thumb of ``docs/plugins.md``: nothing waits while
training, one tag per direction and model with the kind of a message in its
first element, and an end that loses no message.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tmpi_adapters.exchangers.base import ANY_SOURCE
from tmpi_adapters.rules.base import PerModel, copies, flat_size, pack, unpack

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from tmpi_adapters.core.protocol import ModelProtocol
    from tmpi_adapters.exchangers.base import Array, Exchanger, Request
    from tmpi_adapters.rules.base import Rule

    #: ``handler(source, message)``: see :meth:`Mailbox.handle`.
    Handler = Callable[[int, np.ndarray], object]


class Mailbox:
    """One model's point-to-point messages on one rank.

    A message is one flat buffer of the model's dtype: ``header`` elements,
    the first of which says what kind of message it is, then the whole model
    (:func:`~tmpi_adapters.rules.base.pack`), or the header alone.  Arrays are never
    pickled.  The mailbox keeps at most one receive posted, into
    :attr:`inbox`, and the buffer of every send until the send completes.

    Parameters
    ----------
    exchanger
        The rule's exchanger: the messages travel through its point-to-point
        calls.
    values
        The model's values (:meth:`~tmpi_adapters.rules.base.PerModel.values`):
        they give the dtype of a message (their common type) and its length.
    header
        Elements before the model.
    """

    def __init__(self, exchanger: Exchanger, values: Sequence[Array], header: int) -> None:
        self.exchanger = exchanger
        self.header = header
        self.dtype = np.result_type(*[np.asarray(v).dtype for v in values])
        #: Elements of the model in one message.
        self.length = flat_size(values)
        # The shape and dtype of each array, without its memory: what
        # :meth:`arrays` unpacks a message into.
        self.layout = [np.broadcast_to(np.zeros((), dtype=np.asarray(v).dtype), np.shape(v))
                       for v in values]
        #: Where the posted receive puts the next message.
        self.inbox = self.empty()
        self.receive: Request | None = None
        self.tag: int | None = None
        self.sends: list[tuple[Request, np.ndarray]] = []  # until each send completes
        #: Ranks whose ``DONE`` has arrived; the rule's handler adds them.
        self.done: set[int] = set()

    # -- messages ------------------------------------------------------------------
    def empty(self) -> np.ndarray:
        """A whole-model message buffer (uninitialised), to receive into."""
        return np.empty(self.header + self.length, dtype=self.dtype)

    def message(self, kind: float, arrays: Sequence[Array] | None = None) -> np.ndarray:
        """A new message: ``kind``, the rest of the header zero, then ``arrays``
        (the model's arrays, in order); without ``arrays``, the header alone."""
        message = np.zeros(self.header + (self.length if arrays is not None else 0),
                           dtype=self.dtype)
        message[0] = kind
        if arrays is not None:
            pack(arrays, message, self.header)
        return message

    def arrays(self, message: np.ndarray) -> list[np.ndarray]:
        """New arrays, shaped and typed like the model's, from what follows the
        header of ``message``."""
        return unpack(message, self.layout, self.header)

    # -- sending ------------------------------------------------------------------
    def send(self, message: np.ndarray, dest: int, tag: int) -> None:
        """Send ``message`` to rank ``dest`` without waiting; its buffer is kept
        until the send completes."""
        self.unfinished()
        self.sends.append((self.exchanger.isend(message, dest, tag), message))

    def unfinished(self) -> int:
        """The number of sends not yet complete (those that are, are let go)."""
        self.sends = [(r, b) for r, b in self.sends if not r.test()]
        return len(self.sends)

    def flush(self) -> None:
        """Wait until every send has completed."""
        for request, _ in self.sends:
            request.wait()
        self.sends = []

    # -- receiving ------------------------------------------------------------------
    def listen(self, tag: int) -> None:
        """Post the receive that the next message on ``tag``, from any rank,
        lands in (:attr:`inbox`)."""
        self.tag = tag
        self.receive = self.exchanger.irecv(self.inbox, ANY_SOURCE, tag)

    def handle(self, handler: Handler) -> int:
        """Call ``handler(source, message)`` for every message that has
        arrived, without waiting; returns how many.

        ``message`` is :attr:`inbox`: the receive is posted into it again
        after the handler returns.
        """
        handled = 0
        while self.receive is not None and self.receive.test():
            source, _ = self.receive.wait()
            handler(source, self.inbox)
            handled += 1
            assert self.tag is not None  # set by the listen() that posted the receive
            self.listen(self.tag)
        return handled

    def expect(self, source: int, tag: int) -> tuple[Request, np.ndarray]:
        """Post a receive of one whole-model message from ``source`` on
        ``tag``; returns ``(request, buffer)``."""
        buffer = self.empty()
        return self.exchanger.irecv(buffer, source, tag), buffer

    def await_done(self, rule: Rule, ranks: Sequence[int], handler: Handler) -> None:
        """Handle arrivals until a ``DONE`` came from each of ``ranks``, then
        stop listening.

        ``handler`` is the one of :meth:`handle`; it adds the sender of a
        ``DONE`` to :attr:`done`.  The wait is ``rule``'s
        :meth:`~tmpi_adapters.rules.base.Rule.wait_until`: each arrival restarts
        its stall timeout (a rank that still sends is alive, only slower),
        and a stall report names the ranks still missing.
        """
        def missing() -> str:
            return "%s's end of training: no DONE yet from rank(s) %s" % (
                rule.name, ", ".join(str(r) for r in ranks if r not in self.done))

        while len(self.done) < len(ranks):
            rule.wait_until(lambda: self.handle(handler) > 0 or len(self.done) == len(ranks),
                            missing)
        if self.receive is not None:
            self.receive.cancel()
            self.receive = None


#: The rank that holds the parameters in a :class:`HolderExchange`.
HOLDER = 0
#: The kinds of a :class:`HolderExchange`'s messages: a worker's push and its
#: last message, the holder's answer to a push and its last message.
PUSH, DONE, ANSWER, FINAL = 1.0, 2.0, 3.0, 4.0


class HolderExchange(PerModel):
    """One model's exchange with a holder: rank 0 holds :attr:`center`, the
    other ranks (workers) push to it and take its answers.

    A worker has at most one exchange in flight and never waits for an
    answer while training: it trains on while its push travels, and an
    exchange that falls due before the answer is in is made as soon as it
    is.  The holder keeps one receive posted for pushes from any worker,
    answers each at once, and exchanges with itself locally.

    The end (:meth:`finish`): a worker waits for the answer to its last push,
    sends ``DONE`` and receives ``FINAL``, the center.  The holder handles
    pushes until every worker is done (workers that train longer keep
    exchanging meanwhile), then sends each the center.  Every rank ends with
    the center.

    A subclass says what the messages carry and what they do: on the holder
    :meth:`answer`, :meth:`exchange_locally` and, optionally,
    :meth:`take_done` and :meth:`before_end`; on a worker :meth:`pushed`,
    :meth:`take_answer` and, optionally, :meth:`last_pushed`; on both
    :meth:`adopt`.  Messages go up on tag ``tag`` and down on ``tag + 1``.
    Checkpoints keep the center (:meth:`state_dict`); a subclass with more
    state extends both methods.

    Parameters
    ----------
    rule, model, tag
        As :class:`~tmpi_adapters.rules.base.PerModel` takes them.
    """

    def __init__(self, rule: Rule, model: ModelProtocol, tag: int) -> None:
        super().__init__(rule, model, tag)
        self.up, self.down = tag, tag + 1
        values = self.values()
        self.mailbox = Mailbox(rule.exchanger, values, header=2)  # kind, unused
        self.holds_center = rule.rank == HOLDER
        #: The holder's parameters (a copy of the model's after the identical
        #: start); empty on a worker.
        self.center: list[np.ndarray] = copies(values) if self.holds_center else []
        self.finished = False
        #: The (request, buffer) of the answer a worker awaits.
        self.pending: tuple[Request, np.ndarray] | None = None
        self.due = False     # an exchange fell due while one was in flight
        if self.holds_center and rule.size > 1:
            self.mailbox.listen(self.up)

    # -- what a subclass says: on the holder ---------------------------------------------
    def answer(self, pushed: list[np.ndarray]) -> Sequence[Array]:
        """A worker's push arrived with ``pushed`` (the arrays of its
        :meth:`pushed`); returns the arrays to answer with."""
        raise NotImplementedError

    def exchange_locally(self) -> None:
        """The holder's own exchange, every time one falls due on it."""
        raise NotImplementedError

    def take_done(self, message: np.ndarray) -> None:
        """A worker's ``DONE`` arrived; ``self.mailbox.arrays(message)`` reads
        what its :meth:`last_pushed` sent, if anything.  By default, nothing."""

    def before_end(self) -> None:
        """Called on the holder when training ends, before it waits for the
        workers.  By default, nothing."""

    # -- what a subclass says: on a worker -----------------------------------------------
    def pushed(self) -> Sequence[Array]:
        """The arrays to push, each time an exchange is made."""
        raise NotImplementedError

    def take_answer(self, answer: list[np.ndarray]) -> None:
        """The holder's ``answer`` (arrays) to this worker's push arrived."""
        raise NotImplementedError

    def last_pushed(self) -> Sequence[Array] | None:
        """The arrays ``DONE`` carries, or ``None`` (the default): nothing."""
        return None

    # -- what a subclass says: on both ---------------------------------------------------
    def adopt(self, center: list[np.ndarray]) -> None:
        """Training ended with ``center`` (the holder's :attr:`center`, or the
        arrays it sent); copy what is kept."""
        raise NotImplementedError

    # -- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any] | None:
        """The center, on the holder; ``None`` on a worker."""
        return {"center": copies(self.center)} if self.holds_center else None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a checkpoint's center, on the holder (every rank loads rank 0's
        state, and only the holder has a center)."""
        if self.holds_center and state.get("center") is not None:
            self.center = copies(state["center"])

    # -- the protocol ------------------------------------------------------------------
    def poll(self) -> int:
        """Handle what has arrived, without waiting; returns how many messages."""
        if self.holds_center:
            return self.mailbox.handle(self._arrived)
        answered = self._answered()
        if answered and self.due:
            self.due = False
            self._push()
        return answered

    def exchange(self) -> None:
        """Make the exchange that falls due now (or as soon as the previous
        one is answered, on a worker)."""
        if self.holds_center:
            self.mailbox.handle(self._arrived)
            self.exchange_locally()
        elif self.pending is None:
            self._push()
        else:
            self.due = True

    def finish(self) -> None:
        """The end of the exchange (see the class); once."""
        if self.finished:
            return
        if self.holds_center:
            self._finish_holder()
        else:
            self._finish_worker()
        self.finished = True

    # the holder
    def _arrived(self, source: int, message: np.ndarray) -> None:
        if message[0] == PUSH:
            answer = self.answer(self.mailbox.arrays(message))
            self.mailbox.send(self.mailbox.message(ANSWER, answer), source, self.down)
        else:
            self.take_done(message)
            self.mailbox.done.add(source)

    def _finish_holder(self) -> None:
        self.before_end()
        workers = [r for r in range(self.rule.size) if r != HOLDER]
        self.mailbox.await_done(self.rule, workers, self._arrived)
        for worker in workers:
            self.mailbox.send(self.mailbox.message(FINAL, self.center), worker, self.down)
        self.mailbox.flush()
        self.adopt(self.center)

    # a worker
    def _push(self) -> None:
        self.mailbox.send(self.mailbox.message(PUSH, self.pushed()), HOLDER, self.up)
        self.pending = self.mailbox.expect(HOLDER, self.down)

    def _answered(self) -> int:
        """Take the holder's answer once it is in; returns 0 or 1."""
        if self.pending is None or not self.pending[0].test():
            return 0
        answer = self.pending[1]
        self.pending = None
        self.take_answer(self.mailbox.arrays(answer))
        return 1

    def _finish_worker(self) -> None:
        if self.pending is not None:
            self.pending[0].wait()
            self._answered()
        self.mailbox.send(self.mailbox.message(DONE, self.last_pushed()), HOLDER, self.up)
        request, final = self.mailbox.expect(HOLDER, self.down)
        request.wait()
        self.mailbox.flush()
        self.adopt(self.mailbox.arrays(final))

"""Generator-fed Keras on N ranks: rank 0 draws every batch, every rank trains on it.

Keras' ``fit_generator``, ``evaluate_generator`` and ``predict_generator``
(and ``fit``, ``evaluate``, ``predict`` given a generator or a
``keras.utils.Sequence``) pull each batch with ``next(output_generator)``:
from the script's generator itself (``workers=0``) or from an enqueuer whose
worker threads or processes run it (``workers >= 1``).  Ranks that each ran
their own would draw other batches as soon as the generator draws at random
from threads that race (data augmentation), so under strong scaling rank 0
alone draws:

- on rank 0 the script's generator and Keras' enqueuer run as in one process,
  and each batch Keras pulls is handed, whole, to every other rank;
- the other ranks run no generator, no worker thread and no worker process:
  what Keras pulls there is rank 0's batch.

Every rank then calls ``train_on_batch`` (``test_on_batch``,
``predict_on_batch``) with the same batch, and tmpi splits its rows as for
any call: the N-rank run is one that a single process could have made,
whatever the generator's threads did.  When the outermost loop ends, also by
an error of rank 0's generator (which every rank raises), every rank takes
rank 0's numpy and ``random`` generators (its workers drew from them; rank 0
first lets the draws its workers had started finish), so that the script goes
on alike on every rank.  With ``--scaling weak`` each rank
keeps its own generator (:mod:`.sharding`).

How a batch travels: on a communicator of their own, a header from rank 0 of
five integers (a batch, the generator's end, its error, or rank 0's random
generators; the bytes that follow; the bytes of the next batch, when it is
drawn ahead; the batch's number; a checksum of the stream's name), then one
buffer: a small pickle of the batch's structure (tuples, lists, dicts,
``None``), the stream's name and the batch's number, then every array's bytes
at 64-byte boundaries (arrays are never pickled; the other ranks' arrays are
views of the buffer).  When Keras'
enqueuer already has the next batch ready, rank 0 takes it at once and its
broadcast runs while the ranks train on this one (MPI moves it whenever the
step's exchange waits); its header then only says that it has arrived.  A
batch drawn ahead that no loop takes is dropped when the loop ends, as
Keras' enqueuer drops its queue.  Each rank checks that the batch is the one
it pulls (the same stream, the same number): ranks that run other loops stop
with a :class:`~tmpi_adapters.errors.LockstepError` naming both, and a rank
that waits too long for rank 0 is reported like any stall.
"""
import functools
import inspect
import random
import threading
import time

import numpy as np

from tmpi_adapters.errors import LockstepError, TmpiError
from tmpi_adapters.exchangers.envelope import Envelope
from tmpi_adapters.exchangers.waiting import START_SECONDS
from tmpi_adapters.frameworks.keras import batchwire

#: What a header announces.
BATCH, END, ERROR, STATE = 0, 1, 2, 3
#: Seconds rank 0 lets the draws its enqueuer's workers had started finish
#: when a loop ends, before it hands its random generators to every rank.
JOIN_SECONDS = 10.0
#: Share of a training step that rank 0 may wait for its generator before the
#: end-of-run line calls the generator the bottleneck.
BOTTLENECK = 0.10
#: How the streams of each Keras function are named.
LABELS = {"fit_generator": "fit_generator's batches",
          "evaluate_generator": "evaluate_generator's batches",
          "predict_generator": "predict_generator's batches"}
VALIDATION = "fit_generator's validation batches"
_STATE_LABEL = "rank 0's random generators"


class Feed:
    """The batches rank 0 hands to every rank, for one session.

    Parameters
    ----------
    adapter : tmpi_adapters.frameworks.keras.adapter.KerasAdapter
    """

    def __init__(self, adapter):
        self.adapter = adapter
        self.session = adapter.session
        self.root = self.session.rank == 0
        self.comm = None
        #: ``{id(object): stream name}`` of the generators the running loops feed
        self._labels = {}
        self._depth = 0
        self._shared = 0
        #: streams with a batch drawn ahead whose broadcast is running
        self._pending = []
        #: the error the latest batch raised on every rank (rank 0's generator's,
        #: or its end), or ``None``
        self.agreed = None
        #: rank 0: per stream, the seconds each batch kept it waiting for the generator
        self.waits = {}
        self.batches = 0
        self.bytes = 0
        self.transfer_s = 0.0
        #: rank 0: batches whose broadcast ran during the step before
        self.ahead = 0

    def active(self):
        """True when rank 0 draws for every rank: strong scaling on more than one rank."""
        return (self.session.size > 1 and self.adapter.batch_mode() == "rows"
                and not self.adapter.stepping_locally)

    # -- a loop ---------------------------------------------------------------------
    def begin(self, name):
        """A fed Keras loop starts (on every rank)."""
        if self.comm is None:
            session = self.session
            # The communicator is made by a collective of the session's own: the
            # ranks first meet, so that one doing something else is named.
            session.meet(Envelope("other", "%s, whose batches rank 0 draws" % name))
            comm, request = session.comm.Idup()
            session.exchanger.wait_for(request.Test, "the start of %s" % name,
                                       max(session.exchanger.timeout or 0.0, START_SECONDS))
            self.comm = comm
        self._depth += 1

    def end(self, error=None):
        """A fed Keras loop ended, with ``error`` if it raised one.  Every rank
        takes rank 0's random generators unless the error is this rank's own
        (the ranks may then be anywhere)."""
        self._depth -= 1
        if self._depth == 0:
            self._labels.clear()
            agreed, self.agreed = self.agreed, None
            if error is None or error is agreed:
                self._flush()
                self.share_random_state()

    def source(self, data, label, workers):
        """What the Keras loop is given in place of the script's ``data`` (a
        generator or a ``Sequence``) on this rank, its stream named ``label``."""
        from keras.engine.training_utils import is_sequence
        if self.root:
            fed = FedStream(self, label, data) if workers == 0 and not is_sequence(data) \
                else data
        elif is_sequence(data):
            fed = absent_sequence(data)
        else:
            fed = FedStream(self, label)
        self._labels[id(fed)] = label
        return fed

    def feeds(self, data):
        """True for the data of a fed loop (what :meth:`source` returned)."""
        return isinstance(data, FedStream) or id(data) in self._labels

    def label(self, data):
        return data.label if isinstance(data, FedStream) else self._labels.get(
            id(data), "a generator")

    def stream(self, data, source=None, ready=None):
        """The stream Keras pulls ``data``'s batches from on this rank (on rank
        0 drawn from ``source``, ahead when ``ready()`` says a batch is)."""
        if isinstance(data, FedStream):
            return data
        if not self.root:
            return FedStream(self, self.label(data))
        return FedStream(self, self.label(data), source, ready)

    # -- rank 0 -----------------------------------------------------------------------
    def draw(self, stream):
        """Rank 0: the next batch of ``stream``'s source, handed to every rank.

        A batch drawn ahead (:meth:`_ahead`) is on its way already; the batch
        after this one is drawn ahead when the enqueuer has it ready, and its
        broadcast left running while the ranks train on this one.
        """
        held, stream.held = stream.held, None
        if held is None:
            start = time.perf_counter()
            item = self._next(stream)
            self.waits.setdefault(stream.label, []).append(time.perf_counter() - start)
            buffer = batchwire.pack(stream.label, stream.count, item)
        else:
            item, buffer, request = held
            self.waits.setdefault(stream.label, []).append(0.0)  # drawn before it was pulled
        following = self._ahead(stream)
        begin = time.perf_counter()
        header = batchwire.header(BATCH, 0 if held else buffer.size,
                         0 if following is None else following[1].size, stream)
        self._bcast(header, stream)
        if held is None:
            self._bcast(buffer, stream)
        else:
            self._wait(request, stream)
        if following is not None:
            stream.held = following + (self.comm.Ibcast(following[1], root=0),)
            self._pending.append(stream)
            self.ahead += 1
        self._count(buffer, begin)
        return item

    def _next(self, stream):
        """The source's next batch; its end or error is told to every rank and raised."""
        error, stream.deferred = stream.deferred, None
        if error is None:
            try:
                return next(stream.source)
            except (StopIteration, Exception) as raised:
                error = raised
        if isinstance(error, StopIteration):
            self._tell(END, stream, None)
        else:
            self._tell(ERROR, stream, batchwire.pickled_error(error))
        self.agreed = error
        raise error

    def _ahead(self, stream):
        """``(item, buffer)`` of the batch after this one when the enqueuer has
        it ready (drawing it then waits for nothing), else ``None``.  Its end
        or error is kept for the next pull, where one process would meet it."""
        if stream.ready is None or stream.deferred is not None or not stream.ready():
            return None
        try:
            item = next(stream.source)
        except (StopIteration, Exception) as error:
            stream.deferred = error
            return None
        return item, batchwire.pack(stream.label, stream.count + 1, item)

    def _tell(self, kind, stream, value):
        """Rank 0: a message that is not a batch (the end, an error, a state)."""
        buffer = batchwire.pack(stream.label, stream.count, value, kind == BATCH)
        self._bcast(batchwire.header(kind, buffer.size, 0, stream), stream)
        self._bcast(buffer, stream)

    # -- every other rank ---------------------------------------------------------------------
    def receive(self, stream):
        """Rank 0's next batch of ``stream``."""
        header = np.zeros(5, dtype=np.int64)
        begin = time.perf_counter()
        self._bcast(header, stream)
        kind, size, following = int(header[0]), int(header[1]), int(header[2])
        if (int(header[3]), int(header[4])) != (stream.count, batchwire.crc(stream.label)):
            raise LockstepError(_mismatch(self.session.rank, stream, None, int(header[3])))
        held, stream.held = stream.held, None
        if size == 0:
            if held is None:
                raise TmpiError("rank 0 says batch %d of %s is on its way, but this rank "
                                "expects none; this is a bug in tmpi: please report it."
                                % (stream.count, stream.label))
            buffer, request = held
            self._wait(request, stream)
        else:
            buffer = np.empty(size, dtype=np.uint8)
            self._bcast(buffer, stream)
        if following:
            ahead = np.empty(following, dtype=np.uint8)
            stream.held = (ahead, self.comm.Ibcast(ahead, root=0))
            self._pending.append(stream)
        label, count, value = batchwire.unpack(buffer)
        if (label, count) != (stream.label, stream.count):
            raise LockstepError(_mismatch(self.session.rank, stream, label, count))
        if kind == END:
            self.agreed = StopIteration()
            raise self.agreed
        if kind == ERROR:
            self.agreed = batchwire.raised_on_root(value)
            raise self.agreed
        if kind == BATCH:
            self._count(buffer, begin)
        return value

    # -- both ---------------------------------------------------------------------------
    def _what(self, stream):
        return "batch %d of %s (rank 0 draws it and hands it to every rank)" % (
            stream.count, stream.label)

    def _bcast(self, part, stream):
        """Rank 0's ``part`` on every rank."""
        self._wait(self.comm.Ibcast(part, root=0), stream)

    def _wait(self, request, stream):
        self.session.exchanger.wait_for(request.Test, lambda: self._what(stream))

    def _count(self, buffer, begin):
        self.transfer_s += time.perf_counter() - begin
        self.bytes += buffer.size
        self.batches += 1

    def _flush(self):
        """Complete the broadcasts of batches drawn ahead that no loop took."""
        pending, self._pending = self._pending, []
        for stream in pending:
            held, stream.held = stream.held, None
            if held is not None:
                self._wait(held[-1], stream)
            stream.deferred = None

    def share_random_state(self):
        """Every rank takes rank 0's numpy and ``random`` generators."""
        self._shared += 1
        stream = FedStream(self, _STATE_LABEL)
        stream.count = self._shared
        if self.root:
            self._tell(STATE, stream, (np.random.get_state(), random.getstate()))
            return
        header = np.zeros(5, dtype=np.int64)
        self._bcast(header, stream)
        if (int(header[3]), int(header[4])) != (stream.count, batchwire.crc(stream.label)):
            raise LockstepError(_mismatch(self.session.rank, stream, None, int(header[3])))
        buffer = np.empty(int(header[1]), dtype=np.uint8)
        self._bcast(buffer, stream)
        label, count, state = batchwire.unpack(buffer)
        if (label, count) != (stream.label, stream.count):
            raise LockstepError(_mismatch(self.session.rank, stream, label, count))
        np.random.set_state(state[0])
        random.setstate(state[1])

    # -- the end of the run --------------------------------------------------------------
    def note(self, summary):
        """The end-of-run line's words on the batches rank 0 drew (rank 0), or ``None``."""
        if not self.root or not self.waits:
            return None
        waits = self.waits.get(LABELS["fit_generator"]) or [
            w for ws in self.waits.values() for w in ws]
        mean = sum(waits) / len(waits)
        step = sum(summary.get(p, 0.0) for p in ("compute_s", "comm_s", "wait_s", "data_s"))
        text = ("batches drawn on rank 0 and handed to every rank: %d (%s; %d sent during "
                "the step before), %.2f ms each to hand out; rank 0 waited %.2f ms per batch "
                "for the generator" % (self.batches, batchwire.size_text(self.bytes),
                                       self.ahead,
                                       1e3 * self.transfer_s / max(self.batches, 1),
                                       1e3 * mean))
        if step > 0 and mean > BOTTLENECK * step:
            share = mean / step
            text += (" (%s, every rank waiting with it): rank 0's generator is the "
                     "bottleneck; give the loop more workers (workers=4 draws 4 batches at "
                     "once), or run with --scaling weak so that each rank draws its own "
                     "batches" % ("%.0f%% of a step" % (100 * share) if share < 2
                                  else "%.0f times a step" % share))
        return text

    def close(self):
        if self.comm is not None:
            self.comm.Free()
            self.comm = None


class FedStream:
    """What a fed Keras loop pulls its batches from.

    On rank 0, ``source`` (the enqueuer's output, or the script's generator)
    drawn and each batch handed to every rank; elsewhere rank 0's batches.
    ``label`` names the stream; ``count`` is the number of the latest batch;
    ``ready()``, where given, says that ``source`` has a batch ready.
    """

    def __init__(self, feed, label, source=None, ready=None):
        self.feed, self.label, self.source, self.ready = feed, label, source, ready
        self.count = 0
        #: the next batch, drawn ahead: on rank 0 ``(item, buffer, request)``,
        #: elsewhere ``(buffer, request)``
        self.held = None
        #: rank 0: the end or error met drawing ahead, raised at the next pull
        self.deferred = None

    def __iter__(self):
        return self

    def __next__(self):
        self.count += 1
        if self.feed.root:
            return self.feed.draw(self)
        return self.feed.receive(self)

    next = __next__  # Keras tells a generator by ``next`` or ``__next__``

    def __repr__(self):
        return "<tmpi FedStream %s, batch %d>" % (self.label, self.count)


# -- Keras' functions, enqueuers and iterators on every rank --------------------------------

def fed_loop(feed, function, name):
    """Keras' ``training_generator.<name>`` with its generator fed from rank 0."""
    signature = inspect.signature(function)
    default_workers = signature.parameters["workers"].default

    @functools.wraps(function)
    def fed(*args, **kwargs):
        if not feed.active():
            return function(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        arguments = bound.arguments
        generator = arguments.get("generator")
        if isinstance(generator, FedStream):
            # fit_generator's validation batches: fed already.
            return function(*args, **kwargs)
        workers = arguments.get("workers", default_workers)
        feed.begin(name)
        try:
            arguments["generator"] = feed.source(generator, LABELS[name], workers)
            validation = arguments.get("validation_data")
            if name == "fit_generator" and _is_generator(validation):
                arguments["validation_data"] = feed.source(validation, VALIDATION, workers)
            result = function(*bound.args, **bound.kwargs)
        except BaseException as error:
            feed.end(error)
            raise
        feed.end()
        return result
    return fed


def enqueuer(feed, cls):
    """Keras' enqueuer class ``cls`` as the training loops make it: on rank 0 of a
    fed loop one whose output goes to every rank, elsewhere one that starts
    nothing and yields rank 0's batches."""
    root_cls = _root_enqueuer(feed, cls)

    @functools.wraps(cls, updated=())
    def make(sequence, *args, **kwargs):
        if not feed.active() or not feed.feeds(sequence):
            return cls(sequence, *args, **kwargs)
        if feed.root:
            return root_cls(sequence, *args, **kwargs)
        return AbsentEnqueuer(feed, sequence)
    return make


def iterate_sequence(feed, iter_sequence_infinite):
    """Keras' ``iter_sequence_infinite`` (a ``Sequence`` with ``workers=0``), fed."""
    @functools.wraps(iter_sequence_infinite)
    def iterate(sequence):
        if not feed.active() or not feed.feeds(sequence):
            return iter_sequence_infinite(sequence)
        return feed.stream(sequence, iter_sequence_infinite(sequence) if feed.root else None)
    return iterate


def _root_enqueuer(feed, cls):
    class RootEnqueuer(cls):
        """Keras' enqueuer on rank 0: its batches go to every rank as Keras pulls
        them, and when it stops, the draws its workers had started finish, so
        that rank 0's random generators are final when every rank takes them."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._tmpi_pools = []

        def _run(self):
            make = self.executor_fn

            def made(shared):
                # An epoch's pool is done when the next is made (the queue was
                # emptied first): only the latest may have draws running.
                pool = make(shared)
                self._tmpi_pools[:] = [pool]
                return pool
            self.executor_fn = made
            return super()._run()

        def get(self):
            return feed.stream(self.sequence, super().get(), self._tmpi_ready)

        def _tmpi_ready(self):
            """True when the next batch is drawn (its future has its result)."""
            queue = self.queue
            if queue is None or not self.is_running():
                return False
            with queue.mutex:
                first = queue.queue[0] if queue.queue else None
            return first is not None and first.ready()

        def stop(self, timeout=None):
            super().stop(timeout)
            _join(self._tmpi_pools, self.run_thread)

    RootEnqueuer.__name__ = RootEnqueuer.__qualname__ = cls.__name__
    return RootEnqueuer


class AbsentEnqueuer:
    """Keras' enqueuer on a rank that draws nothing: no worker starts, and
    what it yields is rank 0's batches."""

    def __init__(self, feed, sequence):
        self.feed, self.sequence = feed, sequence
        self.stop_signal = None

    def start(self, workers=1, max_queue_size=10):
        self.stop_signal = threading.Event()

    def is_running(self):
        return self.stop_signal is not None and not self.stop_signal.is_set()

    def get(self):
        return self.feed.stream(self.sequence)

    def stop(self, timeout=None):
        if self.stop_signal is not None:
            self.stop_signal.set()

    def join_end_of_epoch(self):
        pass  # rank 0's enqueuer ends the epoch


_ABSENT = []


def absent_sequence(sequence):
    """A stand-in for the script's ``Sequence`` on a rank that draws nothing:
    its length is the script's, its epochs end without running its
    ``on_epoch_end`` (rank 0's does), its batches are never read."""
    if not _ABSENT:
        from keras.utils import Sequence

        class AbsentSequence(Sequence):
            def __init__(self, sequence):
                self.sequence = sequence

            def __len__(self):
                return len(self.sequence)

            def __getitem__(self, index):
                raise TmpiError("a rank other than 0 read batch %d of a Keras Sequence that "
                                "rank 0 draws for every rank; this is a bug in tmpi: please "
                                "report it." % index)

            def on_epoch_end(self):
                pass

        _ABSENT.append(AbsentSequence)
    return _ABSENT[0](sequence)


# -- helpers ----------------------------------------------------------------------------------

def _is_generator(data):
    """Keras' test for validation data that is a generator or a ``Sequence``."""
    from keras.engine.training_utils import is_sequence
    return data is not None and (hasattr(data, "next") or hasattr(data, "__next__") or
                                 is_sequence(data))


def _join(pools, run_thread):
    """Let the worker pools of a stopped enqueuer finish what they had started,
    for at most :data:`JOIN_SECONDS`."""
    if not pools or (run_thread is not None and run_thread.is_alive()):
        return

    def join():
        for pool in pools:
            try:
                pool.join()
            except (ValueError, AssertionError):  # never closed: still running
                pass
    waiting = threading.Thread(target=join, name="tmpi-join-workers", daemon=True)
    waiting.start()
    waiting.join(JOIN_SECONDS)


def _mismatch(rank, stream, label, count):
    label = label or "another loop's batches"
    return ("ranks left lockstep: rank 0 handed out batch %d of %s while rank %d was "
            "pulling batch %d of %s. Under tmpi rank 0 alone draws the batches of Keras' "
            "generator loops (fit_generator, evaluate_generator, predict_generator and fit, "
            "evaluate, predict given a generator or a Sequence) and every rank takes them "
            "in the same order, so every rank must run the same loops with the same steps; "
            "a script that gives each rank its own generator (sharded data) runs with "
            "--scaling weak." % (count, label, rank, stream.count, stream.label))

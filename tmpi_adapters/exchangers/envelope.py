"""Envelopes: every collective says what it is for, in the same message.

Ranks under a lockstep rule must issue the same collectives in the same
order.  When a script makes them disagree (two training functions called in
another order, one rank leaving its loop early, a failure caught on one rank
only), MPI pairs whatever comes next: collectives of the same size complete
with a silent mix, others hang.  So each collective carries an *envelope*:
what the rank is doing (the phase, the training function, its call count,
the batch's rows) and the collective's sequence number, turned into a small
integer *token*.  Every rank writes its token into its own slot of a few
extra elements of the reduced buffer (the others write zero), so after the
reduction every rank sees every rank's token, exactly, and compares: no
extra collective, a handful of elements more per message.  A mismatch
becomes a :class:`~tmpi_adapters.errors.LockstepError` that names what each
rank was doing.
"""
import zlib

import numpy as np

#: Largest token that each wire type carries exactly (a token is summed with
#: zeros only, so it needs the type's integer range, not its sum's).
_TOKEN_LIMIT = {"f8": 2 ** 31, "f4": 2 ** 24, "f2": 2 ** 11, "bf16": 2 ** 8,
                "i8": 2 ** 31, "i4": 2 ** 31, "u2": 2 ** 11}


def token_limit(wire_dtype, fmt=None):
    """How large a token ``wire_dtype`` (or the ``fmt`` codes) carries exactly."""
    if fmt is not None:
        return _TOKEN_LIMIT["f2" if fmt == "fp16" else "bf16"]
    key = "%s%d" % (np.dtype(wire_dtype).kind, np.dtype(wire_dtype).itemsize)
    return _TOKEN_LIMIT.get(key, 2 ** 8)


class Envelope:
    """What a rank is doing when it takes part in collectives.

    Parameters
    ----------
    phase : str
        ``"step"``, ``"start"`` (the identical start), ``"end"`` (the end of
        the script), ``"vote"``, ...
    name : str
        The training function or the exchange's purpose (``train_fn#0``,
        ``Keras epoch end``).
    call : int, optional
        The function's call count (1 for its first call).
    rows : int, optional
        The global batch's rows.
    data : int, optional
        A fingerprint of the global batch's contents
        (:func:`~tmpi_adapters.core.batches.fingerprint`), on the calls that
        take one: ranks handed different batches disagree.
    """

    __slots__ = ("phase", "name", "call", "rows", "data", "params", "samples", "_text", "_crc")

    def __init__(self, phase, name, call=None, rows=None, data=None, params=None):
        self.phase, self.name, self.call, self.rows = phase, name, call, rows
        self.data = data
        #: a digest of the model's parameters and state, on some steps
        #: (:func:`tmpi_adapters.core.protocol.state_digest`): ranks whose
        #: models drifted apart disagree
        self.params = None if params is None else params[0]
        #: ``(names, per-variable sample sums)`` behind that digest, to name
        #: the first variable that differs (not in the token)
        self.samples = None if params is None else params[1]
        # What describe() says and the checksum of the token's fixed part,
        # computed on first use (an envelope does not change; a step's
        # couplings each ask).
        self._text = self._crc = None

    def describe(self, sequence=None):
        """``"train_G call 41 (32 rows)"`` and the like."""
        if self._text is None:
            self._text = self._describe()
        return self._text

    def _describe(self):
        if self.phase == "step":
            text = "%s call %s" % (self.name, self.call)
        elif self.phase == "start":
            text = "the identical start of %s" % self.name
        elif self.phase == "compile":
            text = "compiling %s" % self.name
        elif self.phase == "eval":
            text = "evaluating %s call %s" % (self.name, self.call)
        else:
            text = self.name + ("" if self.call is None else " %s" % self.call)
        if self.rows is not None:
            text += " (%d rows)" % self.rows
        if self.data is not None:
            text += ", %s%06x" % (DATA_MARK, self.data)
        if self.params is not None:
            text += ", %s%06x" % (PARAMS_MARK, self.params)
        return text

    def token(self, sequence, limit):
        """The integer in ``[1, limit]`` this envelope and the collective's
        ``sequence`` number stand for."""
        if self._crc is None:
            self._crc = zlib.crc32(("%s|%s|%s|%s|%s|%s|" % (
                self.phase, self.name, self.call, self.rows, self.data, self.params)).encode())
        return 1 + zlib.crc32(b"%d" % sequence, self._crc) % (limit - 1)


#: How a description names the batch's fingerprint.
DATA_MARK = "data #"
#: How a description names the parameters' digest.
PARAMS_MARK = "params #"


def only_params_differ(descriptions):
    """True when the ranks' ``descriptions`` differ in their parameters'
    digest alone: the same step, models that drifted apart."""
    return len(descriptions) > 1 and len(
        {text.split(", " + PARAMS_MARK)[0] for text in descriptions.values()}) == 1 and len(
        set(descriptions.values())) > 1


def drift_message(descriptions, first, spread):
    """The paragraph of the error for ranks whose models drifted apart:
    ``first`` names the first variable that differs (or ``None``), ``spread``
    how far its ranks' values are apart (relative)."""
    where = next(iter(descriptions.values())).split(", " + PARAMS_MARK)[0].split(
        ", " + DATA_MARK)[0]
    named = (" The first that differs is %s (its ranks' values %s)." % (
        first, "apart by %.2g relative" % spread if spread else "differ in their last bits")
        if first else "")
    return ("ranks' models drifted apart: before %s the ranks' parameters or state differ, so "
            "they no longer train one model and their results would not be one process's.%s "
            "Something in the training step gives ranks different values without tmpi "
            "seeing it: a random generator seeded per rank outside Theano's streams, an "
            "update computed from rank-local Python values (time, rank, os.environ), or a "
            "shared variable changed with set_value on one rank only. Give every rank the "
            "same values (tmpi seeds numpy and Python alike on every rank)." % (where, named))


#: The envelope of collectives issued outside any training function.
OUTSIDE = Envelope("other", "a collective outside training functions")


def only_data_differs(descriptions):
    """True when the ranks' ``descriptions`` differ in their batch's fingerprint
    alone: the same step with the same rows, other values."""
    return len(descriptions) > 1 and len(
        {text.split(", " + DATA_MARK)[0] for text in descriptions.values()}) == 1


def mismatch_message(descriptions, mine):
    """The paragraph of a :class:`~tmpi_adapters.errors.LockstepError`.

    ``descriptions`` is ``{rank: what it was doing}`` (ranks not heard from
    are missing); ``mine`` is this rank's number.
    """
    lines = "; ".join("rank %d: %s" % (rank, text) for rank, text in sorted(descriptions.items()))
    if only_data_differs(descriptions):
        return ("ranks left lockstep: they were handed different batches (%s): the same "
                "step with the same rows, "
                "but other values. tmpi hands every rank the whole global batch and each "
                "takes its own share of its rows, so a script that gives each rank its own "
                "data would silently train on part of each rank's batch only. Either load "
                "the same data on every rank and let tmpi split it, or, to train each rank "
                "on its own data (sharded by rank), run with --scaling weak. (Should the "
                "script go on, as a test runner does, numpy's and Python's random generators "
                "are rank 0's again on every rank.)" % lines)
    text = ("ranks left lockstep: they met in one collective while doing different things "
            "(%s). Under a lockstep rule (BSP) every rank must call the same training "
            "functions in the same order with the same global batch. Usual causes: data "
            "that gives ranks different numbers of batches, a loop that stops on a "
            "per-rank condition (a time budget, a rank-local early stop, sys.exit on one "
            "rank), an exception caught on one rank only, or functions called in a "
            "rank-dependent order. Give every rank the same loop and the same batches "
            "(tmpi splits each batch across the ranks itself)." % lines)
    if any(d.startswith("evaluating ") for d in descriptions.values()):
        text += (" An evaluation function (validation, prediction) is split across the "
                 "ranks like a training step, so it too must be called on every rank: "
                 "call it outside `if rank == 0:` (it returns the one-process values on "
                 "every rank), and print or save on rank 0 only.")
    return text

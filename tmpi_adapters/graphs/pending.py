"""What the converting reading asks of the step: values to make whole, and refusals.

Where rows meet in a training step, the row analysis (:mod:`.rows`) puts a
:class:`Pending` node in the converted graph, a *request* (:class:`Request`)
that :mod:`tmpi_adapters.core.coupling` turns into a collective, and a
:class:`Coupling` that says in the script's words where and why.  Where no
conversion makes the one-process value, a rule raises :class:`Refusal`.
Theano is imported when the :class:`Pending` op is first made.
"""
import itertools

_pending_ids = itertools.count()


class Request:
    """A value made whole by a collective (a :class:`Pending` node's output).

    ``kind``: ``"sum"``, ``"max"``, ``"min"``, ``"gather"`` (``axis``: the
    rows' axis), ``"stack"`` (one part from every rank whose rows count,
    stacked in rank order on a new first axis) or ``"same"`` (a gradient
    every rank has whole);
    ``source``: the original variable; ``gradient``: the index of the
    gradient whose exchanged part this is, else ``None``.
    """

    def __init__(self, kind, axis, source, output, gradient=None):
        self.kind, self.axis, self.source, self.output = kind, axis, source, output
        self.gradient = gradient
        #: the :class:`Coupling` it makes whole (``None`` for a gradient)
        self.coupling = None


def pending_op():
    """The :class:`Pending` Op class (made when Theano is imported)."""
    global Pending
    if Pending is not None:
        return Pending
    from theano.gof import Apply, Op

    class _Pending(Op):
        """A value to be made whole across ranks: replaced by a collective
        (:mod:`tmpi_adapters.core.coupling`) before the function is compiled."""

        __props__ = ("kind", "axis", "ident")

        def __init__(self, kind, axis=None):
            self.kind, self.axis, self.ident = kind, axis, next(_pending_ids)

        def make_node(self, value):
            return Apply(self, [value], [stacked_type(value.type) if self.kind == "stack"
                                         else value.type()])

        def perform(self, node, inputs, output_storage):
            raise AssertionError("a pending collective was compiled unreplaced")

        def do_constant_folding(self, node):
            return False
    Pending = _Pending
    return Pending


Pending = None


def stacked_type(kind):
    """The type of one part of tensor type ``kind`` from every rank, stacked
    on a new first axis."""
    return kind.clone(broadcastable=(False,) + tuple(kind.broadcastable))()


def is_pending(variable):
    """True for the output of a :class:`Pending` node."""
    return variable.owner is not None and Pending is not None and \
        isinstance(variable.owner.op, Pending)


class Coupling:
    """One place where rows meet and what the converted graph does there.

    Attributes
    ----------
    kind : str
        ``"sum"``, ``"max"``, ``"min"`` (a cross-rank reduction) or
        ``"gather"`` (the rows made whole).
    what : str
        The expression, as the script wrote it ("a sum over the rows (Sum)").
    where : str
        ``file:line`` of the script's line that made it, or ``""``.
    """

    def __init__(self, kind, what, where):
        self.kind, self.what, self.where = kind, what, where

    def describe(self):
        return "%s%s" % (self.what, " (%s)" % self.where if self.where else "")


class Refusal(Exception):
    """Rows meet where no conversion makes the one-process value (a random
    draw shaped like the batch that is not made for the whole batch)."""

    def __init__(self, node, why):
        super().__init__(why)
        self.node, self.why = node, why


class Strict(Exception):
    """A conversion the strict reading does not make (the value is MIXED)."""


def made_at(node):
    """``file:line`` of the script's line that made ``node``, or ``""``."""
    from tmpi_adapters.graphs.fixedbatch import made_at as variable_made_at
    if node is None:
        return ""
    for variable in node.outputs:
        at = variable_made_at(variable)
        if at:
            return at
    return ""


_KIND_WORDS = {"sum": "a sum over the batch's rows", "max": "a maximum over the batch's rows",
               "min": "a minimum over the batch's rows", "gather": "the batch's rows gathered",
               "stack": "each rank's moments of the batch's rows", "same": "a whole value"}


def what_is_made_whole(kind, what):
    """The words for a coupling: what is made whole and, where known, why."""
    text = _KIND_WORDS[kind]
    return text + " for %s" % what if what else text

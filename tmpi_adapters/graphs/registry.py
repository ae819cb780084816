"""The one registry of row rules, keyed by op class, and what a rule returns.

A rule reads one node: from its inputs' marks (:mod:`.marks`) it says what
each input must be made into first and what mark each output gets.  Rules
are registered by op class name with :func:`rule` (no import of Theano or
of a GPU backend is needed to register one; :mod:`.ops` registers them all
when imported, as the engine does) and looked up along the op's
class hierarchy (:func:`rule_for`), so that a subclass (a GPU op derived
from its CPU op, a user's op) meets its base's rule.  Families of ops share
one rule, registered under each of their names: the identities (the value
passes through, :mod:`.ops.elementwise`) and the row-wise ops of the
catalogue (:mod:`.ops.products`).

Most rules return a :class:`Signature`, the placement each input must take:

``KEEP``
    the input as the rank has it (its rows, its partial sum, a parameter);
:data:`~.marks.REPL`
    its one-process value on every rank (gathered or reduced by a collective
    where it is rows or partial: the engine makes the request);
:class:`~.marks.Shard` ``(k)``
    its rows on axis ``k``: its local value where it already is that, else
    cut from its whole value (a per-row weight kept whole);
:data:`~.marks.SHAPE`
    rebuilt from the global sizes (free);

and the engine (:class:`~.rows.Rows`) converts the inputs and applies the
node's op (or ``op``) to them.  A rule that builds other nodes returns the
marks and the converted outputs itself, ``(marks, forms)``.  A rule that
finds rows meeting where it cannot convert raises
:class:`~.pending.Strict` in the strict reading through the engine's
conversions, never by itself.
"""
from tmpi_adapters.graphs.marks import REPL, Mark

_RULES = {}
_FOUND = {}


class Keep(Mark):
    """The placement that takes an input as the rank has it (not a mark)."""

    __slots__ = ()


KEEP = Keep()


class Signature:
    """What a rule accepts and gives for one node.

    Parameters
    ----------
    inputs : list of placement
        One per input of the node (see the module doc).
    outputs : list of Mark
        One per output of the node.
    op : Op, optional
        The op to apply in place of the node's own (a convolution without
        the batch size it declares).
    what : str, optional
        Why inputs are made whole, in words (for the end-of-run line).
    """

    __slots__ = ("inputs", "outputs", "op", "what")

    def __init__(self, inputs, outputs, op=None, what=None):
        self.inputs, self.outputs, self.op, self.what = list(inputs), list(outputs), op, what

    def __repr__(self):
        return "Signature(%r -> %r)" % (self.inputs, self.outputs)


def whole(node, what=None):
    """Every input made whole; the node runs on the whole batch (its
    outputs the one-process values, on every rank)."""
    return Signature([REPL] * len(node.inputs), [REPL] * len(node.outputs), what=what)


def kept(node, marks):
    """Every input as the rank has it; the outputs get ``marks``."""
    return Signature([KEEP] * len(node.inputs), marks)


def rule(*names, sizes=True):
    """Register the decorated function as the rule of the ops named ``names``.

    ``sizes=False``: the rule reads its node even where every input is a size
    or computed from sizes alone (a shape, a draw, a batch normalisation);
    otherwise such a node is read by the sizes rule (:mod:`.ops.shapes`).
    """
    def register(function):
        for name in names:
            if name in _RULES:
                raise ValueError("two row rules for %s" % name)
            _RULES[name] = function
        function.sizes = sizes
        return function
    return register


def rule_for(op):
    """The rule of ``op``: that of the nearest class in its hierarchy with
    one, else ``None``."""
    kind = type(op)
    if kind not in _FOUND:
        _FOUND[kind] = next((_RULES[c.__name__] for c in kind.__mro__ if c.__name__ in _RULES),
                            None)
    return _FOUND[kind]


def registered():
    """The op class names that have a rule (once :mod:`.ops` is imported)."""
    return set(_RULES)

"""One ``theano.function`` call, as tmpi compiles it: what the script passed, in one object.

A :class:`Compilation` holds the call's bound arguments, its outputs as a
list (and how to give them back in the form the script wrote: one variable,
a list or tuple, ``theano.Out``), its updates as pairs (and the form the
script gave: a dict or pairs), and, once the graph is read, the function's
name.  Every step that compiles a function again (a
batch sliced, a step converted, a reshape rebuilt) hands it a new graph and
gets ``theano.function``'s arguments back from :meth:`Compilation.rebuilt`:
the one place that clones a function's graph and puts it back together.
Theano is imported when a method runs.
"""
from collections import OrderedDict


class Compilation:
    """One ``theano.function(*args, **kwargs)`` call (see the module doc).

    Parameters
    ----------
    bound : inspect.BoundArguments
        The call's arguments, bound to ``theano.function``'s signature.

    Attributes
    ----------
    output_list : list
        The outputs, each a variable or a ``theano.Out``.
    update_pairs : list of (SharedVariable, Variable)
        The updates (the script's; a training step adds the default updates
        its shared variables carry).
    key : str or None
        The function's name in messages, once known.
    """

    def __init__(self, bound):
        self.bound = bound
        outputs = bound.arguments.get("outputs")
        if outputs is None:
            self.output_list, self._form = [], None
        elif isinstance(outputs, (list, tuple)):
            self.output_list, self._form = list(outputs), type(outputs)
        else:
            self.output_list, self._form = [outputs], "single"
        self.updates = bound.arguments.get("updates")
        self.update_pairs = list(self.updates.items()) if hasattr(self.updates, "items") \
            else list(self.updates or [])
        self.key = None

    @property
    def arguments(self):
        """The call's arguments by name."""
        return self.bound.arguments

    @property
    def single(self):
        """True when the script asked for one output (not a list)."""
        return self._form == "single"

    def outputs_as_given(self, outputs):
        """``outputs`` (a list) in the form the script gave its outputs."""
        if self._form is None:
            return None
        if self._form == "single":
            return outputs[0]
        return self._form(outputs)

    @property
    def outputs(self):
        """The output variables (``theano.Out`` unwrapped)."""
        import theano
        return [o.variable if isinstance(o, theano.Out) else o for o in self.output_list]

    @property
    def graph(self):
        """The outputs, then the update expressions."""
        return self.outputs + [expr for _, expr in self.update_pairs]

    def with_outputs(self, output_list):
        """A compilation of the same call returning ``output_list`` instead."""
        import inspect
        bound = inspect.BoundArguments(self.bound.signature, dict(self.bound.arguments))
        bound.arguments["outputs"] = self.outputs_as_given(output_list)
        made = Compilation(bound)
        made.update_pairs, made.key = list(self.update_pairs), self.key
        return made

    def rebuilt(self, graph, givens=None):
        """``((inputs,), kwargs)`` for ``theano.function`` with ``graph`` (new
        outputs, then new update expressions, in :attr:`graph`'s order) in
        place of the call's, and ``givens`` swapped in where given."""
        import theano
        n = len(self.output_list)
        outputs = [theano.Out(new, borrow=old.borrow) if isinstance(old, theano.Out) else new
                   for old, new in zip(self.output_list, graph[:n])]
        updates = [(var, expr) for (var, _), expr in zip(self.update_pairs, graph[n:])]
        if hasattr(self.updates, "items"):
            updates = OrderedDict(updates)
        arguments = dict(self.bound.arguments)
        arguments["outputs"] = self.outputs_as_given(outputs)
        if "updates" in arguments or updates:
            arguments["updates"] = updates
        if givens is not None:
            arguments["givens"] = givens
        inputs = arguments.pop("inputs")
        return (inputs,), arguments

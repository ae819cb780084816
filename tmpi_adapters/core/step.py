"""The one exchange of a training step, built into its graph when the training
function is compiled.

A framework adapter finds a training function's marked gradients
(:mod:`tmpi_adapters.graphs.gradient`) and what its outputs are
(:mod:`tmpi_adapters.graphs.outputs`); :class:`StepExchange` replaces the
markers by one :class:`~tmpi_adapters.core.ops.FusedAllreduce` node (with
``--overlap``, by parts started during backpropagation and one node that
waits for them) that also carries the step's riders.  When the function
runs, the node calls :meth:`Session.exchange_gradients
<tmpi_adapters.core.session.Session.exchange_gradients>`.

Like the framework adapters that use it, this module imports Theano (the
Ops) only once a training function is compiled.
"""
import numpy as np

from tmpi_adapters.graphs import ancestors
from tmpi_adapters.graphs.terms import Differs, alike_terms

#: ``--overlap``'s largest part, in bytes of gradients, unless ``--bucket-bytes`` says.
OVERLAP_BUCKET_BYTES = 4 << 20


class StepExchange:
    """The one exchange of a training step: its gradients and riders.

    Riders are what else the step computes that the ranks must agree on,
    carried in the same message instead of exchanges of their own: scalar
    outputs that are means or sums over the batch (``--outputs averaged``),
    model state updated from the batch (BatchNorm statistics, averaged), the
    increments of accumulators (summed).  Only values computed without the
    gradients ride: those computed from the exchanged gradients are already
    the same on every rank.

    Terms of a gradient that every rank computes alike (a weight penalty's)
    do not travel when the rule reduces linearly: they are added to the
    exchanged sum of the others (:mod:`tmpi_adapters.graphs.terms`).
    """

    def __init__(self, session, key, markers, outputs, kinds, update_pairs, model,
                 marker_outputs, accumulators=()):
        from tmpi_adapters.core.ops import FusedAllreduce
        gradient_op = "sum" if session.options.loss_reduction == "sum" else "mean"
        arrays = [node.inputs[0] for node in markers]
        differs = self.differs(session, model)
        options = session.options
        # Weak scaling's learning-rate factor multiplies the exchanged gradients alone.
        scaled = options.scaling == "weak" and options.lr_scaling
        added = [None if differs is None or scaled else alike_terms(g, differs)
                 for g in arrays]
        arrays = [a if pair is None else pair[0] for a, pair in zip(arrays, added)]
        # A gradient with no term from the batch is the same on every rank: its
        # mean is itself, where a loss that sums would add it once per rank.
        ops = [gradient_op if differs is None or scaled or differs(a) else "mean"
               for a in arrays]
        self.carried = {}   # output index -> position in the exchange (or in self.outputs)
        self.states = {}    # id(updated variable) -> (position, accumulates)
        summed = []         # (output index, what every rank computes alike)
        if session.size > 1:
            def rides(expr):
                return not (set(ancestors([expr])) & marker_outputs)
            if session.options.outputs == "averaged":
                for i, (output, kind) in enumerate(zip(outputs, kinds)):
                    if kind in ("mean", "sum") and output.ndim == 0 and rides(output):
                        # A sum's penalty is counted once, not once per rank.
                        pair = alike_terms(output, differs) \
                            if kind == "sum" and differs is not None else None
                        self.carried[i] = len(arrays)
                        arrays.append(output if pair is None else pair[0])
                        ops.append(kind)
                        if pair is not None:
                            summed.append((i, pair[1]))
            sums = {id(v) for v in accumulators}
            state = {id(v) for v in model.model_state}
            for var, expr in update_pairs:
                if id(var) in sums and rides(expr):
                    self.states[id(var)] = (len(arrays), True)
                    arrays.append(expr - var)
                    ops.append("sum")
                elif id(var) in state and rides(expr):
                    self.states[id(var)] = (len(arrays), False)
                    arrays.append(expr)
                    ops.append("mean")
            model.averaged_state = [v for v in model.model_state if id(v) in self.states]
        if session.overlapping:
            self.outputs = self.parts(session, key, markers, arrays, ops)
        else:
            fused = FusedAllreduce(key, ops, gradients=len(markers),
                                   exchange=session.exchange_gradients,
                                   borrowed=session.size > 1)(*arrays)
            self.outputs = list(fused) if isinstance(fused, (list, tuple)) else [fused]
        #: the exchange's results, then the carried sums with their alike terms added
        for index, alike in summed:
            self.outputs.append(self.outputs[self.carried[index]] + alike)
            self.carried[index] = len(self.outputs) - 1
        self.replace = {node.outputs[0]: out if pair is None else out + pair[1]
                        for node, out, pair in zip(markers, self.outputs, added)}

    @staticmethod
    def parts(session, key, markers, arrays, ops):
        """``--overlap``: the exchange of ``arrays`` (the gradients of
        ``markers``, then the riders) as parts of at most ``--bucket-bytes``
        of gradients, filled from the last parameter back (the last layers'
        gradients exist first), the riders in the last part.  Every part
        starts as soon as its gradients exist; they are waited for once all
        have started, before any update.  Returns the results, in the order
        of ``arrays``."""
        from tmpi_adapters.core.ops import FinishExchange, StartExchange
        limit = session.options.bucket_bytes or OVERLAP_BUCKET_BYTES
        parts, current, size = [], [], 0
        for i in reversed(range(len(markers))):
            nbytes = _nbytes(markers[i].op.wrt, arrays[i].dtype)
            if current and size + nbytes > limit:
                parts.append(current)
                current, size = [], 0
            current.append(i)
            size += nbytes
        parts.append(current)
        riders = list(range(len(markers), len(arrays)))
        members = [sorted(part) + (riders if k == len(parts) - 1 else [])
                   for k, part in enumerate(parts)]
        token = None
        for k, (part, chosen) in enumerate(zip(parts, members)):
            start = StartExchange(key, [ops[i] for i in chosen], k, sorted(part),
                                  start=session.start_exchange)
            token = start(*([token] if k else []) + [arrays[i] for i in chosen])
        order = [i for chosen in members for i in chosen]
        finish = FinishExchange(key, [arrays[i].type for i in order],
                                finish=session.finish_exchange)(token)
        outputs = [None] * len(arrays)
        for i, result in zip(order, finish if isinstance(finish, (list, tuple)) else [finish]):
            outputs[i] = result
        return outputs

    @staticmethod
    def differs(session, model):
        """A :class:`~tmpi_adapters.graphs.terms.Differs` that knows ``model``'s
        parameters and state when terms every rank computes alike can stay out
        of the exchange (more than one rank, a rule that reduces linearly),
        else ``None``."""
        if session.size == 1 or not session.rule.reduces_linearly:
            return None
        return Differs(model.params + model.optimizer_state + model.model_state)

    def substitute(self, cloned, exchanged, n_outputs, updated):
        """The cloned outputs and update expressions, with what the exchange
        carried taken from its (cloned) results."""
        result = list(cloned)
        for index, position in self.carried.items():
            result[index] = exchanged[position]
        for k, var in enumerate(updated):
            found = self.states.get(id(var))
            if found is not None:
                position, accumulates = found
                result[n_outputs + k] = (var + exchanged[position]) if accumulates \
                    else exchanged[position]
        return result


def _nbytes(wrt, dtype):
    """Bytes of the gradient with respect to shared variable ``wrt``."""
    try:
        shape = wrt.get_value(borrow=True, return_internal_type=True).shape
    except Exception:   # not a shared variable: a guess is enough to make parts
        return 1 << 20
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize

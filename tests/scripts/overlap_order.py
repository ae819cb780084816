"""A 4-layer MLP whose forward and backward passes say when they run, for
``--overlap``'s order: each layer's output goes through a :class:`Mark`, an
identity whose gradient is a ``Mark`` too, so the step's log reads
``forward 1..4``, then ``backward 4..1``; the session's starts of the exchange's
parts and its wait for all of them are logged in the same list.

Trains 6 SGD steps (a momentum buffer and an L2 penalty included) of 16
rows of fixed data, prints ``final params`` and, on rank 0, ``order`` (the
events of the last step, space-separated).
"""
import numpy as np
import theano
import theano.tensor as T
from theano.gof import Apply, Op

EVENTS = []


class Mark(Op):
    __props__ = ("name",)

    def __init__(self, name):
        self.name = name

    def make_node(self, x):
        x = T.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def perform(self, node, inputs, output_storage):
        EVENTS.append(self.name)
        output_storage[0][0] = inputs[0].copy()

    def grad(self, inputs, output_grads):
        return [Mark(self.name.replace("forward", "backward"))(output_grads[0])]


def watch_exchange():
    """Log the session's starts and finishes (under ``tmpi wrap``)."""
    try:
        from tmpi_adapters.core.session import active_session
    except ImportError:
        return
    session = active_session()
    if session is None:
        return
    start, finish = session.start_exchange, session.finish_exchange

    def logged_start(arrays, **kwargs):
        EVENTS.append("start%d" % kwargs["part"])
        return start(arrays, **kwargs)

    def logged_finish(handles):
        EVENTS.append("finish")
        return finish(handles)
    session.start_exchange, session.finish_exchange = logged_start, logged_finish


watch_exchange()
rng = np.random.RandomState(5)
sizes = [12, 40, 40, 40, 4]
x_data = rng.normal(size=(96, sizes[0]))
y_data = rng.randint(0, sizes[-1], size=96).astype("int32")
x, y = T.dmatrix("x"), T.ivector("y")
params, velocities, h = [], [], x
for layer in range(4):
    W = theano.shared(rng.normal(scale=0.3, size=sizes[layer:layer + 2]), name="W%d" % layer)
    b = theano.shared(np.zeros(sizes[layer + 1]), name="b%d" % layer)
    params += [W, b]
    pre = T.dot(h, W) + b
    h = Mark("forward%d" % (layer + 1))(T.tanh(pre) if layer < 3 else pre)
probs = T.nnet.softmax(h)
cost = -T.log(probs)[T.arange(y.shape[0]), y].mean() + 1e-3 * sum((p ** 2).sum()
                                                                   for p in params[::2])
updates = []
for p, g in zip(params, T.grad(cost, params)):
    v = theano.shared(np.zeros_like(p.get_value()), name="v_" + p.name)
    updates += [(v, 0.9 * v - 0.1 * g), (p, p + 0.9 * v - 0.1 * g)]
train = theano.function([x, y], cost, updates=updates)
for step in range(6):
    del EVENTS[:]
    rows = slice(16 * step, 16 * (step + 1))
    value = train(x_data[rows], y_data[rows])
print("final cost %.15e" % value)
print("final params " + " ".join("%.15e" % (p.get_value() ** 2).sum() for p in params))
print("order " + " ".join(EVENTS))

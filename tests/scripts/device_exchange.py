"""A three-layer MLP on Theano's device, and what its training step exchanges.

Prints ``final losses ...`` and ``final norms ...`` (17 digits), then how the
compiled training function exchanges: how many of the gradients its
exchange node takes are device arrays, and how many reach it through a copy
to the host of their own.  Under ``tmpi wrap -n N`` on a device,
the exchange takes the gradients as device arrays (one fused copy each way,
made inside the node).
"""
import numpy as np
import theano
import theano.tensor as T

rng = np.random.RandomState(3)
floatX = theano.config.floatX
sizes = [(20, 32), (32, 16), (16, 5)]
params = []
for k, (n_in, n_out) in enumerate(sizes):
    params.append(theano.shared((0.3 * rng.standard_normal((n_in, n_out))).astype(floatX),
                                name="W%d" % k))
    params.append(theano.shared(np.zeros(n_out, dtype=floatX), name="b%d" % k))
x, y = T.matrix("x"), T.ivector("y")
h = x
for k in range(3):
    h = T.dot(h, params[2 * k]) + params[2 * k + 1]
    h = T.tanh(h) if k < 2 else h
cost = T.mean((h - T.extra_ops.to_one_hot(y, 5)) ** 2)
velocity = [theano.shared(np.zeros_like(p.get_value())) for p in params]
updates = []
for p, v, g in zip(params, velocity, T.grad(cost, params)):
    updates += [(v, 0.9 * v - 0.1 * g), (p, p + 0.9 * v - 0.1 * g)]
train = theano.function([x, y], cost, updates=updates)

data = rng.standard_normal((90, 20)).astype(floatX)
labels = rng.randint(0, 5, 90).astype("int32")
losses = [float(train(data[i:i + 30], labels[i:i + 30])) for _ in range(3) for i in (0, 30, 60)]
print("final losses %s" % " ".join("%.17g" % v for v in losses))
print("final norms %s" % " ".join("%.17g" % np.linalg.norm(p.get_value()) for p in params))
print("params %s" % sorted({type(p).__name__ for p in params}))

compiled = getattr(train, "fn", train)
nodes = compiled.maker.fgraph.toposort()
exchange = [n for n in nodes if type(n.op).__name__ == "FusedAllreduce"]
for node in exchange:
    gradients = node.inputs[:node.op.gradients]
    on_device = [v for v in gradients if type(v.type).__name__ == "GpuArrayType"]
    copied = [v for v in gradients if v.owner is not None
              and type(v.owner.op).__name__ == "HostFromGpu"]
    print("gradients on the device %d of %d" % (len(on_device), len(gradients)))
    print("gradients copied to the host one by one %d" % len(copied))
print("exchange nodes %d" % len(exchange))

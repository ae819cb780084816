"""Logistic regression in the deeplearning.net tutorial style: the dataset lives in
shared variables and the training function takes a minibatch index, slicing the
data through ``givens``."""
import numpy as np
import theano
import theano.tensor as T
from sklearn.datasets import load_digits

digits = load_digits()
X = (digits.data / 16.0).astype(theano.config.floatX)
Y = digits.target
train_x = theano.shared(X[:1500], borrow=True)
train_y = T.cast(theano.shared(Y[:1500].astype(theano.config.floatX), borrow=True), "int32")
valid_x = theano.shared(X[1500:], borrow=True)
valid_y = T.cast(theano.shared(Y[1500:].astype(theano.config.floatX), borrow=True), "int32")

index = T.lscalar()
x = T.matrix("x")
y = T.ivector("y")
W = theano.shared(np.zeros((64, 10), dtype=theano.config.floatX), name="W")
b = theano.shared(np.zeros((10,), dtype=theano.config.floatX), name="b")
p_y = T.nnet.softmax(T.dot(x, W) + b)
cost = -T.mean(T.log(p_y)[T.arange(y.shape[0]), y])
errors = T.mean(T.neq(T.argmax(p_y, axis=1), y))
g_W = T.grad(cost=cost, wrt=W)
g_b = T.grad(cost=cost, wrt=b)

batch_size = 70
train_model = theano.function(
    inputs=[index], outputs=cost,
    updates=[(W, W - 0.13 * g_W), (b, b - 0.13 * g_b)],
    givens={x: train_x[index * batch_size: (index + 1) * batch_size],
            y: train_y[index * batch_size: (index + 1) * batch_size]})
validate_model = theano.function([], errors, givens={x: valid_x, y: valid_y})

n_train_batches = 1500 // batch_size + 1   # the last batch is short (30 rows)
for epoch in range(5):
    costs = [train_model(i) for i in range(n_train_batches)]
    print("epoch %d cost %.6f validation error %.4f" % (epoch, np.mean(costs), validate_model()))
print("final cost %.17g error %.17g" % (np.mean(costs), validate_model()))
print("final norms %.17g %.17g" % (np.linalg.norm(W.get_value()), np.linalg.norm(b.get_value())))

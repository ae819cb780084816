"""Compiles and calls a function, but trains nothing."""
import numpy as np
import theano
import theano.tensor as T

x = T.vector("x")
double = theano.function([x], 2 * x)
print(double(np.arange(3.0)))

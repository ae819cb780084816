"""The Keras 2.3.1 (Theano backend) adapter."""

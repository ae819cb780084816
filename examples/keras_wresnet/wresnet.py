"""Wide Residual Networks (Zagoruyko & Komodakis, 2016) in plain Keras 2.

``wide_resnet(depth, width)`` builds WRN-d-k: a 3x3 convolution with 16
filters, three groups of ``(d - 4) / 6`` pre-activation residual blocks with
16k, 32k and 64k filters (the second and third groups start with stride 2),
then BatchNorm, ReLU, global average pooling and a softmax classifier.  Each
block is BN-ReLU-conv3x3-BN-ReLU-(dropout)-conv3x3 plus a shortcut, a 1x1
convolution where the shape changes.  WRN-28-10 is the paper's CIFAR model.
"""
from keras import backend as K
from keras.layers import (Activation, BatchNormalization, Conv2D, Dense, Dropout,
                          GlobalAveragePooling2D, Input, add)
from keras.models import Model
from keras.regularizers import l2


def _bn_relu(x, weight_decay):
    axis = 1 if K.image_data_format() == "channels_first" else -1
    # Theano's batch normalization rejects an epsilon that rounds below 1e-5.
    x = BatchNormalization(axis=axis, momentum=0.9, epsilon=1.001e-5,
                           gamma_regularizer=l2(weight_decay),
                           beta_regularizer=l2(weight_decay))(x)
    return Activation("relu")(x)


def _conv(x, filters, size, strides, weight_decay):
    return Conv2D(filters, size, strides=strides, padding="same", use_bias=False,
                  kernel_initializer="he_normal", kernel_regularizer=l2(weight_decay))(x)


def _block(x, filters, strides, dropout, weight_decay):
    """One pre-activation residual block with ``filters`` output channels."""
    axis = 1 if K.image_data_format() == "channels_first" else -1
    same_shape = K.int_shape(x)[axis] == filters and strides == 1
    activated = _bn_relu(x, weight_decay)
    y = _conv(activated, filters, 3, strides, weight_decay)
    y = _bn_relu(y, weight_decay)
    if dropout > 0:
        y = Dropout(dropout)(y)
    y = _conv(y, filters, 3, 1, weight_decay)
    # The paper's projection shortcut reads the activated input, like the block.
    shortcut = x if same_shape else _conv(activated, filters, 1, strides, weight_decay)
    return add([y, shortcut])


def wide_resnet(depth=28, width=10, input_shape=(3, 32, 32), classes=10, dropout=0.0,
                weight_decay=5e-4):
    """WRN-``depth``-``width`` as an (uncompiled) Keras ``Model``.

    Parameters
    ----------
    depth : int
        Total depth d; ``(d - 4)`` must be a multiple of 6 (10, 16, 22, 28, 40...).
    width : int
        Widening factor k.
    input_shape : tuple of int
        One image, in Keras' ``image_data_format`` order.
    classes : int
    dropout : float
        Dropout between the two convolutions of each block (0.3 in the paper's
        dropout variant).
    weight_decay : float
        L2 penalty on every convolution, BatchNorm and dense weight.
    """
    if depth < 10 or (depth - 4) % 6:
        raise ValueError("WRN depth must be 6n + 4 with n >= 1 (10, 16, 22, 28, 40, ...), "
                         "not %d" % depth)
    blocks = (depth - 4) // 6
    inputs = Input(shape=input_shape)
    x = _conv(inputs, 16, 3, 1, weight_decay)
    for group, filters in enumerate((16 * width, 32 * width, 64 * width)):
        for i in range(blocks):
            strides = 2 if group > 0 and i == 0 else 1
            x = _block(x, filters, strides, dropout, weight_decay)
    x = _bn_relu(x, weight_decay)
    x = GlobalAveragePooling2D()(x)
    outputs = Dense(classes, activation="softmax", kernel_regularizer=l2(weight_decay),
                    bias_regularizer=l2(weight_decay))(x)
    return Model(inputs, outputs, name="wrn_%d_%d" % (depth, width))

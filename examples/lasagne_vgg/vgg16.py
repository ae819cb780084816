"""VGG-16 in Lasagne: configuration D of Simonyan & Zisserman, "Very Deep
Convolutional Networks for Large-Scale Image Recognition" (ICLR 2015).

Thirteen 3x3 convolutions (stride 1, padding 1, ReLU) in five stages, each
stage ending in 2x2 max-pooling, then three fully connected layers, the first
two with 4096 units and dropout 0.5, the last with one unit per class and a
softmax.  The network is a dict of named layers (``net['conv3_2']``,
``net['fc7']``, ``net['prob']``), the usual way Lasagne models are written.

Three knobs shrink it without changing its shape of thought, for small
images and for tests:

``width``    multiplies every convolution's filter count (1.0 = the paper's);
``stages``   keeps only the first 1-5 convolution stages;
``fc_units`` the size of fc6 and fc7 (4096 in the paper).
"""
from collections import OrderedDict

import lasagne
from lasagne.layers import (Conv2DLayer, DenseLayer, DropoutLayer, InputLayer,
                            MaxPool2DLayer, NonlinearityLayer)
from lasagne.nonlinearities import rectify, softmax

#: Filters of each convolution, stage by stage (configuration D).
CONFIG_D = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))


def check_config(image_size, stages, width):
    """Raise ValueError when the knobs cannot make a network for ``image_size``."""
    if not 1 <= stages <= len(CONFIG_D):
        raise ValueError("stages must be between 1 and %d, not %d" % (len(CONFIG_D), stages))
    if width <= 0:
        raise ValueError("width must be positive, not %g" % width)
    smallest = 2 ** stages
    if image_size < smallest:
        raise ValueError("%d convolution stages halve the image %d times: images must be at "
                         "least %dx%d pixels, not %dx%d" % (stages, stages, smallest, smallest,
                                                             image_size, image_size))


def build_model(input_shape=(None, 3, 224, 224), classes=1000, width=1.0, stages=5,
                fc_units=4096, dropout=0.5, input_var=None):
    """Build VGG-16 (configuration D).

    Parameters
    ----------
    input_shape : tuple
        ``(batch, channels, height, width)``; keep the batch ``None`` so any
        batch size (and tmpi's split batches) fit.
    classes : int
        Units of fc8.
    width : float
        Multiplier of every convolution's filter count.
    stages : int
        How many of the five convolution stages to keep.
    fc_units : int
        Units of fc6 and fc7.
    dropout : float
        Dropout probability after fc6 and fc7.
    input_var : theano tensor4, optional

    Returns
    -------
    OrderedDict
        Layers by name, from ``'input'`` to ``'prob'`` (the softmax output).
    """
    check_config(min(input_shape[2:]), stages, width)
    net = OrderedDict()
    net['input'] = layer = InputLayer(input_shape, input_var=input_var)
    for stage, filters in enumerate(CONFIG_D[:stages], 1):
        for i, count in enumerate(filters, 1):
            name = 'conv%d_%d' % (stage, i)
            net[name] = layer = Conv2DLayer(layer, max(1, int(round(count * width))), 3,
                                            pad=1, nonlinearity=rectify, name=name)
        net['pool%d' % stage] = layer = MaxPool2DLayer(layer, 2)
    for name in ('fc6', 'fc7'):
        net[name] = layer = DenseLayer(layer, fc_units, nonlinearity=rectify, name=name)
        net[name + '_dropout'] = layer = DropoutLayer(layer, p=dropout)
    net['fc8'] = DenseLayer(layer, classes, nonlinearity=None, name='fc8')
    net['prob'] = NonlinearityLayer(net['fc8'], softmax)
    return net


def count_params(net):
    """Trainable parameter count of the network."""
    return lasagne.layers.count_params(net['prob'], trainable=True)

"""The ops the graph analysis knows by name, in one catalogue, and how an op is looked up.

Every part of :mod:`tmpi_adapters.graphs` that decides by op (the row rules,
the sizes, the reshape and convolution decisions) reads these tables through
:func:`name_of`, which walks the op's class hierarchy: a subclass (a GPU op
that derives from its CPU op, a user's op derived from Theano's) meets its
base's entry.  Theano is not imported here.
"""

#: Ops that work on each row of their inputs' axis 0 alone: which of their
#: inputs hold the rows (the others are parameters, sizes).  Their row
#: inputs' axes 0 are one axis (:mod:`.sizes`).
ROW_OPS = {"Softmax": (0,), "SoftmaxWithBias": (0,), "LogSoftmax": (0,),
           "SoftmaxGrad": (0, 1), "LogSoftmaxGrad": (0, 1),
           "CrossentropyCategorical1Hot": (0, 1), "CrossentropyCategorical1HotGrad": (0, 1, 2),
           "CrossentropySoftmaxArgmax1HotWithBias": (0, 2),
           "CrossentropySoftmax1HotWithBiasDx": (0, 1, 2),
           "Prepend_scalar_constant_to_each_row": (0,), "Prepend_scalar_to_each_row": (1,),
           "Pool": (0,), "MaxPoolGrad": (0, 1, 2), "AveragePoolGrad": (0, 1),
           "DownsampleFactorMaxGradGrad": (0, 1, 2), "DownsampleFactorMax": (0,),
           "BatchedDot": (0, 1), "AbstractConv2d": (0,), "AbstractConv3d": (0,),
           "AbstractConv": (0,), "ConvOp": (0,), "CorrMM": (0,), "Corr3dMM": (0,),
           "AbstractConv2d_gradInputs": (1,), "AbstractConv3d_gradInputs": (1,),
           "AbstractConv_gradInputs": (1,)}
#: Ops whose one output is their first input (for the values tmpi reads).
IDENTITIES = {"Rebroadcast", "ViewOp", "DeepCopyOp", "OutputGuard", "DisconnectedGrad",
              "GradClip", "GradScale", "ZeroGrad", "Assert", "HostFromGpu", "GpuFromHost",
              "GpuContiguous", "SpecifyShape", "ConsiderConstant", "Identity"}
#: Convolutions: ``(input, filters)`` forward, and their gradients.
CONVS = {"AbstractConv2d", "AbstractConv3d", "AbstractConv", "ConvOp", "CorrMM", "Corr3dMM"}
CONV_GRAD_INPUTS = {"AbstractConv2d_gradInputs", "AbstractConv3d_gradInputs",
                    "AbstractConv_gradInputs"}
CONV_GRAD_WEIGHTS = {"AbstractConv2d_gradWeights", "AbstractConv3d_gradWeights",
                     "AbstractConv_gradWeights"}
#: Convolutions that declare the batch size they were built for (``imshp[0]``):
#: a rank's share runs them with it dropped (:mod:`.fixedbatch`).
DECLARE_BATCH = {"AbstractConv2d", "AbstractConv3d", "AbstractConv2d_gradWeights",
                 "AbstractConv2d_gradInputs", "AbstractConv3d_gradWeights",
                 "AbstractConv3d_gradInputs"}
#: Batch normalisation ops, read as the graphs Theano's own optimizer makes of them.
BATCH_NORMS = {"AbstractBatchNormTrain", "AbstractBatchNormTrainGrad",
               "AbstractBatchNormInference"}

#: Ops that read sizes: a value's shape, one of its lengths, positions 0..n.
SIZES = {"Shape", "Shape_i", "ARange"}
#: Ops the rules read by their own name (a subclass is read as its base).
NAMED = {"Subtensor", "Elemwise", "Reshape", "Alloc", "Join", "IfElse", "Scan"}

#: Every name some table holds.
KNOWN = frozenset().union(ROW_OPS, IDENTITIES, CONVS, CONV_GRAD_INPUTS, CONV_GRAD_WEIGHTS,
                          DECLARE_BATCH, BATCH_NORMS, SIZES, NAMED)

_names = {}


def name_of(op):
    """The catalogue's name for ``op``: that of the nearest class in its
    hierarchy that the catalogue knows, else its own class's name."""
    kind = type(op)
    found = _names.get(kind)
    if found is None:
        found = next((c.__name__ for c in kind.__mro__ if c.__name__ in KNOWN), kind.__name__)
        _names[kind] = found
    return found

"""Each rank its own random numbers: Keras' MRG streams jumped ahead by rank.

Every rank builds the same Keras model from the same seed, so its MRG31k3p
random streams (dropout masks, Gaussian noise) start alike: without a jump,
rank r's i-th row would get the same dropout mask as rank 0's i-th row.
"""
import numpy as np

from tmpi_adapters.core.graph import ancestors


def decorrelate_random_streams(outputs, rank):
    """Give each rank its own random numbers (dropout masks, noise).

    Every MRG random state the ``outputs`` (a compiled function's output
    variables) draw from is jumped ahead by ``rank * 2**134`` draws (MRG31k3p's
    own stream spacing); rank 0 keeps the one-process streams.
    """
    if rank == 0:
        return
    from theano.sandbox import rng_mrg
    seen = set()
    for variable in ancestors(list(outputs)):
        update = getattr(variable, "default_update", None)
        owner = getattr(update, "owner", None)
        if owner is None or not isinstance(owner.op, rng_mrg.mrg_uniform_base):
            continue
        if id(variable) in seen:
            continue
        seen.add(id(variable))
        variable.set_value(jump_streams(variable.get_value(), rank))


def jump_streams(states, times):
    """MRG31k3p states (int32, shape (n_streams, 6)) advanced ``times`` * 2**134 draws."""
    from theano.sandbox import rng_mrg
    states = np.array(states, dtype=np.int64, copy=True)
    for columns, jump, modulus in ((slice(0, 3), rng_mrg.A1p134, rng_mrg.M1),
                                   (slice(3, 6), rng_mrg.A2p134, rng_mrg.M2)):
        jump, modulus = np.asarray(jump, dtype=np.int64), np.int64(modulus)
        part = states[:, columns]
        for _ in range(times):
            # Row-wise jump @ state (mod m); every product stays below 2**62.
            part = ((part[:, None, :] * jump[None, :, :]) % modulus).sum(axis=2) % modulus
        states[:, columns] = part
    return states.astype(np.int32)

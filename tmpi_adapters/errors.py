"""Errors tmpi reports to the user as a paragraph, never as a deep traceback."""


class TmpiError(Exception):
    """A problem the user can fix; ``str(error)`` says what to do next.

    The CLI prints it as ``tmpi: error: <message>`` and exits with
    :attr:`exit_code`.
    """

    exit_code = 2


class ConfigError(TmpiError):
    """A bad option or configuration value."""


class MismatchError(TmpiError):
    """Ranks disagree about the model (parameter names, shapes, dtypes, order)."""

    exit_code = 3


class StallError(TmpiError):
    """Ranks waited on a collective that others did not reach in time."""

    exit_code = 4


class NonFiniteError(TmpiError):
    """NaN or Inf found in gradients or parameters at the exchange."""

    exit_code = 5


class CheckpointError(TmpiError):
    """A checkpoint is missing, corrupt, or belongs to another model or run."""

    exit_code = 6


class LockstepError(TmpiError):
    """Ranks under a lockstep rule issued different collectives (another
    function, call, batch size or phase): their exchange cannot be trusted."""

    exit_code = 7


class DeviceError(TmpiError):
    """``--require-device``: a device ``THEANO_FLAGS`` names that Theano
    could not open on some rank (it would compute on the CPU)."""

    exit_code = 8

"""Never a silent CPU: a device ``THEANO_FLAGS`` names that Theano could not open.

Theano's GPU backend that cannot open its device (pygpu missing or too old,
no CUDA driver, a device number that does not exist) logs one ``ERROR`` and
computes on the CPU; the run would then train there as if nothing happened.
A built-in plugin: when the session starts, before the script runs, every
rank that asked for a device says what it got
(:func:`~tmpi_adapters.process.devices.opened`; one small collective, only
where a device was asked for), and rank 0 prints one ``tmpi: warning:`` line
naming the device, the ranks on the CPU, Theano's reason and ``make gpu``;
``--record`` keeps it (a ``warning`` record after the ``run`` header).  With
``--require-device`` every rank stops instead, with
:class:`~tmpi_adapters.errors.DeviceError` (exit status 8).
"""
import os
import sys

from tmpi_adapters.errors import DeviceError
from tmpi_adapters.exchangers.envelope import Envelope
from tmpi_adapters.pluginmanager import hookimpl
from tmpi_adapters.process import devices


@hookimpl
def tmpi_add_arguments(parser):
    parser.add_argument("--require-device", action="store_true", default=None,
                        help="stop with exit status 8, before the script runs, when "
                             "THEANO_FLAGS names a device (cuda, cudaN, openclN:M) that "
                             "Theano could not open on some rank (default: one warning, "
                             "and those ranks train on the CPU)")


@hookimpl(tryfirst=True)
def tmpi_session_start(session):
    """Before the recording plugin writes its header and before the script runs."""
    devices.notice = None
    required = bool((session.options.extra or {}).get("require_device"))
    mine = devices.opened()
    if mine[0] is None and required:
        raise DeviceError("--require-device, but THEANO_FLAGS names no device (Theano's "
                          "device is %s): set device=cuda, cuda0 or opencl0:0 in THEANO_FLAGS, "
                          "or leave out --require-device" % mine[1])
    if mine[0] is None and not asks_for_a_device():
        return  # a CPU run, as on every rank: nothing to gather
    if session.size > 1:
        with session.exchanger.enveloped(Envelope("device", "the check of each rank's device")):
            found = session.exchanger.allgather_object(mine)
    else:
        found = [mine]
    if required and devices.fallback_ranks(found):
        raise DeviceError(devices.fallback_line(found, required=True))
    line = devices.fallback_line(found)
    if line is None:
        return
    devices.notice = {"type": "warning", "about": "device", "text": "tmpi: " + line,
                      "asked": [f[0] for f in found], "devices": [f[1] for f in found],
                      "ranks_on_cpu": devices.fallback_ranks(found),
                      "reasons": [f[2] for f in found]}
    session.print("tmpi: " + line, file=sys.stderr)


def asks_for_a_device():
    """Whether this job's ranks may have asked for a device: every rank
    reads the same ``THEANO_FLAGS`` and Theano-MPI ``DEVICES`` list, so every
    rank takes part in the check or none does."""
    flag = devices.device_flag(os.environ.get("THEANO_FLAGS"))
    return bool(flag and flag.startswith(devices.DEVICE_PREFIXES)) or \
        bool(os.environ.get(devices.DEVICES_ENV))

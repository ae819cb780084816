"""The exchange half of `tmpi bench`, run on every rank under ``mpiexec``.

``python -m tmpi_adapters.bench.exchange --json OUT [--width W] [--repetitions R]
[--model alexnet|wide] [--cases NAME,...] [--latency]``

Reduces the gradients of a whole model (AlexNet's parameter shapes, channel
widths scaled by ``--width``, or the wide conv net of
:mod:`tmpi_adapters.bench.models`) in every way side by side (or the
``--cases`` named), repetition after repetition so that a noisy machine
slows all of them alike:

``raw_allreduce``            one mpi4py ``Allreduce(send, recv)`` of one flat
                             float32 buffer of the same byte size (the floor);
``raw_allreduce_in_place``   the same with ``MPI.IN_PLACE``;
``fused``                    :meth:`MPIExchanger.allreduce` of the model's
                             gradients as a training step does it (weighted
                             mean, borrowed results), fp32;
``fused_mpi_algorithm``      the same, every bucket through MPI's Allreduce;
``fused_copy_out``           the same, results copied into other arrays;
``per_parameter``            one ``Allreduce`` per gradient (Theano-MPI's way);
``fused_fp16``/``fused_bf16``  fp16/bf16 transfer, float32 sums;
``torch_gloo``               ``torch.distributed.all_reduce`` (gloo) of one flat
                             float32 tensor, where torch is importable.

Beside them, the ring-allreduce floor ``2(N-1)/N * bytes / bandwidth`` with the
bandwidth of one ring step (``Sendrecv`` of ``bytes/N``) measured in the same
run, and with ``--latency`` the one-way latency of a small message (half a
ping-pong's round trip).  Rank 0 writes the medians and every sample as JSON.
"""
import argparse
import socket
import statistics
import time

import numpy as np

import tmpi_adapters  # noqa: F401 - applies the shims and thread settings
from tmpi_adapters.bench.runs import write_result

#: AlexNet's layers (single tower): (output channels or units, input, kernel).
_ALEXNET = (("conv1", 96, 3, 11), ("conv2", 256, 96, 5), ("conv3", 384, 256, 3),
            ("conv4", 384, 384, 3), ("conv5", 256, 384, 3),
            ("fc6", 4096, 256 * 6 * 6, None), ("fc7", 4096, 4096, None),
            ("fc8", 1000, 4096, None))


def alexnet_shapes(width=1.0):
    """Parameter shapes of AlexNet with every width multiplied by ``width``
    (62.4 M parameters, 250 MB of float32 at width 1)."""
    def scale(c):
        return max(1, int(round(c * width)))
    shapes, previous = [], 3
    for name, units, _, kernel in _ALEXNET:
        out = units if name == "fc8" else scale(units)
        if kernel:
            shapes.append((out, previous, kernel, kernel))
        else:
            fan_in = previous * 36 if name == "fc6" else previous
            shapes.append((fan_in, out))
        shapes.append((out,))
        previous = out
    return shapes


def model_shapes(model, width):
    """The gradients' shapes of ``model`` (``alexnet`` at ``width``, or ``wide``)."""
    if model == "wide":
        from tmpi_adapters.bench.models import MODELS, convnet_shapes
        return convnet_shapes(MODELS["wide"][2])
    return alexnet_shapes(width)


def one_way_latency(comm, repetitions=200):
    """``(min, median)`` seconds of half a ping-pong of 8 bytes between ranks 0 and 1."""
    rank = comm.Get_rank()
    buf = np.zeros(8, dtype=np.uint8)
    samples = []
    comm.Barrier()
    for _ in range(repetitions + 20):
        start = time.perf_counter()
        if rank == 0:
            comm.Send(buf, 1, 7)
            comm.Recv(buf, 1, 7)
        elif rank == 1:
            comm.Recv(buf, 0, 7)
            comm.Send(buf, 0, 7)
        samples.append((time.perf_counter() - start) / 2)
    samples = comm.bcast(samples[20:], root=0)
    return min(samples), statistics.median(samples)


def ring_step_seconds(comm, nbytes, repetitions):
    """Median seconds of one ring step: send ``nbytes`` right, receive from the left."""
    from mpi4py import MPI
    size, rank = comm.Get_size(), comm.Get_rank()
    send = np.ones(max(1, nbytes // 4), dtype=np.float32)
    recv = np.empty_like(send)
    samples = []
    for _ in range(repetitions + 1):
        comm.Barrier()
        start = time.perf_counter()
        comm.Sendrecv(send, dest=(rank + 1) % size, recvbuf=recv, source=(rank - 1) % size)
        samples.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return statistics.median(samples[1:])


class Case:
    """One way of reducing the gradients: ``run()``, and the exchanger whose
    wire time it reports (``None`` for the raw calls)."""

    def __init__(self, run, exchanger=None):
        self.run = run
        self.exchanger = exchanger


class Cases:
    """The gradients of one model and every way of reducing them."""

    def __init__(self, comm, shapes, skip_torch=False):
        from mpi4py import MPI
        from tmpi_adapters.exchangers.mpi import MPIExchanger
        self.MPI, self.comm = MPI, comm
        rng = np.random.RandomState(comm.Get_rank())
        self.grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        self.nbytes = sum(g.nbytes for g in self.grads)
        self.flat = np.concatenate([g.reshape(-1) for g in self.grads])
        self.flat_out = np.empty_like(self.flat)
        self.outs = [np.empty_like(g) for g in self.grads]
        self.exchanger = MPIExchanger(comm)
        self.mpi_algorithm = MPIExchanger(comm, algorithm="allreduce")
        self.torch = None if skip_torch else TorchPeer.start(comm, self.flat_out)
        self.torch_skipped = "--no-torch" if skip_torch else TorchPeer.why_not

    def _fused(self, exchanger, precision=None):
        def run():
            # As in a training step: weighted mean, results borrowed.
            with exchanger.borrowing():
                exchanger.allreduce(self.grads, op="mean", weight=64, precision=precision)
        return Case(run, exchanger)

    def _copy_out(self):
        self.exchanger.allreduce(self.grads, op="mean", weight=64, out=self.outs)

    def _per_parameter(self):
        for g, o in zip(self.grads, self.outs):
            self.comm.Allreduce(g, o, op=self.MPI.SUM)

    def table(self):
        """``{name: Case}`` in the order they run in each repetition."""
        MPI, comm = self.MPI, self.comm
        cases = {
            "raw_allreduce": Case(lambda: comm.Allreduce(self.flat, self.flat_out, op=MPI.SUM)),
            "raw_allreduce_in_place": Case(
                lambda: comm.Allreduce(MPI.IN_PLACE, self.flat_out, op=MPI.SUM)),
            "fused": self._fused(self.exchanger),
            "fused_mpi_algorithm": self._fused(self.mpi_algorithm),
            "fused_copy_out": Case(self._copy_out, self.exchanger),
            "per_parameter": Case(self._per_parameter),
            "fused_fp16": self._fused(self.exchanger, "fp16"),
            "fused_bf16": self._fused(self.exchanger, "bf16"),
        }
        if self.torch is not None:
            cases["torch_gloo"] = Case(self.torch.allreduce)
        return cases


class TorchPeer:
    """The same flat allreduce through ``torch.distributed`` (gloo)."""

    why_not = None

    @classmethod
    def start(cls, comm, flat):
        try:
            import torch
            import torch.distributed as dist
        except ImportError:
            cls.why_not = "torch is not installed (pip install torch==2.13.0 to compare)"
            return None
        port = None
        if comm.Get_rank() == 0:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
        port = comm.bcast(port, root=0)
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                                rank=comm.Get_rank(), world_size=comm.Get_size())
        peer = cls()
        peer.torch, peer.dist = torch, dist
        peer.tensor = torch.from_numpy(flat)  # shares the buffer: no copy
        peer.version = torch.__version__
        return peer

    def allreduce(self):
        self.dist.all_reduce(self.tensor)

    def close(self):
        self.dist.destroy_process_group()


def measure(cases, comm, repetitions):
    """Seconds per repetition of every case, and the wire seconds of the fused ones.

    Every case runs once per repetition, in turn, so that a noisy machine
    slows all of them alike.  Each sample is the slowest rank's time after a
    barrier.  A first, untimed repetition allocates and warms the buffers.
    """
    from mpi4py import MPI
    samples = {name: [] for name in cases}
    wire = {name: [] for name in cases if cases[name].exchanger is not None}
    for rep in range(repetitions + 1):
        for name, case in cases.items():
            if case.exchanger is not None:
                case.exchanger.stats.take()
            comm.Barrier()
            start = time.perf_counter()
            case.run()
            seconds = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
            if rep:
                samples[name].append(seconds)
                if case.exchanger is not None:
                    wire[name].append(comm.allreduce(
                        case.exchanger.stats.take()["transfer_s"], op=MPI.MAX))
    return samples, wire


def summarize(samples, wire, nbytes, size, ring_step_s):
    """Medians, ratios and floors of one run (seconds).

    The bandwidth is one ring step's: ``bytes / N`` sent while as many are
    received.  A ring allreduce takes ``2(N-1)`` such steps, its floor.
    """
    median = {name: statistics.median(values) for name, values in samples.items()}
    wire_median = {name: statistics.median(v) for name, v in wire.items() if v}
    bandwidth = (nbytes / size) / ring_step_s if ring_step_s > 0 else None
    floor = 2.0 * (size - 1) * ring_step_s
    def ratio(a, b, table=samples):
        # Per repetition, then the median: the cases of one repetition ran
        # back to back, under the same load.
        return statistics.median(x / y for x, y in zip(table[a], table[b]))

    pairs = {
        "fused_over_raw_allreduce": ("fused", "raw_allreduce"),
        "fused_over_raw_allreduce_in_place": ("fused", "raw_allreduce_in_place"),
        "fused_mpi_algorithm_over_raw_allreduce": ("fused_mpi_algorithm", "raw_allreduce"),
        "per_parameter_over_fused": ("per_parameter", "fused"),
        "fp16_over_fp32": ("fused_fp16", "fused"),
        "bf16_over_fp32": ("fused_bf16", "fused"),
        "torch_gloo_over_fused": ("torch_gloo", "fused"),
    }
    ratios = {key: ratio(a, b) for key, (a, b) in pairs.items()
              if a in samples and b in samples}
    if "fused" in median and floor > 0:
        ratios["fused_over_ring_floor"] = median["fused"] / floor
    if wire.get("fused") and min(wire["fused"]) > 0:
        for fmt in ("fp16", "bf16"):
            if wire.get("fused_" + fmt):
                ratios["%s_over_fp32_wire" % fmt] = ratio("fused_" + fmt, "fused", wire)
    return {
        "median_s": median,
        "wire_median_s": wire_median,
        "ring_step_s": ring_step_s,
        "bandwidth_bytes_per_s": bandwidth,
        "ring_floor_s": {"fp32": floor, "fp16": floor / 2.0, "bf16": floor / 2.0},
        "ratios": ratios,
        "samples_s": samples,
        "wire_samples_s": wire,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True, help="where rank 0 writes the results")
    parser.add_argument("--width", type=float, default=1.0,
                        help="AlexNet width multiplier (1: 250 MB of gradients)")
    parser.add_argument("--repetitions", type=int, default=9)
    parser.add_argument("--model", choices=("alexnet", "wide"), default="alexnet",
                        help="whose gradients: AlexNet's (at --width) or the wide conv net's")
    parser.add_argument("--cases", help="only these cases, comma-separated (default: all)")
    parser.add_argument("--latency", action="store_true",
                        help="also measure the one-way latency of a small message")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch peer")
    args = parser.parse_args(argv)
    from mpi4py import MPI
    from tmpi_adapters.exchangers import codecs
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    shapes = model_shapes(args.model, args.width)
    wanted = args.cases.split(",") if args.cases else None
    cases = Cases(comm, shapes, skip_torch=args.no_torch or (
        wanted is not None and "torch_gloo" not in wanted))
    table = {name: case for name, case in cases.table().items()
             if wanted is None or name in wanted}
    latency = one_way_latency(comm) if args.latency and size > 1 else None
    ring_step = ring_step_seconds(comm, cases.nbytes // size, max(3, args.repetitions))
    samples, wire = measure(table, comm, args.repetitions)
    result = summarize(samples, wire, cases.nbytes, size, ring_step)
    if latency is not None:
        result["latency_s"] = {"min": latency[0], "median": latency[1]}
    result.update({
        "ranks": size,
        "model": ("the wide conv net's parameter shapes" if args.model == "wide"
                  else "AlexNet parameter shapes, width %g" % args.width),
        "arrays": len(shapes),
        "parameters": int(sum(np.prod(s) for s in shapes)),
        "bytes": cases.nbytes,
        "repetitions": args.repetitions,
        "conversion_kernels": codecs.backend(),
        "algorithm": cases.exchanger.algorithm,
        "torch": (cases.torch.version if cases.torch is not None
                  else {"skipped": cases.torch_skipped}),
        "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
    })
    if cases.torch is not None:
        cases.torch.close()
    if rank == 0:
        write_result(args.json, result)


if __name__ == "__main__":
    main()

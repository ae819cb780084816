"""GPU models distributed for real, on Theano's GPU backend.

Every test here runs where Theano's GPU backend has a device: on a CUDA GPU,
or on the OpenCL device ``make gpu`` sets up on the CPU (pocl), which gives
the very types and graphs a CUDA GPU gets (``GpuArraySharedVariable``
parameters, ``GpuArrayVariable`` gradients, ``GpuFromHost``/``HostFromGpu``),
and float64, so N ranks compare with one tightly.  Where no device is set up
they skip, naming ``make gpu``.  ``TMPI_TEST_DEVICE`` picks another device
(``cuda0`` on a GPU machine, as ``tools/gpu-check.sh`` runs them; an OpenCL
device gets the flags ``make gpu`` wrote for it); those OpenCL flags are the
default.

The choice of each rank's device is plain Python and runs everywhere.
"""
import functools
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import (EXAMPLES, ROOT, SCRIPTS, TMPI, assert_close, check, final_numbers,
                      rank_env, run, tmpi)
from tmpi_adapters.process import devices

OPENCL_FLAGS = Path(sys.prefix) / "opencl-theano-flags"
HAVE_BLOCKS = all(importlib.util.find_spec(m) is not None for m in ("blocks", "fuel"))


@functools.lru_cache(maxsize=None)
def device_flags():
    """``(THEANO_FLAGS for the device, None)``, or ``(None, why not)``."""
    chosen = os.environ.get("TMPI_TEST_DEVICE")
    if chosen and chosen.startswith("opencl") and OPENCL_FLAGS.is_file():
        # The flags `make gpu` wrote keep the ops pocl cannot run on the host.
        flags = devices.with_device(OPENCL_FLAGS.read_text().strip(), chosen)
    elif chosen:
        flags = "device=" + chosen
    elif OPENCL_FLAGS.is_file():
        flags = OPENCL_FLAGS.read_text().strip()
    else:
        return None, "no GPU device is set up here: run `make gpu` (OpenCL on the CPU with apt)"
    if importlib.util.find_spec("pygpu") is None:
        if sys.version_info >= (3, 12):
            return None, ("pygpu is not installed in this Python %d.%d venv: `make gpu "
                          "LIBGPUARRAY_SRC=...` builds it (Debian's pygpu, which `make gpu` "
                          "takes with apt, is built for Python 3.11)" % sys.version_info[:2])
        return None, "pygpu is not installed: run `make gpu`"
    import pygpu
    device = devices.device_flag(flags)
    try:
        pygpu.init(device or "opencl0:0")
    except Exception as error:  # noqa: BLE001 - the reason to skip
        return None, "Theano's device %s cannot be opened (%s): run `make gpu`" % (device, error)
    return flags, None


def device_env(**extra):
    flags, why = device_flags()
    if flags is None:
        pytest.skip(why)
    env = rank_env("float64", **extra)
    env["THEANO_FLAGS"] += "," + flags
    return env


def wrap(n, *args, env=None):
    return check(tmpi("wrap", "-n", str(n), *[str(a) for a in args],
                      env=env or device_env()))


def same(result, reference, keys, rtol=1e-10):
    for key in keys:
        assert_close(final_numbers(result.stdout, key), final_numbers(reference.stdout, key),
                     rtol)


def distributed_on_the_device(result, n):
    """The run distributed its training on ``n`` ranks, each on the device."""
    assert "nothing was distributed" not in result.stderr + result.stdout
    assert "trained no" not in result.stderr + result.stdout
    summary = [line for line in result.stdout.splitlines() if line.startswith("tmpi: ")][-1]
    assert "on %d rank(s)" % n in summary
    assert ("every rank on " if n > 1 else "; device ") + devices.device_flag(
        device_flags()[0]) in summary, summary


# ------------------------------------------------------------------ plain Theano

@pytest.fixture(scope="module")
def mlp_one_rank():
    return wrap(1, EXAMPLES / "theano_mlp" / "train.py", "--epochs", "2", "--seed", "4")


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_numpy_batches_on_the_device_match_one_rank(mlp_one_rank, n, tmp_path):
    record = tmp_path / "run.jsonl"
    result = wrap(n, "--record", record, "--require-device",
                  EXAMPLES / "theano_mlp" / "train.py", "--epochs", "2", "--seed", "4")
    same(result, mlp_one_rank, ("val_loss", "param_norms"))
    distributed_on_the_device(result, n)
    summary = [json.loads(line) for line in record.read_text().splitlines()][-1]
    # Every rank computed its share of every batch: 1500 rows, twice.
    assert summary["type"] == "summary" and sum(summary["rows_per_rank"]) == 3000
    assert max(summary["rows_per_rank"]) - min(summary["rows_per_rank"]) <= 2 * 24
    assert len(set(summary["devices"])) == 1 and summary["devices"][0] != "cpu"


@pytest.mark.mpi
def test_the_step_exchanges_device_gradients_fused_not_one_copy_each():
    one = wrap(1, SCRIPTS / "device_exchange.py")
    two = wrap(2, SCRIPTS / "device_exchange.py")
    same(two, one, ("losses", "norms"))
    assert "params ['GpuArraySharedVariable']" in two.stdout
    assert "gradients on the device 6 of 6" in two.stdout
    assert "gradients copied to the host one by one 0" in two.stdout
    assert "exchange nodes 1" in two.stdout and "exchange nodes 0" in one.stdout


@pytest.mark.mpi
def test_givens_slices_of_datasets_on_the_device_match_one_rank():
    script = SCRIPTS / "givens_logreg.py"
    one, three = wrap(1, script), wrap(3, script)
    same(three, one, ("cost", "norms"))
    distributed_on_the_device(three, 3)


@pytest.mark.mpi
def test_batch_statistics_on_the_device_are_the_one_process_statistics():
    """BatchNorm on the device: each rank's moments of its rows made whole in
    the step, two collectives a layer, in kernels the device builds (pocl
    crashes on a float maximum)."""
    script = SCRIPTS / "batch_coupling.py"
    one = wrap(1, "--framework", "theano", script, "10", "batch_norm")
    for n in (2, 3):
        result = wrap(n, "--framework", "theano", script, "10", "batch_norm")
        same(result, one, ("batch_norm",))
        assert "3 collectives per step" in result.stdout, result.stdout[-1500:]


# ------------------------------------------------------------------ frameworks

@pytest.mark.mpi
def test_lasagne_with_dropout_on_the_device_matches_one_rank():
    script = SCRIPTS / "lasagne_mnist.py"
    one, two = wrap(1, script, "mlp", "2"), wrap(2, script, "mlp", "2")
    same(two, one, ("train",))
    distributed_on_the_device(two, 2)


@pytest.mark.mpi
def test_keras_noise_layers_on_the_device_match_one_rank():
    """Dropout, GaussianNoise and GaussianDropout drawing on the device.  (Its
    recurrent models match too, but Theano's scan runs in Python on the host
    here: minutes, so the suite leaves them to the CPU tests.)"""
    script = SCRIPTS / "transparency_keras_models.py"
    env = device_env(KERAS_BACKEND="theano")
    one = wrap(1, "--seed", 0, script, "noise", env=env)
    two = wrap(2, "--seed", 0, script, "noise", env=env)
    for key in ("noise loss", "noise val_loss", "noise evaluate", "noise weights"):
        same(two, one, (key,), rtol=1e-8)
    distributed_on_the_device(two, 2)


@pytest.mark.mpi
@pytest.mark.skipif(not HAVE_BLOCKS, reason=(
    "Blocks is not installable from PyPI; `make blocks BLOCKS_SRC=...` installs it"))
def test_blocks_on_the_device_matches_one_rank():
    script = SCRIPTS / "blocks_mnist.py"
    one, two = wrap(1, script, "--epochs", "2"), wrap(2, script, "--epochs", "2")
    same(two, one, ("train_cost", "valid_cost", "param_norms"), rtol=1e-8)
    distributed_on_the_device(two, 2)


@pytest.mark.mpi
def test_theanompi_model_file_on_the_device_matches_the_cpu():
    project = SCRIPTS / "theanompi_project"
    command = [TMPI, "run", "-n", "2", "--config", "launch_session.cfg"]
    on_device = check(run(command, env=device_env(), cwd=project))
    on_cpu = check(run(command, env=rank_env("float64"), cwd=project))
    same(on_device, on_cpu, ("val_cost",))
    assert "every rank on " in on_device.stdout


# ------------------------------------------------------------------ checkpoints

@pytest.mark.mpi
def test_device_checkpoints_resume_on_the_device_and_on_the_cpu(tmp_path):
    script = [EXAMPLES / "theano_mlp" / "train.py", "--epochs", "2", "--seed", "5"]
    directory = tmp_path / "checkpoints"
    whole = wrap(2, "--checkpoint-dir", directory, "--checkpoint-every", "20", *script)
    first = sorted(p for p in os.listdir(directory) if p.startswith("checkpoint-step"))[0]
    keys = ("val_loss", "param_norms")
    # An early checkpoint of the device run, resumed on the device and on the CPU.
    again = wrap(2, "--resume", directory / first, *script)
    same(again, whole, keys, rtol=1e-8)
    on_cpu = check(tmpi("wrap", "-n", "1", "--resume", directory / first, *script,
                        env=rank_env("float64")))
    same(on_cpu, whole, keys, rtol=1e-8)
    assert "device" not in [line for line in on_cpu.stdout.splitlines()
                            if line.startswith("tmpi: ") and "steps on" in line][-1]


# ------------------------------------------------------------------ device arrays

def test_staging_moves_device_arrays_in_one_fused_copy_each_way():
    flags, why = device_flags()
    if flags is None:
        pytest.skip(why)
    import pygpu
    from pygpu import gpuarray
    from tmpi_adapters.exchangers.device import Staging
    context = pygpu.init(devices.device_flag(flags))
    rng = np.random.RandomState(0)
    values = [rng.standard_normal(s) for s in ((3, 4), (5,), (2, 2, 2))]
    arrays = [gpuarray.array(v, context=context) for v in values]
    host_loss = np.float64(1.5)
    staging = Staging()
    on_host = staging.to_host(arrays + [host_loss])
    for got, want in zip(on_host, values):
        assert isinstance(got, np.ndarray) and np.array_equal(got, want)
    assert on_host[3] is host_loss                       # host values pass untouched
    bases = {id(np.asarray(a).base) for a in on_host[:3]}
    assert len(bases) == 1                               # views of one host buffer
    results = [2 * a for a in on_host[:3]] + [host_loss]
    contexts = {i: context for i in range(3)}
    back = staging.to_device(results, contexts)
    for got, want in zip(back[:3], values):
        assert type(got).__module__.startswith("pygpu")
        assert np.array_equal(np.asarray(got), 2 * want)
    again = staging.to_device(results, contexts)
    # Borrowed: the next step's results are written to the same device buffer.
    assert buffer_of(again[0]) == buffer_of(back[0]) == buffer_of(back[2])
    fresh = staging.to_device(results, contexts, fresh=True)
    assert buffer_of(fresh[0]) != buffer_of(back[0])


def buffer_of(array):
    """The device buffer behind a pygpu array (OpenCL's ``cl_mem``, CUDA's allocation)."""
    if array.context.kind == b"opencl":
        return array.base_data
    return array.gpudata - array.offset


# ------------------------------------------------------------------ a device not opened

def cuda_flags_without_cuda():
    """``THEANO_FLAGS`` naming CUDA GPU 0, where no CUDA GPU can open (else a skip)."""
    if devices.has_cuda():
        pytest.skip("a CUDA GPU is here: device=cuda0 opens")
    env = rank_env("float64")
    env["THEANO_FLAGS"] += ",device=cuda0"
    return env


@pytest.mark.mpi
def test_a_device_theano_cannot_open_is_named_before_the_first_step(tmp_path):
    record = tmp_path / "run.jsonl"
    result = check(tmpi("wrap", "-n", "2", "--record", record,
                        EXAMPLES / "theano_mlp" / "train.py", "--epochs", "1",
                        env=cuda_flags_without_cuda()))
    lines = [line for line in result.stderr.splitlines() if line.startswith("tmpi: ")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tmpi: warning: THEANO_FLAGS asks for device=cuda0, but Theano "
                               "opened no device: all 2 ranks compute on the CPU. Theano's "
                               "reason: "), lines
    assert "`make gpu`" in lines[0] and "--require-device" in lines[0]
    # Theano's own reason: pygpu missing, or (with pygpu) no CUDA driver.
    assert "pygpu could not be imported" in lines[0] or "libcuda.so" in lines[0], lines[0]
    records = [json.loads(line) for line in record.read_text().splitlines()]
    assert [r["type"] for r in records[:3]] == ["run", "warning", "step"]
    assert records[1]["text"] == lines[0] and records[1]["ranks_on_cpu"] == [0, 1]
    assert records[1]["asked"] == ["cuda0", "cuda0"] and records[1]["devices"] == ["cpu"] * 2
    assert records[-1]["devices"] == ["cpu", "cpu"]


@pytest.mark.mpi
def test_require_device_stops_before_the_script_trains_with_status_8():
    result = tmpi("wrap", "-n", "2", "--require-device", EXAMPLES / "theano_mlp" / "train.py",
                  "--epochs", "1", env=cuda_flags_without_cuda())
    assert result.returncode == 8, result.stderr
    assert "epoch" not in result.stdout
    line = [x for x in result.stderr.splitlines() if x.startswith("tmpi: ")]
    # Every rank finds it (the check is collective) and stops; one says so.
    assert len(line) == 1 and re.match(
        r"tmpi: error \(rank [01]\): THEANO_FLAGS asks for device=cuda0 \(--require-device\), "
        r"but Theano opened no device on any of the 2 ranks\. Theano's reason: ", line[0]), \
        result.stderr


def test_require_device_without_a_device_named_is_an_error():
    result = tmpi("wrap", "--require-device", EXAMPLES / "theano_mlp" / "train.py",
                  "--epochs", "1", env=rank_env("float64"))
    assert result.returncode == 8 and "epoch" not in result.stdout
    assert "tmpi: error: --require-device, but THEANO_FLAGS names no device" in result.stderr


def test_the_line_names_the_ranks_on_the_cpu_and_each_reason():
    found = [("cuda0", "cuda0 (NVIDIA H100)", None), ("cuda1", "cpu", "no CUDA driver"),
             ("cuda0", "cuda0 (NVIDIA H100)", None), ("cuda1", "cpu", "pygpu too old")]
    assert devices.fallback_ranks(found) == [1, 3]
    assert devices.fallback_line(found) == (
        "warning: THEANO_FLAGS asks for device=cuda1, but Theano opened no device: ranks 1 "
        "and 3 of 4 compute on the CPU (the others on cuda0 (NVIDIA H100)). Theano's reason: "
        "rank 1: no CUDA driver; rank 3: pygpu too old. `make gpu` sets up Theano's GPU "
        "backend (docs/gpu.md); --require-device makes this an error.")
    assert "no device on ranks 1 and 3 of 4." in devices.fallback_line(found, required=True)
    one = [("opencl0:0", "cpu", "pygpu could not be imported.")]
    assert devices.fallback_line(one).startswith(
        "warning: THEANO_FLAGS asks for device=opencl0:0, but Theano opened no device: the run "
        "computes on the CPU. Theano's reason: pygpu could not be imported. ")
    assert devices.fallback_line([("cuda0", "cuda0 (NVIDIA H100)", None)]) is None


# ------------------------------------------------------------------ the device benchmark

@pytest.mark.mpi
@pytest.mark.slow
def test_the_device_benchmark_cut_short_writes_what_it_measured(tmp_path):
    """SIGTERM as its first timed job ends: the job then starting is stopped,
    the run so far written, not judged."""
    out = tmp_path / "bench.json"
    process = subprocess.Popen(
        [str(TMPI), "bench", "--parts", "device", "--quick", "--no-progress",
         "--device-batch-size", "8", "--steps", "2", "--json", str(out)],
        env=device_env(), cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if line.startswith("device: round 1/2, plain: "):
                process.send_signal(signal.SIGTERM)
                break
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    stdout = "".join(lines) + stdout
    assert process.returncode == 143, "exit %s\n%s\n%s" % (process.returncode, stdout, stderr)
    assert stdout.startswith("device: the conv net compiled (plain and 2 ranks"), stdout
    assert "results written to %s (interrupted by SIGTERM in the device part" % out in stdout
    data = json.loads(out.read_text())
    assert data["stopped"].startswith("interrupted by SIGTERM in the device part after ")
    found = data["device"]
    assert found["partial"] and [r["variant"] for r in found["runs"]] == ["plain"]
    assert found["compile_s"] > 0 and found["step_median_s"]["plain"] > 0
    assert "overhead_1_rank" not in found        # no pair of runs: no ratio
    assert not [k for k in list(data["headline"]) + list(data["bars"]) if "device" in k]


# ------------------------------------------------------------------ device choice

@pytest.mark.parametrize("flags,environ,rank,expected", [
    ("floatX=float64,device=cuda", {"MPI_LOCALRANKID": "3", "CUDA_VISIBLE_DEVICES": "0,1"}, 3,
     "cuda1"),
    ("device=cuda", {"CUDA_VISIBLE_DEVICES": "2,5,7"}, 4, "cuda1"),
    ("device=cuda0", {"CUDA_VISIBLE_DEVICES": "0,1"}, 1, "cuda0"),    # named: kept
    ("device=cpu", {}, 1, "cpu"),
    ("floatX=float32", {}, 1, None),
    ("device=opencl0:0", {}, 1, "opencl0:0"),
])
def test_each_rank_takes_a_device(flags, environ, rank, expected):
    env = dict(environ, THEANO_FLAGS=flags, HOME="/nonexistent")
    devices.choose(rank, environ=env)
    assert devices.device_flag(env["THEANO_FLAGS"]) == expected
    assert ("floatX=float64" in env["THEANO_FLAGS"]) == ("floatX=float64" in flags)


def test_opencl_ranks_get_kernel_caches_of_their_own_and_their_share_of_cores():
    env = {"THEANO_FLAGS": "device=opencl0:0", "XDG_CACHE_HOME": "/c"}
    devices.choose(1, threads=3, environ=env)
    assert env["POCL_CACHE_DIR"] == "/c/pocl/tmpi-rank1"
    assert env["POCL_MAX_PTHREAD_COUNT"] == "3"
    mine = {"THEANO_FLAGS": "device=opencl0:0", "POCL_CACHE_DIR": "/mine"}
    devices.choose(1, threads=3, environ=mine)
    assert mine["POCL_CACHE_DIR"] == "/mine"         # the user's own is kept


def test_theanompi_devices_list_gives_rank_r_entry_r_where_it_can_run():
    env = {devices.DEVICES_ENV: "opencl0:0,opencl0:0"}
    devices.choose(1, environ=env)
    assert devices.device_flag(env["THEANO_FLAGS"]) == "opencl0:0"
    # The canonical cuda0,cuda1 on a machine without CUDA: the CPU, as before.
    env = {devices.DEVICES_ENV: "cuda0,cuda1", "CUDA_VISIBLE_DEVICES": ""}
    devices.choose(1, environ=env)
    assert devices.device_flag(env.get("THEANO_FLAGS")) is None
    # THEANO_FLAGS naming a device wins.
    env = {devices.DEVICES_ENV: "cuda0,cuda1", "THEANO_FLAGS": "device=opencl0:0"}
    devices.choose(1, environ=env)
    assert devices.device_flag(env["THEANO_FLAGS"]) == "opencl0:0"


@pytest.mark.parametrize("visible,count", [
    ("0,2", 2), (" 1 , 3 ", 2), ("GPU-8f6c1b2e,1", 2), ("2,-1,3", 1), ("-1", 0),
    ("NoDevFiles", 0), ("", 0),
])
def test_visible_gpus_are_counted_as_cuda_counts_them(visible, count):
    assert devices.gpu_count({"CUDA_VISIBLE_DEVICES": visible}) == count

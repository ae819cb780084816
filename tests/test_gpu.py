"""GPU exchangers: what can be checked without a GPU, and the suite where one exists.

Device selection, the choice of exchanger, the error texts and the transfer
precision arithmetic are plain Python and numpy and run everywhere; runs on
real GPUs skip with the exchanger's own ``unavailable_reason`` elsewhere.
"""
import sys
import textwrap

import numpy as np
import pytest

from conftest import SCRIPTS, check, mpiexec, rank_env, tmpi
from tmpi_adapters.errors import ConfigError, TmpiError
from tmpi_adapters.exchangers import codecs, experimental
from tmpi_adapters.exchangers.experimental import bench, device, nccl, survey
from tmpi_adapters.pluginmanager import available, describe_plugins

GPU_EXCHANGERS = experimental.EXCHANGERS


@pytest.fixture
def fresh_probes():
    """Forget cached answers about CuPy and the GPU before and after a test."""
    cached = (survey._cupy_or_reason, survey.visible_gpu_count, survey.gpu_problem,
              survey.nccl_problem, survey._cuda_support)
    for function in cached:
        function.cache_clear()
    yield
    for function in cached:
        function.cache_clear()


# ------------------------------------------------------------------ registry

def test_both_gpu_exchangers_are_registered_as_device_exchangers():
    found = available("exchangers")
    for name, cls in GPU_EXCHANGERS.items():
        assert found[name] is cls
        assert cls.name == name and cls.memory == "device"


def test_tmpi_plugins_lists_the_gpu_exchangers_as_experimental():
    rows = [row for row in describe_plugins() if "exchanger:nccl" in row["provides"]]
    assert len(rows) == 1
    assert rows[0]["name"] == "tmpi_adapters.exchangers.experimental"
    assert rows[0]["provides"] == ["exchanger:cuda-mpi", "exchanger:nccl"]
    assert "EXPERIMENTAL" in experimental.__doc__ and "never run on one" in experimental.__doc__


def test_nccl_refuses_point_to_point_and_names_the_exchangers_that_do_it():
    # No GPU needed: the refusal comes before any state is touched.
    exchanger = nccl.NCCLExchanger.__new__(nccl.NCCLExchanger)
    assert exchanger.point_to_point is False
    buffer = np.zeros(3, np.float32)
    for call in (lambda: exchanger.isend(buffer, 1), lambda: exchanger.irecv(buffer),
                 lambda: exchanger.probe(), lambda: exchanger.send(buffer, 1, tag=2),
                 lambda: exchanger.recv(buffer, 0)):
        with pytest.raises(TmpiError, match="nccl exchanger does not support point-to-point.*"
                           "gosgd.*--exchanger mpi or --exchanger cuda-mpi"):
            call()


# ------------------------------------------------------------ device choice

@pytest.mark.parametrize("value,expected", [
    (None, None),
    ("", []),
    ("0,2", ["0", "2"]),
    (" 1 , 3 ", ["1", "3"]),
    ("GPU-8f6c1b2e,1", ["GPU-8f6c1b2e", "1"]),
    ("2,-1,3", ["2"]),          # CUDA stops at the first entry that is no device
    ("-1", []),
    ("NoDevFiles", []),
])
def test_cuda_visible_devices_is_read_like_cuda_reads_it(value, expected):
    assert survey.parse_visible_devices(value) == expected


def test_local_ranks_take_visible_devices_round_robin():
    assert [survey.device_for_local_rank(r, 4) for r in range(6)] == [0, 1, 2, 3, 0, 1]
    # A launcher that narrows CUDA_VISIBLE_DEVICES to one device per rank.
    assert [survey.device_for_local_rank(r, 1) for r in range(3)] == [0, 0, 0]


def test_no_visible_device_names_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    with pytest.raises(TmpiError, match="local rank 2.*CUDA_VISIBLE_DEVICES='-1' hides every"):
        survey.device_for_local_rank(2, 0)
    assert survey.describe_visible_devices({}) == "CUDA_VISIBLE_DEVICES is unset"
    assert survey.describe_visible_devices({"CUDA_VISIBLE_DEVICES": "1,0"}) == \
        "CUDA_VISIBLE_DEVICES='1,0'"


def test_ranks_sharing_a_gpu_are_named():
    own = [("n1", "0000:3b:00.0"), ("n1", "0000:5e:00.0"), ("n2", "0000:3b:00.0")]
    assert survey.shared_gpus(own) is None
    shared = own + [("n1", "0000:5e:00.0")]
    assert survey.shared_gpus(shared) == "ranks 1, 3 share the GPU 0000:5e:00.0 on n1"
    assert survey.shared_gpus(own + [None]) == "rank(s) 3 have no usable GPU"


def _entry(nccl=None, cuda_mpi=None, gpu_id=("n1", "0000:01:00.0")):
    return {"nccl": nccl, "cuda-mpi": cuda_mpi, "gpu": gpu_id}


def test_choice_prefers_nccl_then_cuda_mpi_and_needs_a_gpu_per_rank():
    a, b = ("n1", "0000:01:00.0"), ("n1", "0000:02:00.0")
    assert survey.choose_exchanger([_entry(gpu_id=a), _entry(gpu_id=b)]) == "nccl"
    no_nccl = [_entry(nccl="NCCL missing", gpu_id=a), _entry(gpu_id=b)]
    assert survey.choose_exchanger(no_nccl) == "cuda-mpi"
    neither = [_entry(nccl="x", cuda_mpi="y", gpu_id=a), _entry(gpu_id=b)]
    assert survey.choose_exchanger(neither) is None
    assert survey.choose_exchanger([_entry(gpu_id=a), _entry(gpu_id=a)]) is None
    assert survey.choose_exchanger([_entry(gpu_id=a), _entry(gpu_id=None)]) is None


def test_no_choice_is_explained():
    a, b = ("n1", "0000:01:00.0"), ("n1", "0000:02:00.0")
    missing = [_entry(gpu_id=a), _entry(nccl="no GPU", cuda_mpi="no GPU", gpu_id=None)]
    assert survey.why_no_gpu_exchanger(missing) == "rank 1: no GPU"
    shared = [_entry(gpu_id=a), _entry(gpu_id=a)]
    assert survey.why_no_gpu_exchanger(shared) == "ranks 0, 1 share the GPU 0000:01:00.0 on n1"
    split = [_entry(nccl="x", gpu_id=a), _entry(cuda_mpi="y", gpu_id=b)]
    assert survey.why_no_gpu_exchanger(split) == "no exchanger runs on all ranks"


def test_theano_flags_say_where_the_buffers_live(monkeypatch):
    assert survey.theano_flag("floatX=float32,device=cuda1,blas.ldflags=", "device") == "cuda1"
    assert survey.theano_flag("device=cuda0,device=cpu", "device") == "cpu"
    assert survey.theano_flag("floatX=float32", "device") is None
    # Read from the environment when Theano is not imported yet.
    monkeypatch.setitem(sys.modules, "theano", None)
    assert survey.buffers_on_gpu({"THEANO_FLAGS": "floatX=float32,device=cuda0"})
    assert survey.buffers_on_gpu({"THEANO_FLAGS": "device=gpu"})
    assert not survey.buffers_on_gpu({"THEANO_FLAGS": "device=cpu,init_gpu_device=cuda0"})
    assert not survey.buffers_on_gpu({})


def test_host_models_are_left_to_the_mpi_exchanger(monkeypatch):
    monkeypatch.setitem(sys.modules, "theano", None)
    monkeypatch.setenv("THEANO_FLAGS", "floatX=float32,device=cpu")

    class NoCommunication:
        """Stands for the session; the hook must not touch its communicator."""
        rank, size = 0, 2
        comm = None

    assert experimental.tmpi_select_exchanger(session=NoCommunication()) is None


# ---------------------------------------------------------- availability

def test_missing_cupy_is_reported_with_the_install_command(monkeypatch, fresh_probes):
    monkeypatch.setitem(sys.modules, "cupy", None)  # what an install without [gpu] sees
    for cls in GPU_EXCHANGERS.values():
        reason = cls.unavailable_reason()
        assert reason.startswith("CuPy is not installed")
        assert "pip install tmpi-adapters[gpu]" in reason
    with pytest.raises(TmpiError, match="CuPy is not installed"):
        survey.require_cupy()


CONSTRUCT = textwrap.dedent("""
    import sys
    from mpi4py import MPI
    from tmpi_adapters.errors import TmpiError
    from tmpi_adapters.exchangers.experimental.nccl import NCCLExchanger
    try:
        NCCLExchanger(MPI.COMM_WORLD)
    except TmpiError as error:
        print("rank %d: %s" % (MPI.COMM_WORLD.rank, error), flush=True)
""")


@pytest.mark.mpi
def test_every_rank_fails_alike_where_nccl_cannot_run(tmp_path):
    reason = nccl.NCCLExchanger.unavailable_reason()
    if reason is None:
        pytest.skip("nccl can run here")
    script = tmp_path / "construct.py"
    script.write_text(CONSTRUCT)
    result = check(mpiexec(2, sys.executable, script, timeout=120))
    for rank in (0, 1):
        assert "rank %d: the nccl exchanger cannot run on rank 0: %s" % (rank, reason) \
            in result.stdout, result.stdout


def test_cuda_aware_mpi_texts_and_override():
    assert survey.cuda_aware_message(True, "Open MPI v5") is None
    assert "is not CUDA-aware" in survey.cuda_aware_message(False, "MPICH Version: 4.2")
    unknown = survey.cuda_aware_message(None, "Some MPI")
    assert "cannot tell" in unknown and "TMPI_CUDA_AWARE_MPI=1" in unknown
    assert survey.cuda_aware_problem({"TMPI_CUDA_AWARE_MPI": "1"}) is None
    assert "says this MPI is not CUDA-aware" in survey.cuda_aware_problem(
        {"TMPI_CUDA_AWARE_MPI": "0"})


def test_the_installed_mpi_is_asked_whether_it_is_cuda_aware(fresh_probes):
    supported, library = survey._cuda_support()
    assert supported in (True, False, None)
    assert library and library != "MPI", "the child process could not query MPI"


@pytest.mark.mpi
def test_asking_for_nccl_where_it_cannot_run_fails_before_training():
    reason = nccl.NCCLExchanger.unavailable_reason()
    if reason is None:
        pytest.skip("nccl can run here")
    result = tmpi("wrap", "-n", "1", "--exchanger", "nccl", SCRIPTS / "givens_logreg.py",
                  env=rank_env(floatx="float32"), timeout=300)
    assert result.returncode != 0
    assert "the nccl exchanger cannot run: %s" % reason in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert "epoch" not in result.stdout.lower()


# ---------------------------------------------------- transfer precision

def test_device_conversions_round_exactly_like_the_mpi_exchanger():
    # The GPU exchangers run codecs' array-module-generic conversions (with
    # CuPy); the mpi exchanger its compiled loops.  Same bits, NaN included.
    rng = np.random.RandomState(0)
    values = np.concatenate([
        rng.standard_normal(1000).astype(np.float32) * 1e3,
        np.float32([0.0, -0.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 65504.0, 1e-40, np.inf, np.nan]),
        np.uint32([0x7F800001, 0xFFFFFFFF]).view(np.float32),  # NaNs that rounding would carry
    ])
    for fmt in ("fp16", "bf16"):
        compiled = np.empty(values.size, np.uint16)
        codecs.encode(values, 1.0, compiled, fmt)
        words = codecs.encode_words(values, fmt)
        if fmt == "bf16":
            np.testing.assert_array_equal(words, compiled)
        # fp16 NaNs may differ in payload (F16C quiets them); NaN stays NaN.
        decoded = np.empty(values.size, np.float32)
        codecs.decode(compiled, decoded, fmt)
        np.testing.assert_array_equal(codecs.decode_words(words, fmt), decoded)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_chunk_sums_are_float32_sums_rounded_once(precision):
    size, chunk = 3, 4
    rng = np.random.RandomState(1)
    parts = [rng.standard_normal(chunk).astype(np.float32) for _ in range(size)]

    def rounded(values):
        return codecs.decode_words(codecs.encode_words(values, precision), precision)
    words = np.concatenate([codecs.encode_words(p, precision) for p in parts])
    summed = codecs.decode_words(device.reduce_chunks(words, size, precision), precision)
    np.testing.assert_array_equal(summed, rounded(sum(rounded(p) for p in parts)))


def test_sixteen_bit_transfer_never_adds_in_sixteen_bits():
    # 2048 + 1 + 1: float16 steps are 2 here, so adding pairwise in float16
    # loses both ones; one float32 sum rounded once keeps them.
    words = codecs.encode_words(np.float32([2048.0, 1.0, 1.0]), "fp16")
    assert codecs.decode_words(device.reduce_chunks(words, 3, "fp16"), "fp16")[0] == 2050.0
    pairwise = (np.float16(2048) + np.float16(1)) + np.float16(1)
    assert pairwise == 2048.0


def test_unknown_sixteen_bit_encoding_is_refused():
    with pytest.raises(ValueError, match="fp8"):
        codecs.encode_words(np.zeros(2, np.float32), "fp8")
    with pytest.raises(ValueError, match="fp8"):
        codecs.decode_words(np.zeros(2, np.uint16), "fp8")


@pytest.mark.parametrize("n,size,expected", [
    (10, 3, (4, 12)), (9, 3, (3, 9)), (1, 4, (1, 4)), (0, 2, (1, 2)),
])
def test_buffers_split_into_equal_chunks(n, size, expected):
    assert device.chunking(n, size) == expected


def test_packed_bytes_keep_every_array_aligned():
    offsets, length = device.byte_layout([12, 8, 1, 0, 24])
    assert offsets == [0, 16, 32, 48, 48]
    assert length == 72
    assert all(o % device.ALIGN == 0 for o in offsets)


def test_nccl_reduces_float_types_and_refuses_others():
    assert nccl.nccl_type_name(np.float32) == "NCCL_FLOAT32"
    assert nccl.nccl_type_name("float16") == "NCCL_FLOAT16"
    assert nccl.nccl_type_name(np.float64) == "NCCL_FLOAT64"
    with pytest.raises(ConfigError, match="dtype int16"):
        nccl.nccl_type_name(np.int16)


def test_nccl_type_names_exist_in_cupy(fresh_probes):
    if survey.nccl_problem():
        pytest.skip("CuPy with NCCL is not installed here: %s" % survey.nccl_problem())
    module = survey.nccl_module()
    for name in list(nccl.NCCL_TYPES.values()) + ["NCCL_SUM", "NCCL_UINT8"]:
        assert hasattr(module, name), name


# ------------------------------------------------------ on real GPUs only

def _skip_without(name, n):
    reason = GPU_EXCHANGERS[name].unavailable_reason(size=n)
    if reason:
        pytest.skip("%s exchanger cannot run %d rank(s) here: %s" % (name, n, reason))


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("name", sorted(GPU_EXCHANGERS))
def test_shared_suite_on_gpus(name, n):
    _skip_without(name, n)
    result = check(mpiexec(n, sys.executable, SCRIPTS / "exchanger_suite.py", name,
                           timeout=300))
    assert "exchanger suite OK: %s on %d rank(s)" % (name, n) in result.stdout


HOST_ARRAYS = textwrap.dedent("""
    import sys
    import numpy as np
    from mpi4py import MPI
    import tmpi_adapters  # noqa: F401
    from tmpi_adapters.pluginmanager import lookup

    name = sys.argv[1]
    x = lookup("exchangers", name)(MPI.COMM_WORLD, timeout=60)
    rank, size = x.rank, x.size
    a = [np.full((3, 2), rank + 1.0, np.float32), np.arange(5, dtype=np.float64) * rank]
    for precision in ("native", "fp32", "fp16", "bf16"):
        mean = x.allreduce(a, op="mean", weight=rank + 1.0, precision=precision)
        assert all(isinstance(m, np.ndarray) for m in mean), precision
        w = np.arange(1, size + 1, dtype=np.float64)
        expect0 = (w * w).sum() / w.sum()
        expect1 = np.arange(5) * (w * np.arange(size)).sum() / w.sum()
        tol = 1e-6 if precision in ("native", "fp32") else 1e-2
        np.testing.assert_allclose(mean[0], expect0, rtol=tol)
        np.testing.assert_allclose(mean[1], expect1, rtol=tol, atol=tol)
    inplace = [v.copy() for v in a]
    assert x.allreduce(inplace, op="sum", out=inplace)[0] is inplace[0]
    np.testing.assert_allclose(inplace[0], size * (size + 1) / 2)
    b = [np.full(4, rank, np.int64), np.full((), rank, np.float32)]
    assert x.broadcast(b, root=size - 1) is b
    assert b[0].tolist() == [size - 1] * 4 and float(b[1]) == size - 1
    rows = x.allgather_rows(np.full((rank + 1, 2), rank, np.float32))
    assert isinstance(rows, np.ndarray) and rows.shape == (size * (size + 1) // 2, 2)
    if size > 1 and getattr(x, "point_to_point", True):
        if rank == 0:
            x.send(np.arange(7, dtype=np.float32), 1, tag=5)
        elif rank == 1:
            out = np.zeros(7, np.float32)
            assert x.recv(out, 0, tag=5) == (0, 5)
            np.testing.assert_array_equal(out, np.arange(7))
    x.barrier()
    x.close()
    if rank == 0:
        print("host arrays OK", flush=True)
""")


@pytest.mark.mpi
@pytest.mark.parametrize("name", sorted(GPU_EXCHANGERS))
def test_host_arrays_are_staged_through_the_device(name, tmp_path):
    n = 2
    _skip_without(name, n)
    script = tmp_path / "host_arrays.py"
    script.write_text(HOST_ARRAYS)
    result = check(mpiexec(n, sys.executable, script, name, timeout=300))
    assert "host arrays OK" in result.stdout


SELECTION = textwrap.dedent("""
    from mpi4py import MPI
    from tmpi_adapters.pluginmanager import get_plugin_manager

    class Session:
        comm = MPI.COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()

    chosen = get_plugin_manager().hook.tmpi_select_exchanger(session=Session())
    if Session.rank == 0:
        print("chosen:", chosen, flush=True)
""")


@pytest.mark.mpi
def test_models_on_gpus_choose_a_gpu_exchanger(tmp_path):
    n = 2
    _skip_without("nccl", n)
    script = tmp_path / "selection.py"
    script.write_text(SELECTION)
    env = rank_env(floatx="float32")
    env["THEANO_FLAGS"] = env["THEANO_FLAGS"] + ",device=cuda"
    result = check(mpiexec(n, sys.executable, script, env=env, timeout=300))
    assert "chosen: nccl" in result.stdout


def test_benchmark_model_mixes_large_and_small_arrays():
    shapes = bench.model_shapes(10e6, count=10)
    sizes = [int(np.prod(shape)) * 4 for shape in shapes]
    assert len(shapes) == 10 and abs(sum(sizes) - 10e6) < 0.01 * 10e6
    assert min(sizes) < 1000 < 100000 < max(sizes)


@pytest.mark.mpi
@pytest.mark.parametrize("name", sorted(GPU_EXCHANGERS))
def test_gpu_benchmark_runs_and_writes_json(name, tmp_path):
    import json
    n = 2
    _skip_without(name, n)
    out = tmp_path / "bench.json"
    check(mpiexec(n, sys.executable, "-m", bench.__name__, "--exchanger", name,
                  "--mbytes", "1", "--repeats", "2", "--json", out, timeout=300))
    figures = json.loads(out.read_text())
    assert figures["exchanger"] == name and figures["ranks"] == n
    for key in ("raw", "fused_native", "fused_fp16", "fused_bf16", "per_array",
                "host_staged", "fused_over_raw"):
        assert figures[key] > 0, key

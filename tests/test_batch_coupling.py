"""Steps whose rows meet give the one-process numbers on N ranks, with collectives in the step.

The generated cases of ``scripts/batch_coupling.py`` (every common way a
training step ties the rows of a batch together: reductions, batch
statistics, rows picked by index, products over the rows, sorts, scans over
rows, values as long as the batch that are not split, values the updates
read), trained with SGD, momentum and Adam on 1, 2 and 3 ranks, with batch
sizes the ranks do not divide, a short last batch, and a last batch with
fewer rows than ranks.  Every case must equal the one-process run to 1e-10
(NaN where one process gets NaN), never a different number with exit 0.
"""
import math

import pytest

from conftest import SCRIPTS, check, rank_env, tmpi

COUPLING = SCRIPTS / "batch_coupling.py"
LAYOUTS = SCRIPTS / "row_layouts.py"


def python_env():
    """float64, pure-Python Theano: these small graphs compile in seconds that way."""
    env = rank_env()
    env["THEANO_FLAGS"] += ",cxx="
    return env


def cases(stdout):
    found = {}
    for line in stdout.splitlines():
        head, _, rest = line.partition(" ")
        if head in ("final", "error"):
            case, _, value = rest.partition(" ")
            found[case] = (head, value)
    return found


def same(a, b):
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= 1e-10 * max(abs(a), abs(b), 1e-300)


@pytest.fixture(scope="module", params=[10, 4], ids=["batch10", "batch4"])
def one_rank(request):
    batch = request.param
    result = check(tmpi("wrap", "-n", "1", "--framework", "theano", COUPLING, str(batch),
                        env=python_env()))
    found = cases(result.stdout)
    assert len(found) == 49 and all(head == "final" for head, _ in found.values()), found
    return batch, found


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_every_way_rows_meet_gives_the_one_process_numbers(one_rank, ranks):
    batch, expected = one_rank
    result = check(tmpi("wrap", "-n", str(ranks), "--framework", "theano", COUPLING,
                        str(batch), env=python_env()))
    found = cases(result.stdout)
    assert set(found) == set(expected)
    wrong = []
    for case, (head, value) in sorted(found.items()):
        assert head == "final", (ranks, case, value)
        got = [float(v) for v in value.split()]
        want = [float(v) for v in expected[case][1].split()]
        if len(got) != len(want) or not all(same(a, b) for a, b in zip(got, want)):
            wrong.append((case, got, want))
    assert not wrong, wrong
    # The end-of-run lines name what was made whole, and where.
    assert "where the batch's rows meet" in result.stdout
    assert "batch_coupling.py:" in result.stdout
    # Inputs that are not the batch (a reference batch, embeddings) are said to be taken whole.
    assert "input 'extra' carries no batch" in result.stdout


@pytest.mark.mpi
def test_a_step_whose_rows_meet_nowhere_keeps_one_collective():
    result = check(tmpi("wrap", "-n", "2", "--framework", "theano", COUPLING, "10", "mean",
                        "sum", "constant_batch_size", "adaptive_rate", "row_weights_shared",
                        "per_row_norm", "dataset_normalisation", env=python_env()))
    assert "; 1 collective per step" in result.stdout, result.stdout[-2000:]
    assert "where the batch's rows meet" not in result.stdout


@pytest.mark.mpi
def test_ranks_whose_models_drift_apart_are_stopped_naming_the_variable():
    """One rank changes its bias with set_value after the third step: the
    parameters' digest in the fourth step's envelope differs, and the job
    ends naming the variable instead of training two models."""
    result = tmpi("wrap", "-n", "2", "--framework", "theano", SCRIPTS / "drift.py", "6",
                  env=python_env())
    assert result.returncode == 7, result.stderr[-2000:]
    assert "ranks' models drifted apart: before train_fn#0 call 4 (12 rows) the ranks'" \
        in result.stderr
    assert "The first that differs is b (its ranks' values apart by" in result.stderr
    assert "final b" not in result.stdout and "Traceback" not in result.stderr


@pytest.mark.mpi
def test_models_that_stay_together_pass_the_digest_checks():
    result = check(tmpi("wrap", "-n", "2", "--framework", "theano", SCRIPTS / "drift.py", "6",
                        "together",
                        env=python_env()))
    assert "final b" in result.stdout


@pytest.mark.mpi
def test_local_batch_statistics_trade_exactness_for_one_collective():
    """--batch-stats local: batch normalisation keeps each rank's statistics
    (DDP without synchronised BatchNorm), said once; the running averages
    are averaged in the step's exchange, and the ranks' models stay one."""
    args = ("--framework", "theano", COUPLING, "10", "batch_norm")
    one = cases(check(tmpi("wrap", "-n", "1", *args, env=python_env())).stdout)
    local = check(tmpi("wrap", "-n", "2", "--batch-stats", "local", *args, env=python_env()))
    assert "; 1 collective per step" in local.stdout, local.stdout[-2000:]
    warning = [line for line in local.stderr.splitlines() if "--batch-stats local" in line]
    assert len(warning) == 1 and "keeps 6 batch statistics per rank" in warning[0] \
        and "batch_coupling.py:" in warning[0], local.stderr[-2000:]
    assert cases(local.stdout)["batch_norm"] != one["batch_norm"]


@pytest.mark.mpi
def test_record_names_the_collectives_where_rows_meet(tmp_path):
    record = tmp_path / "run.jsonl"
    check(tmpi("wrap", "-n", "2", "--framework", "theano", "--record", record, COUPLING, "10",
               "mean", "batch_norm", env=python_env()))
    import json
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    summary = [r for r in rows if r.get("type") == "summary"][-1]
    couplings = summary["couplings"]
    # mean: the exchange alone; batch_norm: 2 levels, the floor: the mean with the
    # variance (made whole from each rank's moments), then their gradients' sums.
    assert set(couplings) == {"train_fn#1"}, couplings
    levels = couplings["train_fn#1"]
    assert len(levels) == 2 and all(levels), levels
    assert all("batch_coupling.py:" in text for text in levels[0]), levels[0]
    assert any("moments" in text for text in levels[0]), levels[0]
    # The backward's sums gather while the rank computes the output layer's
    # weight gradient, which does not need them; the forward's wait (all of
    # the step after them needs them).
    assert summary["couplings_overlapped"] == {"train_fn#1": 1}, summary


@pytest.mark.mpi
def test_levels_gathering_beside_scans_give_the_one_process_numbers():
    """A BatchNorm level and its backward's sums each gather while the rank
    computes a scan that needs neither (the forward scan, then its gradient)."""
    script = SCRIPTS / "coupling_beside_scan.py"
    one = check(tmpi("wrap", "-n", "1", "--framework", "theano", script, env=python_env()))
    want = [float(v) for v in one.stdout.split("final ", 1)[1].splitlines()[0].split()]
    for ranks in (2, 3):
        found = check(tmpi("wrap", "-n", str(ranks), "--framework", "theano", script,
                           env=python_env()))
        got = [float(v) for v in found.stdout.split("final ", 1)[1].splitlines()[0].split()]
        assert len(got) == 4 and all(abs(a - b) <= 1e-12 * max(abs(b), 1.0)
                                     for a, b in zip(got, want)), (ranks, got, want)
        assert "the exchange + 2 where the batch's rows meet, 2 of them while the step " \
            "computes on" in found.stdout, found.stdout[-2000:]


@pytest.mark.mpi
def test_batches_grouped_masked_scanned_or_features_first_give_the_one_process_numbers():
    """128 rows on 3 ranks: shares of 43, 43 and 42, so consecutive pairs
    cross a share (gathered there); a scan over the rows, a boolean mask, a
    features-first layout (the batch on axis 1); rows repeated (two entries a
    row) with a draw shaped like them, made for the whole batch.  A draw shaped
    like rows tiled across the shares is refused before the first step."""
    names = ["pairs_minus_one", "scan_rows_target", "boolean_mask", "features_first",
             "repeat_draw"]
    expected = cases(check(tmpi("wrap", "-n", "1", "--framework", "theano", LAYOUTS, "128",
                                *names, env=python_env())).stdout)
    assert sorted(expected) == sorted(names)
    for ranks in (2, 3):
        found = cases(check(tmpi("wrap", "-n", str(ranks), "--framework", "theano", LAYOUTS,
                                 "128", *names, env=python_env())).stdout)
        for case, (head, value) in expected.items():
            assert found[case][0] == head == "final", (ranks, case, found[case])
            got, want = [float(v) for v in found[case][1].split()], \
                [float(v) for v in value.split()]
            assert all(same(a, b) for a, b in zip(got, want)), (ranks, case, got, want)
    refused = tmpi("wrap", "-n", "2", "--framework", "theano", LAYOUTS, "128", "tile_draw",
                   env=python_env())
    assert refused.returncode != 0 and "final" not in refused.stdout, refused.stdout
    errors = [line for line in refused.stderr.splitlines() if line.startswith("tmpi: error")]
    assert len(errors) == 1 and "row_layouts.py:" in errors[0] and \
        "random draw" in errors[0] and "--scaling weak" in errors[0], refused.stderr

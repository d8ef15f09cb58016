"""verify's parts without processes: tolerances, causes, sampler coverage, reference order."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler, TensorDataset

import ddpkit
from ddpkit._core.envvars import positive_int_var as env_int
from ddpkit._core.torcherrors import summarize_mismatch
from ddpkit.data.coverage import count_coverage, describe_coverage
from ddpkit.data.loader import GlobalOrderSampler
from ddpkit.parallel.replicas import check_replicas, fingerprint
from ddpkit.runtime.session import reference_world_size
from ddpkit.tools.verify.report import compare_states, explained, findings, likely_causes
from ddpkit.tools.verify.runner import RunResult, VerifyConfig, _check_resizable


def record(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "world_size": 2, "steps": 5,
        "setup": {"global_batch": 64, "per_device_batch": 32, "precision": "fp32",
                  "batchnorm": [], "dropout": []},
        "build": {"rng": [7, 7], "weights": [3, 3]},
        "coverage": count_coverage([[0, 2], [1, 3]], 4),
        "replicas": {"checked": [1, 2, 3, 4, 5], "divergence": None},
        "samples": {"0": [1, 2], "1": [3, 4]},
    }  # fmt: skip
    base.update(overrides)
    return base


def test_tensors_within_tolerance_pass_and_the_worst_is_named() -> None:
    ref = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([4.0])}
    run = {"a": torch.tensor([1.0, 2.0 + 1e-7]), "b": torch.tensor([4.1])}
    diffs = compare_states(run, ref, rtol=1e-4, atol=1e-6)
    assert [(d.name, d.ok) for d in diffs] == [("b", False), ("a", True)]
    assert diffs[0].max_abs == pytest.approx(0.1) and diffs[0].max_rel == pytest.approx(0.025)


def test_a_missing_or_reshaped_tensor_fails() -> None:
    ref = {"a": torch.zeros(2), "b": torch.zeros(3)}
    diffs = compare_states({"a": torch.zeros(3)}, ref, 1e-4, 1e-6)
    assert not any(d.ok for d in diffs)


def test_all_checks_pass_on_matching_records() -> None:
    final = compare_states({"a": torch.ones(2)}, {"a": torch.ones(2)}, 1e-4, 1e-6)
    checks = findings(record(), record(world_size=1), final, final, "rtol 1e-4")
    assert all(check.ok for check in checks), checks


def test_per_rank_rng_and_differing_data_are_named_first() -> None:
    run = record(build={"rng": [7, 8], "weights": [3, 4]}, samples={"0": [1, 2], "1": [9, 9]})
    causes = likely_causes(run, record(world_size=1), [], None)
    assert causes[0].startswith("per-rank randomness") and "(rank 0 vs rank 1)" in causes[0]
    assert causes[1].startswith("the data differs: 1 of 2 samples")
    assert explained(causes)


def test_batchnorm_dropout_and_precision_are_by_design_not_an_explanation() -> None:
    setup = {"global_batch": 64, "precision": "bf16", "batchnorm": ["bn1"], "dropout": ["drop"]}
    causes = likely_causes(record(setup=setup), record(world_size=1), [], None)
    assert [c.split(" ")[0] for c in causes] == ["unsynchronized", "Dropout", "reduced"]
    assert not explained(causes)
    nondeterministic = likely_causes(record(), record(), [], reruns_differ=3e-3)
    assert (
        "not deterministic by itself: two runs of it differ by up to 3.00e-03"
        in (nondeterministic[0])
    )


def test_a_different_global_batch_fails_with_the_fix() -> None:
    final = compare_states({"a": torch.ones(1)}, {"a": torch.ones(1)}, 1e-4, 1e-6)
    ref = record(world_size=1, setup={"global_batch": 32})
    batch = findings(record(), ref, final, final, "rtol")[1]
    assert not batch.ok and "prepare_loader" in batch.text


def test_coverage_accepts_padding_and_drop_and_rejects_an_unsharded_loader() -> None:
    padded = count_coverage([[0, 2, 4], [1, 3, 0]], dataset_size=5, expected_repeats=1)
    dropped = count_coverage([[0, 2], [1, 3]], dataset_size=5, expected_repeats=-1)
    unsharded = count_coverage([[0, 1, 2], [0, 1, 2]], dataset_size=3)
    assert padded["verdict"] == dropped["verdict"] == "ok"
    assert unsharded["verdict"] == "bad" and unsharded["extra_count"] == 3
    assert "3 extra visits of samples such as 0, 1, 2" in describe_coverage(unsharded)


@pytest.mark.parametrize(("size", "world", "shuffle", "drop"), [
    (10, 2, True, False), (11, 3, True, False), (11, 3, False, True), (7, 4, True, False),
])  # fmt: skip
def test_the_reference_order_is_the_ranks_batches_side_by_side(
    size: int, world: int, shuffle: bool, drop: bool
) -> None:
    data = TensorDataset(torch.arange(size))
    options = {"shuffle": shuffle, "seed": 3, "drop_last": drop}
    reference = GlobalOrderSampler(data, num_replicas=world, **options)
    shards = [DistributedSampler(data, world, r, **options) for r in range(world)]
    for sampler in (reference, *shards):
        sampler.set_epoch(2)
    order, per_rank = list(reference), [list(s) for s in shards]
    batch = 2  # step s of N ranks with batch B == positions s*N*B .. (s+1)*N*B of the order
    for step in range(len(per_rank[0]) // batch):
        together = sorted(i for r in per_rank for i in r[step * batch : (step + 1) * batch])
        assert sorted(order[step * world * batch : (step + 1) * world * batch]) == together


def test_reference_world_size_is_refused_in_a_real_group_and_must_be_positive(
    torchrun_env,
) -> None:
    ddpkit.init()
    with pytest.raises(ddpkit.ConfigError, match="must be a positive integer"):
        reference_world_size({"DDPKIT_VERIFY_AS_WORLD": "0"})
    assert reference_world_size({}) is None


def test_fingerprints_see_pairwise_changes_a_plain_xor_would_miss() -> None:
    zeros = torch.zeros(4)
    changed = zeros.clone()
    changed[:2] = 0.5  # two equal elements changed alike
    assert fingerprint(zeros) != fingerprint(changed)
    assert fingerprint(zeros) != fingerprint(-zeros)  # exact to the bit: -0.0 is not 0.0
    assert fingerprint(torch.arange(6.0)) != fingerprint(torch.arange(6.0).flip(0))


def test_a_world_of_one_has_nothing_to_diverge() -> None:
    ddpkit.init()
    assert check_replicas(torch.nn.Linear(3, 2), step=1) is None


def test_the_trainer_refuses_a_bad_replica_interval() -> None:
    ddpkit.init()
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ddpkit.ConfigError, match="check_replicas_every must be"):
        ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                       torch.nn.functional.cross_entropy, check_replicas_every=0)  # fmt: skip


def test_step_limit_variables_must_be_positive_integers() -> None:
    assert env_int("DDPKIT_MAX_STEPS", {"DDPKIT_MAX_STEPS": "7"}) == 7
    with pytest.raises(ddpkit.ConfigError, match="DDPKIT_MAX_STEPS='x' must be"):
        env_int("DDPKIT_MAX_STEPS", {"DDPKIT_MAX_STEPS": "x"})


def test_torchs_mismatch_text_is_summarized_and_other_errors_are_left_alone() -> None:
    assert summarize_mismatch("RuntimeError: Connection closed by peer") is None
    text = (  # fmt: skip
        "Detected mismatch between collectives on ranks. Rank 1 is running collective: "
        "CollectiveFingerPrint(SequenceNumber=9, OpType=BROADCAST, TensorShape=[2], "
        "TensorDtypes=Long, ...), but Rank 0 is running collective: CollectiveFingerPrint("
        "SequenceNumber=9, OpType=ALLREDUCE, TensorShape=[2], TensorDtypes=Long, ...)."
        "Collectives differ in the following aspects:   Op type: BROADCASTvs ALLREDUCE"
    )
    assert summarize_mismatch(text) == (
        "collective mismatch at call #9: rank 1 calls BROADCAST [2] Long, rank 0 calls "
        "ALLREDUCE [2] Long (Op type: BROADCASTvs ALLREDUCE)"
    )


def test_replicas_that_diverge_without_ddp_name_the_strategy() -> None:
    divergence = {"step": 1, "ranks": [1], "tensors": ["w"], "max_abs": {"w": 0.1}}
    setup = {"global_batch": 64, "precision": "fp32", "strategy": "none"}
    run = record(replicas={"checked": [1], "divergence": divergence}, setup=setup)
    causes = likely_causes(run, record(world_size=1), [], None)
    assert causes[0].startswith("no gradient averaging: the model was prepared with strategy")
    final = compare_states({"w": torch.ones(1)}, {"w": torch.ones(1)}, 1e-4, 1e-6)
    replicas = findings(run, record(world_size=1), final, final, "rtol")[4]
    assert not replicas.ok and replicas.text.startswith("rank 1 differs from rank 0 after step 1")


def test_an_unsharded_sampler_is_a_cause() -> None:
    run = record(coverage=count_coverage([[0, 1], [0, 1]], dataset_size=2))
    causes = likely_causes(run, record(world_size=1), [], None)
    assert any(c.startswith("the sampler does not split the data") for c in causes)


def test_recording_a_random_sampler_leaves_the_training_random_stream_alone(tmp_path) -> None:
    from torch.utils.data import DataLoader

    from ddpkit.tools.verify.recorder import Recorder

    ddpkit.init()
    loader = DataLoader(TensorDataset(torch.arange(10)), batch_size=2, shuffle=True)
    torch.manual_seed(5)
    expected = torch.rand(1)
    torch.manual_seed(5)
    recorder = Recorder(tmp_path)
    # What 2 ranks that each iterate the whole dataset are judged to be: not sharded.
    recorder.coverage = {"sampler": "RandomSampler", "verdict": "bad", "text": "not sharded"}
    run = types.SimpleNamespace(loader=loader)  # what the hook reads of the run
    recorder.on_train_epoch_start(run, 1)  # RandomSampler draws its seed from torch's stream
    assert torch.equal(torch.rand(1), expected)


def test_a_resize_whose_sampler_pads_differently_is_named_as_the_cause() -> None:
    padding = '2 samples repeated so the 3 shards are equal (uneven="pad")'
    run = record(resized={"world_size": 3, "padding": padding})
    causes = likely_causes(run, record(world_size=1), [], None)
    assert causes[0].startswith("the sampler of the 3 workers after the resize evens out")
    assert padding in causes[0] and explained(causes)
    same_padding = record(resized={"world_size": 1, "padding": None})
    assert likely_causes(same_padding, record(), [], 0.0) == []


def test_then_refuses_a_run_without_a_checkpoint_or_with_a_per_device_batch(
    tmp_path: Path,
) -> None:
    config, folder = VerifyConfig("train.py", workers=2, then=3), tmp_path
    per_device = RunResult(record(setup={"batch_policy": "per_device"}), {})
    with pytest.raises(ddpkit.errors.DdpkitError, match="it wrote none: give the script's"):
        _check_resizable(config, per_device, folder)
    (folder / "run").mkdir()
    (folder / "run" / "epoch_000001_step_000005.pt").write_bytes(b"")
    with pytest.raises(ddpkit.errors.DdpkitError, match="batch_policy is 'per_device', so its"):
        _check_resizable(config, per_device, folder)
    _check_resizable(config, RunResult(record(setup={"batch_policy": "global"}), {}), folder)


def _verify_config(*argv: str) -> VerifyConfig:
    import argparse

    from ddpkit.tools.verify.command import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(["t.py", *argv]))


def test_kill_at_is_a_step_before_the_last_of_a_run_of_several_replica_groups() -> None:
    config = _verify_config("--replica-groups", "2", "--steps", "12", "--kill-at", "6")
    assert (config.replica_groups, config.kill_at) == (2, 6)
    with pytest.raises(ddpkit.ConfigError, match="give --replica-groups 2 or more"):
        _verify_config("--kill-at", "6")
    with pytest.raises(ddpkit.ConfigError, match="give --replica-groups 2 or more"):
        _verify_config("--replica-groups", "1", "--kill-at", "6")
    with pytest.raises(ddpkit.ConfigError, match=r"1 to 11 with --steps 12 \(got 12\)"):
        _verify_config("--replica-groups", "2", "--steps", "12", "--kill-at", "12")


def test_samples_of_every_process_and_start_are_read_once_each(tmp_path: Path) -> None:
    from ddpkit.tools.verify.recorder import read_samples

    (tmp_path / "101.jsonl").write_text("[3, 11, 12]\n[4, 13, 14]\n")  # killed after a step
    (tmp_path / "202.jsonl").write_text("[4, 13, 14]\n[5, 15, 16]\n")  # started again
    assert read_samples(tmp_path) == {"3": [11, 12], "4": [13, 14], "5": [15, 16]}


def test_a_killed_group_must_restart_and_heal_for_verify_to_pass(tmp_path: Path) -> None:
    from ddpkit.tools.verify.groups import killed_and_healed

    log = tmp_path / "output.log"
    log.write_text("ddpkit run: 2 worker(s), restart 1 of 1\n[rank0] ddpkit: replica group 1: "
                   "healed at step 6 (was at step 0): the run's state from ...\n")  # fmt: skip
    ok, said = killed_and_healed(log, 1, 6)
    assert ok and "after step 6, started again (restart 1 of 1), healed at step 6" in said
    log.write_text("ddpkit run: 2 worker(s), restart 1 of 1\n")
    assert killed_and_healed(log, 1, 6) == (False, f"group 1: a process killed (-9) after step "
                                            f"6, never healed from a live group: the failure "
                                            f"was not recovered from ({log})")  # fmt: skip

"""`locojax predict train`: every `locojax train` config field is honoured, refused by name
or declared irrelevant (locojax/commands/predict_fields.json), and the honoured ones change the
prediction."""

import pytest

from locojax.commands import predict
from locojax.commands import predict_fields as train_fields
from locojax.commands import predict_train
from locojax.predict import modes


def test_every_train_field_is_placed_exactly_once():
    fields = set(train_fields.fields())
    tables = (train_fields.HONOURED, train_fields.REFUSED, train_fields.IRRELEVANT)
    placed = [p for t in tables for p in t]
    assert len(placed) == len(set(placed)), "a field is in two tables"
    missing = sorted(fields - set(placed))
    assert not missing, (f"train fields predict neither honours, refuses nor declares "
                         f"irrelevant (place them in locojax/commands/predict_fields.json): "
                         f"{missing}")
    stale = sorted(set(placed) - fields)
    assert not stale, f"predict_fields.json names fields RunConfig no longer has: {stale}"


def test_flags_are_the_command_lines():
    assert train_fields.flag("algo.num_minibatches") == "--algo.num-minibatches"
    assert train_fields.flag("placement.max_staleness") == "--max-staleness"  # no prefix


def run(capsys, *argv):
    code = predict.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


POD = ("train", "gsm8k", "--model", "qwen3-0.6b", "--cluster", "v5e-16")


@pytest.mark.parametrize("flag,value", [("--dynamic.max-rounds", "2"),
                                        ("--reward.isolation", "process"),
                                        ("--multi-turn.max-cache-slots", "64")])
def test_a_refused_field_is_refused_by_its_flag(capsys, flag, value):
    code, _, err = run(capsys, *POD, flag, value)
    assert code == 2 and f"does not cost {flag} " in err


def test_a_missing_data_path_is_refused(capsys, tmp_path):
    code, _, err = run(capsys, *POD, "--task.data", str(tmp_path / "absent.jsonl"))
    assert code == 2 and "absent.jsonl" in err and "no such file" in err


def test_predicts_own_decode_chunk_flag_is_gone(capsys):
    code, _, err = run(capsys, "workload", "gsm8k", "--decode-chunk", "4", "--cluster", "v5e-16")
    assert code == 2 and "'--decode-chunk'" in err


def ctx(*argv):
    return predict_train.parse(["gsm8k", "--model", "qwen3-0.6b", *argv], "v5e-16").ctx


def test_honoured_fields_reach_the_context():
    c = ctx("--rollout.tp", "2", "--rollout.cache-dtype", "bf16", "--algo.ppo-epochs", "2",
            "--algo.num-minibatches", "4", "--controller.decode-chunk", "8",
            "--multi-turn.env-workers", "16", "--device-memory-gb", "32")
    assert (c.tp, c.cache_dtype, c.epochs, c.minibatches, c.decode_chunk, c.env_workers) == \
        (2, "bfloat16", 2, 4, 8, 16)
    assert float(c.cluster.hw.hbm_bytes) == 32e9
    assert c.model_parallel() == 2


def test_honoured_fields_change_the_step():
    base = ctx()
    # f32 compute (the preset's precision) with a bf16 cache: half the cache bytes.
    assert ctx("--rollout.cache-dtype", "bf16").mc.kv_bytes_per_token() == \
        base.mc.kv_bytes_per_token() / 2
    one, four = modes.colocated(base), modes.colocated(ctx("--algo.num-minibatches", "4"))
    # Both exposed parts are one layer's share of the collectives (v5e hides the rest under
    # the backward), so 4 x within a few ulps of the one division that differs.
    assert four.phases["allreduce"] == pytest.approx(4 * one.phases["allreduce"], rel=1e-12)
    assert four.phases["train"] == one.phases["train"]
    two = modes.colocated(ctx("--algo.ppo-epochs", "2"))
    assert two.phases["train"] == 2 * one.phases["train"]
    whole = modes.controller(base).phases["dispatch"]
    chunked = modes.controller(ctx("--controller.decode-chunk", "8")).phases["dispatch"]
    assert chunked > whole


def test_a_mesh_that_does_not_cover_the_chips_is_refused(capsys):
    code, _, err = run(capsys, *POD, "--train.mesh", "data=2,fsdp=4")
    assert code == 2 and "= 8 devices, but the learner has 16" in err
    code, _, err = run(capsys, *POD, "--train.mesh", "fsdp=4")  # data=1: 4 of 16
    assert code == 2 and "= 4 devices, but the learner has 16" in err
    code, out, _ = run(capsys, *POD, "--train.mesh", "data=4,fsdp=4")
    assert code == 0 and "FSDP 4" in out


def test_rollout_tp_beyond_a_host_is_refused(capsys):
    code, _, err = run(capsys, *POD, "--rollout.tp", "16")
    assert code == 2 and "rollout stays inside a host" in err


def test_rollout_tp_that_does_not_split_the_model_is_refused(capsys):
    code, _, err = run(capsys, *POD, "--rollout.tp", "3")  # qwen3-0.6b: 16 heads
    assert code == 2 and "--rollout.tp 3 does not divide the model's num_attention_heads" in err

"""The reshard: the weights from the learner's layout to the rollout's before each rollout,
in one program (`meshes.to_layout`), not through the whole params on every device.

Guards: the move from FSDP to tensor-parallel rollout, as each wiring does it, keeps every bit
and lands exactly where the engine wants each weight (so its `place_weights` does nothing
more); weights already in the rollout's layout are not copied; and XLA's program for the move
needs no more than a device's share of the source and of the target when the fsdp and tensor
groups are the same devices (fsdp 8, tp 8), which is what the memory plan's `reshard` line
reports (the old way gathered the whole f32 params on every device first: 16 GB at
Qwen3-4B); and the Ray learner's publish copies each version to host memory from shards,
never through a whole replica per device. The 2-step FSDP runs, single and colocated,
bitwise alike with the reshard in every step: tests/test_train_mesh.py.
"""

import dataclasses

import jax
import numpy as np
import pytest

from locojax.distributed import HostInfo
from locojax.model import config as model_config
from locojax.model import params as params_lib
from locojax.model.loader import host_local
from locojax.model.sharding import RULES, make_mesh, weight_shardings
from locojax.train import memory_plan, meshes, wiring
from locojax.train.meshes import TrainConfig


def _host():
    return HostInfo(process_id=0, num_processes=1)


@pytest.mark.parametrize("to_engine", [True, False], ids=["to-engine-layout", "default"])
@pytest.mark.parametrize("kind", [wiring.Single, wiring.Colocated])
def test_fsdp_to_tp_moves_every_bit_where_the_engine_wants_it(kind, to_engine):
    """The learner's FSDP layout (2 x 4) to the rollout's TP layout (data 4 x tensor 2) in one
    program (`meshes.to_layout`), and back to a plain replica for export: the same bits,
    placed as each layout says. Given the engine's layout, the engine's `place_weights` has
    nothing left to do; without one (`layout=None`: replicated over the rollout mesh),
    `place_weights` finishes the move."""
    from locojax.engine.engine import Engine

    w = kind(_host(), TrainConfig("data=2,fsdp=4"), tp=2)
    assert dict(w.train_mesh.shape) == {"data": 2, "fsdp": 4}
    assert dict(w.rollout_mesh.shape) == {"data": 4, "tensor": 2}
    cfg = model_config.tiny()
    train_shardings = weight_shardings(cfg, w.train_mesh, w.train_rules)
    params = jax.device_put(params_lib.init(cfg, jax.random.key(0)), train_shardings)
    sharded = [x for x in jax.tree.leaves(params) if "fsdp" in x.sharding.spec]
    assert len(sharded) >= len(jax.tree.leaves(params)) // 2  # FSDP really shards them
    engine = Engine(cfg, mesh=w.rollout_mesh, rules=w.rollout_rules)
    if to_engine:
        rollout = w.rollout_weights(params, engine.weight_shardings)
        assert engine.place_weights(rollout) is rollout  # already laid out: not moved again
    else:
        rollout = engine.place_weights(w.rollout_weights(params))
    whole = meshes.replicated(params, w.train_mesh)
    for a, b, c, want in zip(jax.tree.leaves(params), jax.tree.leaves(rollout),
                             jax.tree.leaves(whole), jax.tree.leaves(engine.weight_shardings),
                             strict=True):
        assert b.sharding.is_equivalent_to(want, b.ndim)
        assert c.is_fully_replicated
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes() == np.asarray(c).tobytes()
    assert any("tensor" in x.sharding.spec for x in jax.tree.leaves(rollout))


def test_the_same_layout_is_not_copied():
    """Data parallel training and replicated rollout: the engine reads the params' own
    buffers (no copy, as the memory plan assumes: `meshes.another_layout`)."""
    w = wiring.Colocated(_host(), TrainConfig())
    cfg = model_config.tiny()
    params = jax.device_put(params_lib.init(cfg, jax.random.key(0)),
                            weight_shardings(cfg, w.train_mesh, w.train_rules))
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(w.rollout_weights(params))):
        assert a is b


def test_the_move_never_holds_a_whole_replica():
    """FSDP 8 to tp 8, every weight with a model-width axis split 8 ways on both sides (8 q
    and kv heads): XLA's program for the move needs no more than a device's share of the
    source and of the target (all-to-alls): at most a quarter of the whole replica that the
    move through `meshes.replicated` held on every device."""
    cfg = dataclasses.replace(model_config.tiny(), hidden_size=256, intermediate_size=1024,
                              vocab_size=4096, num_attention_heads=8, num_key_value_heads=8)
    devices = jax.devices()[:8]
    train = make_mesh({"data": 1, "fsdp": 8}, devices)
    rollout = make_mesh({"data": 1, "tensor": 8}, devices)
    src = weight_shardings(cfg, train, RULES["train_fsdp"])
    dst = weight_shardings(cfg, rollout, RULES["rollout_tp"])
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            params_lib.abstract(cfg), src)
    moving, program = meshes.layout_program(abstract, dst)
    leaves = jax.tree.leaves(abstract)
    assert 0 < len(moving) < len(leaves)  # the norm scales are replicated in both: kept
    compiled = program.lower([leaves[i] for i in moving]).compile()
    m = compiled.memory_analysis()
    targets = jax.tree.leaves(dst)
    share = memory_plan.device_bytes([leaves[i] for i in moving])
    copy = memory_plan.device_bytes([jax.ShapeDtypeStruct(leaves[i].shape, leaves[i].dtype,
                                                          sharding=targets[i]) for i in moving])
    assert copy <= m.output_size_in_bytes < copy + 1024  # and the output tuple's pointers
    assert m.temp_size_in_bytes <= share + copy <= 4 * cfg.num_params() / 4




@pytest.mark.parametrize("spans_hosts", [False, True], ids=["fsdp-in-host", "fsdp-spans-hosts"])
def test_publish_copies_shards_to_host_never_a_whole_replica(spans_hosts, monkeypatch):
    """The Ray learner's publish (`RemoteSource._whole`, through `meshes.host_copy`) of FSDP 8
    params: numpy with the bits the old gather (`replicated` on every device, then one
    host copy) gave, and each leaf reaches host memory from shards, never from a whole copy
    on every device. One host holding every fsdp shard copies them out as they are (no
    device program at all). An fsdp group spanning hosts, simulated here as the 8 devices
    in 4 "hosts" x 2 (one process cannot have 2 hosts; the 2-process run is
    test_ray_modes' `test_disaggregated_fsdp_*`), moves each leaf to a copy per host split
    over its 2 devices: half a leaf per device."""
    pytest.importorskip("ray")
    from locojax.fleet.learner import RemoteSource

    cfg = model_config.tiny()
    mesh = make_mesh({"data": 1, "fsdp": 8}, jax.devices()[:8])
    params = jax.device_put(params_lib.init(cfg, jax.random.key(0)),
                            weight_shardings(cfg, mesh, RULES["train_fsdp"]))
    want = host_local(meshes.replicated(params, mesh))
    copied = []

    def assemble(x):
        copied.append(x)
        return real_assemble(x)

    real_assemble = meshes.assemble
    monkeypatch.setattr(meshes, "assemble", assemble)
    if spans_hosts:
        monkeypatch.setattr(meshes, "_every_host_holds_it", lambda x: False)
        monkeypatch.setattr(meshes, "_hosts_grid", lambda: np.asarray(jax.devices()[:8])
                            .reshape(4, 2))
    else:
        def no_program(*a, **k):
            raise AssertionError("a device program ran: every shard was already here")
        monkeypatch.setattr(meshes, "to_layout", no_program)
    got = RemoteSource._whole(None, params)  # the method reads nothing of its instance
    for a, b, x, p in zip(jax.tree.leaves(got), jax.tree.leaves(want), copied,
                          jax.tree.leaves(params), strict=True):
        assert isinstance(a, np.ndarray) and a.tobytes() == b.tobytes()
        if not p.is_fully_replicated:  # a sharded weight: never whole on every device
            assert not x.is_fully_replicated, x.sharding
            share = max(s.data.size for s in x.addressable_shards)
            assert share == x.size // (2 if spans_hosts else 8), (x.shape, x.sharding)
    assert sum(not p.is_fully_replicated for p in jax.tree.leaves(params)) >= 6  # not vacuous

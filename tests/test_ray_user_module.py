"""The user's task and reward modules reach every Ray actor (envs/user.py, fleet/driver.py):
the driver ships them through Ray's runtime_env `py_modules`, and `disaggregated`, `async`
and `controller` runs from a project directory of the user's score every row with its
TRL-style reward (module:function and file.py:function), next to GSM8K's flexible
correctness on the rows' answer column, in their rollout workers and verifiers. On a second
Ray node, where the user's file is not, a worker imports the shipped copy."""

import json
import os
import subprocess
import sys

import pytest

from locojax.envs import user

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REWARD = ("def by_length(completions, **kwargs):\n"
          "    return [min(len(c), 8) / 8 for c in completions]\n")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's project directory: rows, a reward module, a package with a reward."""
    (tmp_path / "rows.jsonl").write_text(
        "".join(json.dumps({"prompt": f"{i}+{i}=", "answer": 2 * i}) + "\n" for i in range(8)))
    (tmp_path / "my_rewards.py").write_text(REWARD)
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_pkg" / "scores.py").write_text(REWARD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("my_rewards", "my_pkg", "my_pkg.scores"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def test_shipped_modules_are_the_users_files_and_packages(project):
    assert user.shipped_modules(["my_rewards:by_length", "my_pkg.scores:by_length",
                                 f"{project / 'my_rewards.py'}:by_length", "json:dumps",
                                 "locojax.envs.gsm8k:reward"]) \
        == [str(project / "my_rewards.py"), str(project / "my_pkg")]


def test_the_driver_ships_the_modules_the_config_names(project):
    pytest.importorskip("ray")
    from locojax.envs.registry import TaskConfig
    from locojax.fleet.driver import user_modules
    from locojax.train.config import RunConfig

    cfg = RunConfig(task=TaskConfig(name="data", data="rows.jsonl",
                                    reward=("my_pkg.scores:by_length",)))
    assert user_modules(cfg) == {"py_modules": [str(project / "my_pkg")]}
    assert user_modules(RunConfig()) == {}


def test_a_file_reference_imports_the_shipped_module_where_its_path_is_missing(project):
    """On a node without the driver's files, Ray put the shipped `my_rewards.py` on the path."""
    sys.path.insert(0, str(project))
    fn = user.load_ref("/no/such/dir/my_rewards.py:by_length")
    assert fn(completions=["abcd"]) == [0.5]
    with pytest.raises(ValueError, match="no such file"):
        user.load_ref("/no/such/dir/other_name.py:by_length")


def _train(project, mode, reward, *args):
    cmd = [sys.executable, "-m", "locojax.cli", "train", "demo", "--model", "tiny",
           "--mode", mode, "--steps", "2", "--rollout.prompts-per-step", "4",
           "--algo.group-size", "2", "--rollout.max-new-tokens", "8", "--eval.every", "0",
           "--no-progress", "--no-tensorboard", "--task.name", "data",
           "--task.data", "rows.jsonl", "--task.reward", "flexible", reward,
           "--rollout.max-prompt-tokens", "auto", "--run-dir", str(project / "run"),
           "--ray-cpus", "2", *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))
    out = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in open(project / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # every row scored by GSM8K's flexible reward and the user's function
        assert r["reward/errors"] == 0 and 0 <= r["reward/by_length/mean"] <= 1, r
        assert 0 <= r["reward/correct_flexible/mean"] <= 1, r
    return out


@pytest.mark.ray
@pytest.mark.slow
def test_disaggregated_scores_with_a_module_reference(project):
    _train(project, "disaggregated", "my_rewards:by_length")


@pytest.mark.ray
@pytest.mark.slow
def test_async_scores_with_a_file_reference_in_a_package(project):
    _train(project, "async", "my_pkg/scores.py:by_length", "--max-staleness", "1")


@pytest.mark.ray
@pytest.mark.slow
def test_controller_scores_with_a_file_reference(project):
    """The controller admits and scores every row itself, while its hosts build the task
    (the rows, the reward references) from the config: both need the user's file."""
    _train(project, "controller", "my_rewards.py:by_length", "--hosts", "2")


@pytest.mark.ray
@pytest.mark.slow
def test_a_worker_on_a_second_node_imports_the_shipped_file(project):
    """Two Ray nodes on this machine (`ray.cluster_utils.Cluster`): the driver joins as a
    run does (`driver.connect`, `--ray-address`), the user's file is then deleted, and a task
    placed on the second node still loads `my_rewards.py:by_length` by its driver path. Only
    the copy Ray shipped can serve it: the path is gone and the project is on no path there."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from locojax.envs.registry import TaskConfig
    from locojax.fleet import driver
    from locojax.train.config import RunConfig
    from locojax.train.placement_config import PlacementConfig

    ref = f"{project / 'my_rewards.py'}:by_length"
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        second = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        cfg = RunConfig(task=TaskConfig(name="data", data="rows.jsonl", reward=(ref,)),
                        placement=PlacementConfig(ray_address=cluster.address))
        assert not driver.connect(cfg)  # joined, not started: the cluster is the test's
        (project / "my_rewards.py").unlink()

        @ray.remote(num_cpus=1, scheduling_strategy=NodeAffinitySchedulingStrategy(
            second.node_id, soft=False))
        def load(ref):
            import importlib.util

            from locojax.envs import user
            fn = user.load_ref(ref)
            return (ray.get_runtime_context().get_node_id(), fn(completions=["abcd"]),
                    importlib.util.find_spec("my_rewards").origin)

        node, values, origin = ray.get(load.remote(ref), timeout=120)
        assert node == second.node_id and values == [0.5]
        assert not origin.startswith(str(project))  # Ray's copy, not the deleted file
    finally:
        ray.shutdown()
        cluster.shutdown()

"""The dispatcher refuses a result made with other bytes than its lease named (issue 23,
"versions are bytes, not numbers").

After a learner restart, async publishes versions again under the same numbers, and their
bytes may differ. A worker that kept its copy of version v by number would generate with
the old bytes; `rollout_worker.needs_pull` makes it pull again (tests/test_leases.py), and
the dispatcher checks the checksum each result says it was made with against its lease's,
so such rows never reach the learner. With in-flight updates (issue 59) a result also names
every version it took mid-unit, and each must carry the checksum its version was published
with. The end-to-end restart (test_ray_modes) meets this
case only when timing makes the bytes differ; here a stand-in worker always answers with
other bytes, so the dispatcher's check is exercised every time.
"""

import dataclasses
import os

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ray = pytest.importorskip("ray")

from locojax.fleet.dispatcher import Dispatcher
from locojax.fleet.placement import PlacementPlan, Schedule


@dataclasses.dataclass
class _Record:
    version: int


@ray.remote(num_cpus=0)
class _KeptItsCopy:
    """A worker that generates every lease with the bytes it held before the restart."""

    def ready(self, prompts_per_lease: int) -> int:
        return os.getpid()

    def produce(self, lease):
        return _Record(lease.version), "0ld0ld00", {}


@ray.remote(num_cpus=0)
class _TookOtherBytesInFlight:
    """A worker that starts with the lease's bytes and, in flight, takes version 1 with
    bytes the learner did not publish under that number."""

    def ready(self, prompts_per_lease: int) -> int:
        return os.getpid()

    def produce(self, lease):
        return _Record(lease.version), lease.digest, {1: "0ld0ld11"}


@pytest.fixture(scope="module")
def cluster():
    # The stand-in worker is defined here: the cluster's processes import it from tests/.
    tests = os.path.dirname(os.path.abspath(__file__))
    ray.init(num_cpus=1, include_dashboard=False, logging_level="WARNING",
             runtime_env={"env_vars": {"PYTHONPATH": tests}})
    try:
        yield
    finally:
        ray.shutdown()



def _one_worker_async(worker):
    """A dispatcher of async's plan (1 learner host, `worker` the one rollout worker, k = 2,
    4 prompts a lease) that the tests drive by hand."""
    plan = PlacementPlan(mode="async", learner_hosts=1, workers=1, devices_per_host=1,
                         prompts_per_lease=4, schedule=Schedule(1, 2, True),
                         lease_timeout_s=60.0, verifiers=1)
    return Dispatcher.options(num_cpus=0).remote(plan, 4, 1, [worker])

def test_a_result_made_with_other_bytes_stops_the_run(cluster):
    dispatcher = _one_worker_async(_KeptItsCopy.remote())
    try:
        ray.get(dispatcher.begin.remote(0, None, None))
        ray.get(dispatcher.published.remote(0, "c0ffee00"))  # version 0, republished bytes
        with pytest.raises(ray.exceptions.RayTaskError,
                           match=r"worker 0 generated lease \d+ \(step 0 unit 0\) with weights "
                                 r"of checksum 0ld0ld00, but the lease named version 0 with "
                                 r"checksum c0ffee00"):
            ray.get(dispatcher.take.remote(0, 0, 1, 60.0))
    finally:
        ray.get(dispatcher.stop.remote())


def test_a_version_taken_in_flight_with_other_bytes_stops_the_run(cluster):
    dispatcher = _one_worker_async(_TookOtherBytesInFlight.remote())
    try:
        ray.get(dispatcher.begin.remote(0, None, None))
        ray.get(dispatcher.published.remote(0, "c0ffee00"))
        ray.get(dispatcher.published.remote(1, "c0ffee11"))
        with pytest.raises(ray.exceptions.RayTaskError,
                           match=r"worker 0 took weight version 1 \(checksum 0ld0ld11\) in "
                                 r"flight for lease \d+ \(step 0 unit 0\), but the learner "
                                 r"published it with checksum c0ffee11"):
            ray.get(dispatcher.take.remote(0, 0, 1, 60.0))
    finally:
        ray.get(dispatcher.stop.remote())

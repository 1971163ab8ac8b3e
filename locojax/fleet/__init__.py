"""The Ray modes: `controller` (the single-controller baseline), `disaggregated` (LoCoJAX-DA)
and `async` (RLAX-style parameter server).

`controller.py` drives `--mode controller`: one central controller admits, dispatches,
gathers and scores every row for host actors (`controller_host.py`) that train as
colocated's hosts do. The other two share what follows.

One mechanism with three settings (placement, max staleness k, versions kept): rollout
workers produce leased units of work into a versioned buffer, the learner group consumes it
oldest step first with the same `Trainer` loop as colocated, and weights travel learner →
parameter server → workers as whole checksummed versions. A producer, a queue, a consumer;
what crosses is a `train.record.RolloutRecord`.

The plain parts (no Ray; tests drive them directly):

    placement.py         settings, the checked placement plan and the version schedule
    leases.py            leased units of work, the staleness gate, redispatch, the ledger
    buffer.py            finished units by step, host shares, the staleness histogram
    versions.py          checksummed weight versions, the newest-K store, the transport protocol
    inflight.py          in-flight updates: a newer version between decode chunks, per token
    faults.py            fault injection for the preemption tests
    actors.py            what every actor shares: log prefix, CPU requests, environment

One file per actor role (the only modules that import Ray):

    driver.py            start / join Ray, place the actors, supervise the learner group
    learner.py           the learner group: `Trainer` with a `RemoteSource` (take / publish)
    dispatcher.py        leases units to workers, keeps the buffer, paces admission by k
    rollout_worker.py    an engine on its own devices, producing leased units
    verifier.py          the reward pool the workers score with
    parameter_server.py  the newest K versions, and the object-store weight transport
"""

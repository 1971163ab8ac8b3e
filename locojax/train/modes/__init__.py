"""The Ray modes, `disaggregated` (LoCoJAX-DA) and `async` (RLAX-style parameter server).

One mechanism with three settings (placement, max staleness k, versions kept; see
`train/placement.py` and `train/leases.py`): rollout workers produce leased units of work
into a versioned buffer, the learner group consumes it oldest step first with the same
`Trainer` loop as colocated, and weights travel learner → parameter server → workers as
whole checksummed versions. These are the only modules that import Ray.

    driver.py       start / join Ray, place the actors, supervise the learner group, clean up
    learner.py      the learner group: `Trainer` with a `RemoteSource` (take / publish)
    dispatcher.py   leases units to workers, keeps the buffer, paces admission by k
    workers.py      rollout workers (engine on their own devices) and the verifier pool
    transport.py    the parameter server and the object-store weight transport
    faults.py       fault injection for the preemption tests
    roles.py        log prefixes, fractional CPU requests, forwarded environment
"""

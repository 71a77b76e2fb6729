"""The PersistentPipeline operator (kopf): keeps each pipeline's Spark driver running,
resuming from its stored state, with a strictly increasing epoch per launch.

Layers, from the edge inward (import contracts in pyproject.toml, checked by make lint):

    __main__            flags and settings, kopf.run
    handlers            kopf handlers: glue, and kopf errors at the edge
    reconcile           read live, decide, record, act (blocking, one pipeline at a time)
    kube | metrics | wakeups | settings
                        the API server (the only module that talks to it), Prometheus,
                        wake-up flags, the operator's settings
    status              the resource's status <-> the decision's memory
    lifecycle           next_action(observed, tunables): the pure decision function
    policy              backoff, state roots, health (pure)
    memory | builders   what status remembers; pods, services, injected config (pure)
    observe             pods and driver reports as plain values (pure)
    spec                the spec as frozen dataclasses, with its semantic checks (pure)
    names | errors      names, labels, annotations; domain errors
"""

"""The broker's state, in tables that hold no reference back to the broker: the models and
the table published to frontends, worker instances, requests in flight, client regions,
frontend leases, cancellable requests."""

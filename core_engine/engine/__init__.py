"""The engine core: requests, the KV block pool, the scheduler and its policies, the runner, step()."""

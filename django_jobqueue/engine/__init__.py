"""The machinery of the queue: not API, free to change from one release to the next.

What users import lives at the root of the package (`enqueuing`, `control`, `context` and
`events` there re-export their documented names from here). The engine imports none of the
root's public modules, nor the worker, the admin or the commands (import-linter contracts in
pyproject.toml); its own layers, top down: `outcomes`, `attempts`, the running job
(`context`, `durable`, `maps`, `fanout`, `budgets`), writing jobs (`control`, `enqueuing`),
then a job's transitions (`leases`, `suspensions`, `workflows`, `events`, `sequences`,
`map_children`, `quarantine`). See docs/content/concepts/architecture.md.
"""

"""The benchmarks outside the workflow: every method on the bundled model (``python -m pipeline.bench``), the
runners' forward costs, drafts' losses, union-vocabulary ensembles, and docs/benchmarks.md from their records
(docs/benchmarks.md)."""

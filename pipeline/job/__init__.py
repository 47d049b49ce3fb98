"""A cell's jobs, each a step of the workflow's DAG: generation (with its journal), the speed judge, the exactness
check, scoring, the log-likelihood job and the lm-eval model (docs/workflow.md, docs/scoring.md)."""

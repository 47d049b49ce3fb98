"""An experiment before any job: its config read and checked, expanded into cells, its models checked from their
files (the preflight), its cost forecast (docs/workflow.md, docs/cluster.md)."""

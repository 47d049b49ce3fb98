"""What a results directory shows: its figures collected once, the tables, plots and results file made from
them, W&B logging, and where an experiment stands (docs/workflow.md)."""

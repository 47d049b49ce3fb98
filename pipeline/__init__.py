"""Fast LLM ensembles through speculation: decoder, models, tasks and workflow glue."""

from pathlib import Path

__version__ = "0.1.0"
ROOT = Path(__file__).resolve().parents[1]  # the project: config/, workflow/, tasks/, docs/, benchmarks/

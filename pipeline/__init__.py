"""Fast LLM ensembles through speculation: decoder, models, tasks and workflow glue."""

__version__ = "0.1.0"

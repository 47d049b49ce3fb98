"""Whether the Hugging Face hub may be asked: read by the tasks (their splits) and the models (their files)."""

from __future__ import annotations

import os


def offline() -> bool:
    """Whether the Hugging Face hub is off (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``)."""
    return any(
        os.environ.get(k, "").lower() in ("1", "true", "yes") for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )

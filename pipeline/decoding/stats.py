"""What a generation records."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ModelStats:
    """Counters of one model (one runner)."""

    forward_calls: int = 0
    forwarded_tokens: int = 0
    forward_time_s: float = 0.0
    proposed: int = 0  # tokens this model drafted (including ones discarded unverified)
    verified: int = 0  # of those, how many reached verification
    accepted: int = 0  # of those, how many were accepted

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.verified if self.verified else None


@dataclass
class GenerationStats:
    method: str
    prompt_tokens: int = 0
    new_tokens: int = 0
    models: list[ModelStats] = field(default_factory=list)
    proposers: dict[str, ModelStats] = field(default_factory=dict)  # proposers that are not models
    rounds: int = 0  # verification rounds (blocks of proposals checked against the target)
    accepted: int = 0  # proposals accepted, all proposers together
    wall_time_s: float = 0.0
    time_to_first_token_s: float | None = None
    stop_reason: str = ""

    @property
    def mean_accepted_per_round(self) -> float | None:
        return self.accepted / self.rounds if self.rounds else None

    @property
    def forward_time_s(self) -> float:
        return sum(m.forward_time_s for m in self.models)

    @property
    def overhead(self) -> float | None:
        """Share of wall time spent outside model forwards."""
        return 1.0 - self.forward_time_s / self.wall_time_s if self.wall_time_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for d, m in zip(out["models"], self.models):
            d["acceptance_rate"] = m.acceptance_rate
        for name, m in self.proposers.items():
            out["proposers"][name]["acceptance_rate"] = m.acceptance_rate
        out["mean_accepted_per_round"] = self.mean_accepted_per_round
        out["forward_time_s"] = self.forward_time_s
        out["overhead"] = self.overhead
        return out

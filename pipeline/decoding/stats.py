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
    propose_time_s: float = 0.0  # a proposer that runs no network: seconds spent proposing and learning

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
    position_verified: list[int] = field(default_factory=list)  # [j]: blocks whose (j+1)-th proposal was checked
    position_accepted: list[int] = field(default_factory=list)  # [j]: ... and accepted
    tree_nodes: int = 0  # token trees (tree/loop.py): nodes verified, all rounds together
    accept_time_s: float = 0.0  # the acceptance rule: its tests, the residual's and the bonus token's draws
    trim_time_s: float = 0.0  # the models' caches cut back to the accepted tokens after a rejection
    wall_time_s: float = 0.0  # with the device synchronised before the clock is read
    device_time_s: float | None = None  # on a GPU: CUDA events around the whole decode
    time_to_first_token_s: float | None = None
    stop_reason: str = ""
    union_size: int = 0  # models with different tokenizers: the size of the union vocabulary (0: one vocabulary)
    union_map_s: float = 0.0  # ... and the seconds spent mapping the members' rows into it
    # the sum over the emitted tokens' positions of the target's largest probability there, and their count
    # (``ceiling``); greedy, the target is one-hot at its argmax: 1 at every position
    ceiling_sum: float = 0.0
    ceiling_positions: int = 0

    def record_round(self, count: int, accepted: int) -> None:
        """One verification round: ``count`` proposals checked in order, the first ``accepted`` accepted."""
        self.rounds += 1
        self.accepted += accepted
        reached = min(accepted + 1, count)
        grow = reached - len(self.position_verified)
        if grow > 0:
            self.position_verified += [0] * grow
            self.position_accepted += [0] * grow
        for j in range(reached):
            self.position_verified[j] += 1
            self.position_accepted[j] += j < accepted

    def record_ceiling(self, target: Any, positions: int) -> None:
        """The target's probabilities ``[positions, V]`` at positions whose tokens are emitted (None: greedy)."""
        self.ceiling_sum += positions if target is None else float(target.amax(dim=-1).sum())
        self.ceiling_positions += positions

    @property
    def ceiling(self) -> float | None:
        """The mean of max_x p(x) over the emitted tokens' positions: the acceptance rate of the best one-hot
        proposer at this temperature (a one-hot proposal x is accepted with probability p(x)); 1 when greedy."""
        return self.ceiling_sum / self.ceiling_positions if self.ceiling_positions else None

    @property
    def tau(self) -> float | None:
        """Mean accepted length: new tokens per forward of the large model (models[0]); 1.00 autoregressively."""
        calls = self.models[0].forward_calls if self.models else 0
        return self.new_tokens / calls if calls else None

    @property
    def forward_time_s(self) -> float:
        """The models' forwards and those of proposers that run a network of their own (a feature head)."""
        return sum(m.forward_time_s for m in self.models) + sum(p.forward_time_s for p in self.proposers.values())

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
        out["tau"] = self.tau
        out["ceiling"] = self.ceiling
        out["forward_time_s"] = self.forward_time_s
        out["overhead"] = self.overhead
        return out

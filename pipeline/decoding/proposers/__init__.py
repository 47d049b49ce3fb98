"""Proposers: the base every proposer shares (``base.py``) and the named ones, one module each in this folder.

Every module here is imported with the package (``discover``), and its proposers register themselves by name
(``register_proposer``, with the arguments the exactness suites run it with: ``ProposerTests``): a new proposer is
one module dropped in this folder, with no import line elsewhere and no test edited (docs/extending.md, "Add a
proposer").
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import (
    DRAFT,
    NAMED_PROPOSERS,
    PROPOSER_TESTS,
    Capabilities,
    Chain,
    ConformanceKind,
    ModelProposer,
    NamedProposer,
    Proposal,
    Proposer,
    ProposerKind,
    ProposerSetup,
    ProposerTests,
    build,
    capabilities,
    close,
    conformance_kinds,
    conformance_proposers,
    drafts_trees,
    parse_proposer,
    parts,
    register_proposer,
    tree_proposer_problem,
)

__all__ = [
    "DRAFT",
    "NAMED_PROPOSERS",
    "PROPOSER_TESTS",
    "Capabilities",
    "Chain",
    "ConformanceKind",
    "ModelProposer",
    "NamedProposer",
    "Proposal",
    "Proposer",
    "ProposerKind",
    "ProposerSetup",
    "ProposerTests",
    "build",
    "capabilities",
    "close",
    "conformance_kinds",
    "conformance_proposers",
    "drafts_trees",
    "parse_proposer",
    "parts",
    "register_proposer",
    "tree_proposer_problem",
]


def discover() -> tuple[str, ...]:
    """Import every module of this folder but the base (each registers its proposers); their names."""
    names = tuple(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base" and not m.name.startswith("_"))
    for name in names:
        importlib.import_module(f"{__name__}.{name}")
    return names


MODULES = discover()  # the built-in proposers' modules: lookup, suffix, recycle, feature (the EAGLE-style head)

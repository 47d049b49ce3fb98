"""Ensembles: the registry and the contract every ensemble function keeps (``base.py``) and the registered ones,
one module each in this folder: the weighted ensemble (``we.py``), contrastive decoding (``cd.py``) and the gated
ensemble (``gac.py``).

Every module here is imported with the package (``discover``), and its ensembles register themselves by name
(``register_ensemble``, with the arguments the exactness suites run them with: ``test_args``): a new ensemble is
one module dropped in this folder, with no import line elsewhere and no test edited (docs/extending.md).
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import (
    ENSEMBLES,
    Ensemble,
    EnsembleOutputError,
    check_output,
    check_rows,
    check_weights,
    conformance_ensembles,
    finite,
    register_ensemble,
    single_model,
    target_name,
)

__all__ = [
    "ENSEMBLES",
    "Ensemble",
    "EnsembleOutputError",
    "check_output",
    "check_rows",
    "check_weights",
    "conformance_ensembles",
    "finite",
    "register_ensemble",
    "single_model",
    "target_name",
]

BUILT_IN = ("we", "cd", "gac")  # in the order the methods have always been listed; any other module after them


def discover() -> tuple[str, ...]:
    """Import every module of this folder but the base (each registers its ensembles); their names."""
    found = {m.name for m in pkgutil.iter_modules(__path__) if m.name != "base" and not m.name.startswith("_")}
    names = (*(n for n in BUILT_IN if n in found), *sorted(found - set(BUILT_IN)))
    for name in names:
        importlib.import_module(f"{__name__}.{name}")
    return names


MODULES = discover()

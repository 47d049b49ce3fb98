"""Token trees (docs/trees.md): the round loop (``loop.py``), shapes (``shape.py``), nodes (``nodes.py``), the
drafter (``draft.py``), forwards over a tree (``cache.py``) and the acceptance rule over it (``verify.py``)."""

"""How speed is measured: timing a run and its interference signals, speed-ups with their intervals, acceptance,
the cost of a forward and of a token tree (docs/speed.md)."""

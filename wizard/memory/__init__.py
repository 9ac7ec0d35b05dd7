"""Memory per rank: the estimate before a run (estimate.py), and whether and how it fits a card (fit.py)."""

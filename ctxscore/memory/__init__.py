"""Memory beside the history: the fact ledger (facts.py extracts, ledger.py keeps and shows them)."""

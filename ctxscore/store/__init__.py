"""Stores: the Store protocol, retrieval shared by every store (terms, ranked lists, fusion), SQLite."""

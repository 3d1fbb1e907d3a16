"""Scoring: the Scorer protocol, the rules, the one featurizer, embedders, learned heads and their package."""

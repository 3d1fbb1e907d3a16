"""Evaluation of ctxscore: replay held-out sessions through context policies at token budgets.

Answers: at a given budget, is the key information still in the window, and what does it cost
compared with keeping everything or with a sliding window? See :mod:`eval.cli` for the commands,
:mod:`eval.sessions` for the session format, :mod:`eval.metrics` for the definitions.
"""

"""ctxscore training side: dataset building (:mod:`training.data`), weak labels, training, MLflow.

Nothing here is imported by the runtime package ``ctxscore``; imports go ``training -> ctxscore``.
"""

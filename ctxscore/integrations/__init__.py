"""Integrations with agent frameworks (LangChain: :mod:`ctxscore.integrations.langchain`)."""

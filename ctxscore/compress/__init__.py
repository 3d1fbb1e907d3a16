"""Compressors behind one protocol, checked by one shared verifier (extractive ones here; the LLM one in ``ctxscore.llm``)."""

from .extractive import CompressionResult, aggressive_compress, archive_stub, compress, structured_summary

__all__ = ["CompressionResult", "aggressive_compress", "archive_stub", "compress", "structured_summary"]

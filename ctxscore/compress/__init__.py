"""Compressors behind one protocol, checked by one shared verifier (extractive ones here; the LLM one in ``ctxscore.llm``)."""

from .base import COMPRESSING_TIERS, CompressionResult, Compressor, compress_verified
from .extractive import ExtractiveCompressor, aggressive_compress, archive_stub, compress, structured_summary
from .verify import Verdict, key_spans, verify

__all__ = [
    "COMPRESSING_TIERS", "CompressionResult", "Compressor", "ExtractiveCompressor", "Verdict", "aggressive_compress",
    "archive_stub", "compress", "compress_verified", "key_spans", "structured_summary", "verify",
]

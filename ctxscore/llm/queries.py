"""The LLM query writer for page-in (off by default): the current request as keyword and paraphrase
queries for the store's hybrid search.

The design note asks an LLM to write the recall queries ("至少也要大模型来撰写召回细节的关键字"):
a request such as "which flight did we settle on?" shares few words with the message it needs
("Booked HAT136 ..."). :meth:`LLMQueryWriter.expand` returns one query string -- the request, then
its keywords and paraphrases -- for ``ContextManager.build(query=...)``: the keyword search ORs its
terms (bm25) and the vector search embeds the whole text. Call it before ``build`` (it waits on the
network, up to the client's timeout); on any failure it returns the request unchanged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError
from .client import LLMClient, LLMError
from .prompts import QUERY_RULES, parse_json_object

log = logging.getLogger("ctxscore")


@dataclass(frozen=True)
class Queries:
    """The queries written for one request.

    Attributes:
        request: the request as given.
        keywords: keyword queries (distinct, in the LLM's order).
        paraphrases: paraphrases of the request.
        ok: the LLM answered and the answer could be read (else both lists are empty).
    """

    request: str
    keywords: tuple[str, ...] = field(default=())
    paraphrases: tuple[str, ...] = field(default=())
    ok: bool = False

    def combined(self) -> str:
        """The request followed by the keywords and the paraphrases, one per line (a ``build`` query)."""
        return "\n".join(dict.fromkeys([self.request, *self.keywords, *self.paraphrases]))


class LLMQueryWriter:
    """Writes recall queries with an LLM (see the module docstring).

    Args:
        client: the :class:`~ctxscore.llm.client.LLMClient`.
        max_keywords: keyword queries kept (>= 0).
        max_paraphrases: paraphrases kept (>= 0).
        max_chars: characters of the request and of each context message sent.

    Raises:
        ConfigError: a negative count.
    """

    def __init__(self, client: LLMClient, *, max_keywords: int = 8, max_paraphrases: int = 3, max_chars: int = 2000) -> None:
        for name, v in (("max_keywords", max_keywords), ("max_paraphrases", max_paraphrases)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{name} must be an integer >= 0, got {v!r}")
        self.client, self.max_keywords, self.max_paraphrases, self.max_chars = client, max_keywords, max_paraphrases, max_chars
        self.failures = 0

    def write(self, request: str, context: Sequence[str] = ()) -> Queries:
        """The keyword and paraphrase queries of ``request`` (``context``: recent messages, optional).

        Never raises for the endpoint's sake: a failed request or an unreadable answer gives
        ``Queries(request, ok=False)`` and one log line.

        Raises:
            ConfigError: ``request`` is not a string.
        """
        if not isinstance(request, str):
            raise ConfigError(f"request must be a string, got {type(request).__name__}")
        if not request.strip():
            return Queries(request)
        payload = {"request": request[: self.max_chars], "context": [c[: self.max_chars // 4] for c in context][-4:]}
        try:
            answer = self.client.complete_text(QUERY_RULES, json.dumps(payload, ensure_ascii=False))
            obj = parse_json_object(answer.text)
            kws = _strings(obj.get("keywords"), "keywords")[: self.max_keywords]
            paras = _strings(obj.get("paraphrases"), "paraphrases")[: self.max_paraphrases]
        except (LLMError, ValueError) as exc:
            self.failures += 1
            log.warning("llm query writer: %s; searching with the request alone", exc)
            return Queries(request)
        except Exception:  # noqa: BLE001 - page-in must never fail for the query writer's sake
            self.failures += 1
            log.exception("llm query writer: unexpected error; searching with the request alone")
            return Queries(request)
        return Queries(request, tuple(kws), tuple(paras), ok=True)

    def expand(self, request: str, context: Sequence[str] = ()) -> str:
        """:meth:`write` as one query string for ``ContextManager.build(query=...)``."""
        return self.write(request, context).combined()


def _strings(v: object, what: str) -> list[str]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise ValueError(f"{what!r} is not a list")
    return list(dict.fromkeys(s.strip() for s in v if isinstance(s, str) and s.strip()))

"""The README's examples of the three ways to use ctxscore (library, proxy, LangChain), run as written
against a fake OpenAI-compatible server on loopback (only the endpoint's URL and port are put in)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = re.compile(r"<!-- example: (?P<name>[\w-]+) -->\n```(?P<lang>\w+)\n(?P<code>.*?)```", re.DOTALL)


def examples() -> dict[str, str]:
    return {m["name"]: m["code"] for m in EXAMPLE.finditer((REPO / "README.md").read_text(encoding="utf-8"))}


def run_python(code: str, **env: object) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), dict(env))  # noqa: S102 - the README's own example
    return out.getvalue()


def test_the_readme_has_an_example_for_each_way():
    assert set(examples()) == {"library", "llm", "proxy-cli", "proxy-client", "langchain"}


def test_library_example():
    out = run_python(examples()["library"])
    assert len(out.splitlines()) == 4  # one decision line per message
    assert "instruction" in out


def universal(body: dict) -> str:
    """A fake LLM for the compressor, the classifier and the query writer, told apart by their prompts."""
    from ctxscore.compress import key_spans
    from ctxscore.llm.prompts import CLASSIFIER_RULES, COMPRESSOR_RULES, QUERY_RULES

    system, user = body["messages"][0]["content"], json.loads(body["messages"][1]["content"])
    if system.startswith(COMPRESSOR_RULES):
        return json.dumps({"items": [{"id": it["id"], "form": "; ".join(key_spans(it["text"]))} for it in user["items"]]})
    if system == CLASSIFIER_RULES:
        return json.dumps({"items": [{"id": it["id"], "category": "instruction", "importance": 3} for it in user["items"]]})
    assert system == QUERY_RULES
    return json.dumps({"keywords": ["flight", "booked"], "paraphrases": ["the flight we booked"]})


def test_llm_example(monkeypatch):
    pytest.importorskip("openai")
    with FakeOpenAI(universal) as f:
        monkeypatch.setenv("CTXSCORE_LLM_BASE_URL", f.url)
        monkeypatch.setenv("CTXSCORE_LLM_MODEL", "fake-model")
        monkeypatch.setenv("CTXSCORE_LLM_API_KEY", "sk-test")
        out = run_python(examples()["llm"])
        systems = [r["messages"][0]["content"] for r in f.chat_requests()]
    tokens, requests = out.split()[:2]
    assert int(tokens) > 0 and int(requests) == len(systems) >= 1
    assert systems[-1].startswith("You write search queries")  # the query writer ran for the build


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_proxy_examples(monkeypatch):
    pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    ex = examples()
    (line,) = [ln for ln in ex["proxy-cli"].splitlines() if ln.strip()]
    with FakeOpenAI() as f:
        port = _free_port()
        cmd = shlex.split(line.replace("https://api.openai.com/v1", f.url).replace("--port 8000", f"--port {port}"))
        assert cmd[:2] == ["ctxscore", "serve"]
        proc = subprocess.Popen([sys.executable, "-m", "ctxscore.cli", *cmd[1:]], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            import httpx

            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "ctxscore serve did not start"
                time.sleep(0.1)
            monkeypatch.setenv("OPENAI_API_KEY", "sk-readme")
            code = ex["proxy-client"].replace("http://127.0.0.1:8000", f"http://127.0.0.1:{port}")
            out = run_python(code)
        finally:
            proc.terminate()
            proc.wait(timeout=20)
        reqs = f.chat_requests()
    assert len(reqs) == 2 and reqs[1]["stream"] is True
    assert out.splitlines()[0] == "echo: And back on May 27?"  # the streamed answer
    assert reqs[1]["messages"][2] == {"role": "assistant", "content": "echo: Find me a flight to Seattle on May 20."}
    assert f.requests[0]["headers"]["authorization"] == "Bearer sk-readme"
    stats = eval(out.splitlines()[1])  # noqa: S307 - the dict the example printed
    assert stats["requests"] == 2 and stats["replies_recorded"] == 2 and stats["tokens_received"] > 0


def test_langchain_example():
    pytest.importorskip("langchain")
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage

    class Model(FakeMessagesListChatModel):
        def bind_tools(self, tools, **kw):
            return self

    model = Model(responses=[
        AIMessage("", tool_calls=[{"name": "search_flights", "args": {"to": "SEA"}, "id": "call_1"}]),
        AIMessage("HAT136 departs at 09:40."),
    ])
    env = {"model": model}
    exec(compile(examples()["langchain"], "README.md", "exec"), env)  # noqa: S102
    out = env["out"]
    assert [m.type for m in out["messages"]] == ["human", "ai", "tool", "ai"]
    assert out["messages"][-1].content == "HAT136 departs at 09:40."
    assert [m.type for m in env["window"]] == ["human", "ai", "tool", "ai"]


def test_runtime_import_stays_free_of_the_extras():
    code = ("import ctxscore, ctxscore.cli, ctxscore.window.manager\nimport sys\n"
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    assert not loaded & {"openai", "fastapi", "uvicorn", "httpx", "aiohttp", "starlette", "langchain", "langchain_core", "langgraph"}


@pytest.mark.parametrize("module, package, extra", [("ctxscore.serve", "fastapi", "serve"),
                                                    ("ctxscore.integrations.langchain", "langchain_core", "langchain")])
def test_extras_fail_with_the_install_hint(module, package, extra):
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] == {package!r}: raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "try:\n"
        f"    import {module}\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert f"pip install 'ctxscore[{extra}]'" in out

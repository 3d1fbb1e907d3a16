"""Small invented bugs for the coding-agent sessions (both languages).

Each spec is a coherent story in a made-up repository: the buggy source, a reproduction, a first
fix that breaks something, the second (final) fix, and the tool outputs along the way. The
repositories and their code are written for this project.
"""

from __future__ import annotations


def rc(code: int, output: str) -> str:
    """Tool output in the mini-SWE-agent style: ``<returncode>N</returncode>`` then ``<output>``."""
    return f"<returncode>{code}</returncode>\n<output>\n{output}</output>"


BUGS: list[dict] = [
    {
        "key": "paging",
        "repo": "pagekit",
        "path": "pagekit/paging.py",
        "func": "page_count",
        "test_path": "tests/test_paging.py",
        "n_tests": 12,
        "title_en": "page_count() returns one page too many when total is a multiple of page_size",
        "body_en": "With 20 items and page_size=10 the list view shows an empty third page: "
                   "page_count(20, 10) returns 3, expected 2.",
        "title_zh": "page_count() 在总数正好是 page_size 整数倍时多算一页",
        "body_zh": "20 条数据、每页 10 条时，列表页会多出一个空的第 3 页：page_count(20, 10) 返回 3，应该是 2。",
        "api_en": "the signature of `page_count(total, page_size)` must not change",
        "api_zh": "不要修改 `page_count(total, page_size)` 的函数签名",
        "late_en": "the ValueError message 'page_size must be positive' must stay exactly as it is",
        "late_zh": "报错信息 'page_size must be positive' 必须保持原样",
        "late_why_en": "the API gateway matches on that text",
        "late_why_zh": "网关那边是按这段文字匹配的",
        "listing": "README.md\npagekit/\npyproject.toml\ntests/\n\npagekit:\n__init__.py\nlinks.py\npaging.py\n\ntests:\ntest_links.py\ntest_paging.py\n",
        "grep": "pagekit/paging.py:4:def page_count(total: int, page_size: int) -> int:\n"
                "pagekit/links.py:12:    last = page_count(total, size)\n"
                "tests/test_paging.py:3:from pagekit.paging import page_count\n",
        "source": "     1\t\"\"\"Page arithmetic for list views.\"\"\"\n     2\t\n     3\t\n"
                  "     4\tdef page_count(total: int, page_size: int) -> int:\n"
                  "     5\t    \"\"\"Number of pages needed to show ``total`` items (at least one page).\"\"\"\n"
                  "     6\t    if page_size <= 0:\n"
                  "     7\t        raise ValueError(\"page_size must be positive\")\n"
                  "     8\t    return total // page_size + 1\n",
        "bug_line": "return total // page_size + 1",
        "repro": "from pagekit.paging import page_count\nprint(page_count(20, 10), page_count(21, 10), page_count(0, 10))\n",
        "repro_rc": 0,
        "repro_bug": "3 3 1\n",
        "repro_bug_span": "3 3 1",
        "repro_fixed": "2 3 1\n",
        "cause_en": "integer division already counts a full last page, so `+ 1` adds an extra page whenever total is an exact multiple",
        "cause_zh": "整除已经把刚好满的最后一页算进去了，`+ 1` 会在总数正好整除时多加一页",
        "fix1": ("    return total // page_size + 1\n", "    return -(-total // page_size)\n"),
        "fail_test": "test_empty_collection_has_one_page",
        "fail_out": "..F.........                                                             [100%]\n"
                    "=================================== FAILURES ===================================\n"
                    "______________________ test_empty_collection_has_one_page ______________________\n\n"
                    "    def test_empty_collection_has_one_page():\n"
                    ">       assert page_count(0, 10) == 1\nE       assert 0 == 1\n"
                    "E        +  where 0 = page_count(0, 10)\n\ntests/test_paging.py:19: AssertionError\n"
                    "=========================== short test summary info ============================\n"
                    "FAILED tests/test_paging.py::test_empty_collection_has_one_page - assert 0 == 1\n"
                    "1 failed, 11 passed in 0.04s\n",
        "fail_counts": "1 failed, 11 passed",
        "why_en": "an empty collection must still show one page (the docstring says 'at least one page'), and ceiling division gives 0 for total=0",
        "why_zh": "空列表也要显示一页（docstring 写的是“至少一页”），而向上取整在 total=0 时得到 0",
        "fix2": ("    return -(-total // page_size)\n", "    return max(1, -(-total // page_size))\n"),
        "fix2_code": "max(1, -(-total // page_size))",
        "diff": "diff --git a/pagekit/paging.py b/pagekit/paging.py\nindex 3f1c2a9..8d0e4b7 100644\n"
                "--- a/pagekit/paging.py\n+++ b/pagekit/paging.py\n@@ -5,4 +5,4 @@ def page_count(total: int, page_size: int) -> int:\n"
                "     \"\"\"Number of pages needed to show ``total`` items (at least one page).\"\"\"\n"
                "     if page_size <= 0:\n         raise ValueError(\"page_size must be positive\")\n"
                "-    return total // page_size + 1\n+    return max(1, -(-total // page_size))\n",
        "changelog_en": "Fixed: `page_count` no longer adds an empty page when the total is a multiple of the page size.",
        "changelog_zh": "修复：总数为每页条数整数倍时，`page_count` 不再多出一个空页。",
    },
    {
        "key": "envflag",
        "repo": "confkit",
        "path": "confkit/env.py",
        "func": "env_flag",
        "test_path": "tests/test_env.py",
        "n_tests": 9,
        "title_en": "env_flag() treats DEBUG=false as True",
        "body_en": "Setting DEBUG=false (or 0, or no) in the environment still turns debug mode on, because any "
                   "non-empty string counts as true.",
        "title_zh": "env_flag() 把 DEBUG=false 当成 True",
        "body_zh": "环境变量设置 DEBUG=false（或 0、no）时调试模式仍然被打开，因为任何非空字符串都被当成了真值。",
        "api_en": "`env_flag(name, default=False)` must keep its signature and keep returning a bool",
        "api_zh": "`env_flag(name, default=False)` 的签名不能变，返回值必须还是 bool",
        "late_en": "unknown values such as 'maybe' must keep being treated as true for now, not raise",
        "late_zh": "像 'maybe' 这种无法识别的值暂时还要当成 true，不能抛异常",
        "late_why_en": "two services set FEATURE_X=enabled and we can't change them this sprint",
        "late_why_zh": "有两个服务设置的是 FEATURE_X=enabled，这个迭代改不了",
        "listing": "CHANGELOG.md\nconfkit/\nsetup.cfg\ntests/\n\nconfkit:\n__init__.py\nenv.py\nloader.py\n\ntests:\ntest_env.py\ntest_loader.py\n",
        "grep": "confkit/env.py:9:def env_flag(name: str, default: bool = False) -> bool:\n"
                "confkit/loader.py:31:        debug=env_flag(\"DEBUG\"),\n"
                "tests/test_env.py:2:from confkit.env import env_flag\n",
        "source": "     1\timport os\n     2\t\n     3\t_TRUE = {\"1\", \"true\", \"yes\", \"on\"}\n"
                  "     4\t_FALSE = {\"0\", \"false\", \"no\", \"off\", \"\"}\n     5\t\n     6\t\n     7\t\n     8\t\n"
                  "     9\tdef env_flag(name: str, default: bool = False) -> bool:\n"
                  "    10\t    \"\"\"Read a boolean feature flag from the environment.\"\"\"\n"
                  "    11\t    value = os.environ.get(name)\n    12\t    if value is None:\n"
                  "    13\t        return default\n    14\t    return bool(value)\n",
        "bug_line": "return bool(value)",
        "repro": "import os\nfrom confkit.env import env_flag\nfor v in (\"false\", \"0\", \"no\", \"TRUE\"):\n"
                 "    os.environ[\"DEBUG\"] = v\n    print(v, env_flag(\"DEBUG\"))\n",
        "repro_rc": 0,
        "repro_bug": "false True\n0 True\nno True\nTRUE True\n",
        "repro_bug_span": "false True",
        "repro_fixed": "false False\n0 False\nno False\nTRUE True\n",
        "cause_en": "`bool(value)` is true for every non-empty string, so the `_FALSE` set defined at the top is never used",
        "cause_zh": "`bool(value)` 对任何非空字符串都为真，文件开头定义的 `_FALSE` 集合根本没被用到",
        "fix1": ("    return bool(value)\n", "    return value in _TRUE\n"),
        "fail_test": "test_env_flag_is_case_insensitive",
        "fail_out": ".....F...                                                                [100%]\n"
                    "=================================== FAILURES ===================================\n"
                    "______________________ test_env_flag_is_case_insensitive _______________________\n\n"
                    "monkeypatch = <_pytest.monkeypatch.MonkeyPatch object at 0x7f3a2c1d9e50>\n\n"
                    "    def test_env_flag_is_case_insensitive(monkeypatch):\n"
                    "        monkeypatch.setenv(\"DEBUG\", \" ON \")\n>       assert env_flag(\"DEBUG\") is True\n"
                    "E       AssertionError: assert False is True\nE        +  where False = env_flag('DEBUG')\n\n"
                    "tests/test_env.py:27: AssertionError\n"
                    "=========================== short test summary info ============================\n"
                    "FAILED tests/test_env.py::test_env_flag_is_case_insensitive - AssertionError: assert False is True\n"
                    "1 failed, 8 passed in 0.03s\n",
        "fail_counts": "1 failed, 8 passed",
        "why_en": "`value in _TRUE` is case-sensitive (' ON ' is not in it) and turns every unknown value into False; I should strip and lower-case the value and test it against `_FALSE` instead, which also keeps unknown values true as the maintainers asked",
        "why_zh": "`value in _TRUE` 区分大小写（' ON ' 不在集合里），而且会把所有无法识别的值都当成 False；应该先 strip、转小写，再判断是否在 `_FALSE` 里，这样无法识别的值也仍然是 true，符合维护者的要求",
        "fix2": ("    return value in _TRUE\n", "    return value.strip().lower() not in _FALSE\n"),
        "fix2_code": "value.strip().lower() not in _FALSE",
        "diff": "diff --git a/confkit/env.py b/confkit/env.py\nindex 51d0c3e..a7b9e12 100644\n"
                "--- a/confkit/env.py\n+++ b/confkit/env.py\n@@ -11,4 +11,4 @@ def env_flag(name: str, default: bool = False) -> bool:\n"
                "     value = os.environ.get(name)\n     if value is None:\n         return default\n"
                "-    return bool(value)\n+    return value.strip().lower() not in _FALSE\n",
        "changelog_en": "Fixed: `env_flag` now reads false/0/no/off (any case) as False.",
        "changelog_zh": "修复：`env_flag` 现在把 false/0/no/off（不区分大小写）识别为 False。",
    },
    {
        "key": "csvexport",
        "repo": "reportly",
        "path": "reportly/export.py",
        "func": "export_csv",
        "test_path": "tests/test_export.py",
        "n_tests": 7,
        "title_en": "export_csv crashes with UnicodeEncodeError for names like 'Zoë' on servers with LANG=C",
        "body_en": "The nightly report job fails on the build server: export_csv(rows, path) raises "
                   "UnicodeEncodeError as soon as a customer name has a non-ASCII letter.",
        "title_zh": "服务器 LANG=C 时 export_csv 遇到 'Zoë' 这类名字会抛 UnicodeEncodeError",
        "body_zh": "构建服务器上的夜间报表任务失败：只要客户名里有非 ASCII 字符，export_csv(rows, path) 就抛 UnicodeEncodeError。",
        "api_en": "`export_csv(rows, path)` must keep returning the number of data rows written",
        "api_zh": "`export_csv(rows, path)` 必须继续返回写入的数据行数",
        "late_en": "the files must not start with a byte order mark",
        "late_zh": "导出的文件开头不能带 BOM",
        "late_why_en": "the warehouse loader chokes on a BOM in the header",
        "late_why_zh": "数仓的导入程序遇到表头里的 BOM 会出错",
        "listing": "pyproject.toml\nreportly/\ntests/\n\nreportly:\n__init__.py\nexport.py\nnightly.py\n\ntests:\nconftest.py\ntest_export.py\n",
        "grep": "reportly/export.py:6:def export_csv(rows: list[dict], path: str) -> int:\n"
                "reportly/nightly.py:44:    n = export_csv(rows, out_path)\n"
                "tests/test_export.py:4:from reportly.export import export_csv\n",
        "source": "     1\t\"\"\"CSV export of report rows.\"\"\"\n     2\t\n     3\timport csv\n     4\t\n     5\t\n"
                  "     6\tdef export_csv(rows: list[dict], path: str) -> int:\n"
                  "     7\t    \"\"\"Write rows to ``path`` as CSV; returns the number of data rows written.\"\"\"\n"
                  "     8\t    with open(path, \"w\", newline=\"\") as fh:\n"
                  "     9\t        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))\n"
                  "    10\t        writer.writeheader()\n    11\t        writer.writerows(rows)\n"
                  "    12\t    return len(rows)\n",
        "bug_line": "with open(path, \"w\", newline=\"\") as fh:",
        "repro": "from reportly.export import export_csv\nprint(export_csv([{\"name\": \"Zoë\", \"city\": \"Malmö\"}], \"/tmp/out.csv\"))\n",
        "repro_cmd": "LANG=C LC_ALL=C PYTHONUTF8=0 python reproduce.py",
        "repro_rc": 1,
        "repro_bug": "Traceback (most recent call last):\n  File \"/workspace/reportly/reproduce.py\", line 2, in <module>\n"
                     "    print(export_csv([{\"name\": \"Zoë\", \"city\": \"Malmö\"}], \"/tmp/out.csv\"))\n"
                     "  File \"/workspace/reportly/reportly/export.py\", line 11, in export_csv\n"
                     "    writer.writerows(rows)\n"
                     "UnicodeEncodeError: 'ascii' codec can't encode character '\\xeb' in position 2: ordinal not in range(128)\n",
        "repro_bug_span": "UnicodeEncodeError: 'ascii' codec can't encode character",
        "repro_fixed": "1\n",
        "cause_en": "`open()` without an `encoding` argument uses the locale encoding, which is ASCII under LANG=C",
        "cause_zh": "`open()` 没有指定 `encoding`，会用系统 locale 的编码，LANG=C 时就是 ASCII",
        "fix1": ("    with open(path, \"w\", newline=\"\") as fh:\n",
                 "    with open(path, \"w\", newline=\"\", encoding=\"utf-8-sig\") as fh:\n"),
        "fail_test": "test_header_is_first_line",
        "fail_out": "...F...                                                                  [100%]\n"
                    "=================================== FAILURES ===================================\n"
                    "__________________________ test_header_is_first_line ___________________________\n\n"
                    "tmp_path = PosixPath('/tmp/pytest-of-agent/pytest-3/test_header_is_first_line0')\n\n"
                    "    def test_header_is_first_line(tmp_path):\n        out = tmp_path / \"r.csv\"\n"
                    "        export_csv([{\"name\": \"a\", \"city\": \"b\"}], str(out))\n"
                    ">       assert out.read_bytes().startswith(b\"name,city\")\n"
                    "E       AssertionError: assert False\n"
                    "E        +  where False = b'\\xef\\xbb\\xbfname,city\\r\\na,b\\r\\n'.startswith(b'name,city')\n\n"
                    "tests/test_export.py:22: AssertionError\n"
                    "=========================== short test summary info ============================\n"
                    "FAILED tests/test_export.py::test_header_is_first_line - AssertionError: assert False\n"
                    "1 failed, 6 passed in 0.05s\n",
        "fail_counts": "1 failed, 6 passed",
        "why_en": "utf-8-sig writes a byte order mark (\\xef\\xbb\\xbf) before the header, so the file no longer starts with the column names",
        "why_zh": "utf-8-sig 会在表头前写入 BOM（\\xef\\xbb\\xbf），文件开头就不再是列名了",
        "fix2": ("encoding=\"utf-8-sig\"", "encoding=\"utf-8\""),
        "fix2_code": "encoding=\"utf-8\"",
        "diff": "diff --git a/reportly/export.py b/reportly/export.py\nindex 0be41d2..6c27f90 100644\n"
                "--- a/reportly/export.py\n+++ b/reportly/export.py\n@@ -5,7 +5,7 @@ import csv\n \n"
                " def export_csv(rows: list[dict], path: str) -> int:\n"
                "     \"\"\"Write rows to ``path`` as CSV; returns the number of data rows written.\"\"\"\n"
                "-    with open(path, \"w\", newline=\"\") as fh:\n"
                "+    with open(path, \"w\", newline=\"\", encoding=\"utf-8\") as fh:\n"
                "         writer = csv.DictWriter(fh, fieldnames=list(rows[0]))\n         writer.writeheader()\n"
                "         writer.writerows(rows)\n",
        "changelog_en": "Fixed: `export_csv` always writes UTF-8, whatever the server locale.",
        "changelog_zh": "修复：`export_csv` 不再依赖服务器 locale，始终以 UTF-8 写入。",
    },
    {
        "key": "slugify",
        "repo": "slugger",
        "path": "slugger/text.py",
        "func": "slugify",
        "test_path": "tests/test_text.py",
        "n_tests": 10,
        "title_en": "slugify() drops accented letters: 'Café Olé' becomes 'caf-ol'",
        "body_en": "Blog posts with accented titles get broken URLs. slugify('Café Olé') should give 'cafe-ole'.",
        "title_zh": "slugify() 会丢掉带重音的字母：'Café Olé' 变成了 'caf-ol'",
        "body_zh": "标题带重音字母的博客文章生成的链接是坏的。slugify('Café Olé') 应该得到 'cafe-ole'。",
        "api_en": "`slugify(title, max_length=50)` must keep its signature and default",
        "api_zh": "`slugify(title, max_length=50)` 的签名和默认值都不能改",
        "late_en": "slugs must stay pure ASCII, no percent-encoding",
        "late_zh": "slug 必须是纯 ASCII，不要用百分号编码",
        "late_why_en": "the CDN rejects non-ASCII paths",
        "late_why_zh": "CDN 不接受非 ASCII 的路径",
        "listing": "LICENSE\nslugger/\npyproject.toml\ntests/\n\nslugger:\n__init__.py\ntext.py\nurls.py\n\ntests:\ntest_text.py\ntest_urls.py\n",
        "grep": "slugger/text.py:6:def slugify(title: str, max_length: int = 50) -> str:\n"
                "slugger/urls.py:18:    return f\"/posts/{slugify(post.title)}\"\n"
                "tests/test_text.py:1:from slugger.text import slugify\n",
        "source": "     1\t\"\"\"Text helpers for URLs.\"\"\"\n     2\t\n     3\timport re\n     4\t\n     5\t\n"
                  "     6\tdef slugify(title: str, max_length: int = 50) -> str:\n"
                  "     7\t    \"\"\"Lower-case URL slug of ``title``: words joined by '-', at most ``max_length`` characters.\"\"\"\n"
                  "     8\t    words = re.findall(r\"[a-z0-9]+\", title.lower())\n"
                  "     9\t    return \"-\".join(words)[:max_length]\n",
        "bug_line": "words = re.findall(r\"[a-z0-9]+\", title.lower())",
        "repro": "from slugger.text import slugify\nprint(slugify(\"Café Olé\"), slugify(\"Ünïcödé Tëst 2\"))\n",
        "repro_rc": 0,
        "repro_bug": "caf-ol n-c-d-t-st-2\n",
        "repro_bug_span": "caf-ol",
        "repro_fixed": "cafe-ole unicode-test-2\n",
        "cause_en": "the regex only keeps ASCII letters, so accented letters are treated as separators instead of being folded to their base letter",
        "cause_zh": "正则只保留 ASCII 字母，带重音的字母被当成了分隔符，而不是先还原成基本字母",
        "fix1": ("    words = re.findall(r\"[a-z0-9]+\", title.lower())\n",
                 "    title = unicodedata.normalize(\"NFKD\", title).encode(\"ascii\", \"ignore\").decode(\"ascii\")\n"
                 "    words = re.findall(r\"[a-z0-9]+\", title.lower())\n"),
        "fail_test": "test_basic_title",
        "fail_out": "FFFFFFFFFF                                                               [100%]\n"
                    "=================================== FAILURES ===================================\n"
                    "_______________________________ test_basic_title _______________________________\n\n"
                    "    def test_basic_title():\n>       assert slugify(\"Hello World\") == \"hello-world\"\n\n"
                    "tests/test_text.py:5: \n_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _\n\n"
                    "    def slugify(title: str, max_length: int = 50) -> str:\n"
                    ">       title = unicodedata.normalize(\"NFKD\", title).encode(\"ascii\", \"ignore\").decode(\"ascii\")\n"
                    "E       NameError: name 'unicodedata' is not defined\n\nslugger/text.py:8: NameError\n"
                    "=========================== short test summary info ============================\n"
                    "FAILED tests/test_text.py::test_basic_title - NameError: name 'unicodedata' is not defined\n"
                    "(9 more failures with the same error)\n10 failed in 0.06s\n",
        "fail_counts": "10 failed",
        "why_en": "I used `unicodedata` without importing it; the normalisation itself is right",
        "why_zh": "我用了 `unicodedata` 却忘了 import，归一化的思路本身没问题",
        "fix2": ("import re\n", "import re\nimport unicodedata\n"),
        "fix2_code": "import unicodedata",
        "diff": "diff --git a/slugger/text.py b/slugger/text.py\nindex 7a51c0e..e03b9d4 100644\n"
                "--- a/slugger/text.py\n+++ b/slugger/text.py\n@@ -1,9 +1,11 @@\n \"\"\"Text helpers for URLs.\"\"\"\n \n"
                " import re\n+import unicodedata\n \n \n def slugify(title: str, max_length: int = 50) -> str:\n"
                "     \"\"\"Lower-case URL slug of ``title``: words joined by '-', at most ``max_length`` characters.\"\"\"\n"
                "+    title = unicodedata.normalize(\"NFKD\", title).encode(\"ascii\", \"ignore\").decode(\"ascii\")\n"
                "     words = re.findall(r\"[a-z0-9]+\", title.lower())\n     return \"-\".join(words)[:max_length]\n",
        "changelog_en": "Fixed: `slugify` folds accented letters to ASCII ('Café' -> 'cafe').",
        "changelog_zh": "修复：`slugify` 会把带重音的字母还原为 ASCII（'Café' -> 'cafe'）。",
    },
    {
        "key": "retry",
        "repo": "backoff-tools",
        "path": "backoff_tools/retry.py",
        "func": "retry",
        "test_path": "tests/test_retry.py",
        "n_tests": 8,
        "title_en": "@retry(times=3) calls the function 4 times and returns None instead of raising",
        "body_en": "When every attempt fails, the decorator swallows the exception and the caller gets None, "
                   "and it makes one attempt more than asked.",
        "title_zh": "@retry(times=3) 实际调用了 4 次，全部失败时返回 None 而不是抛出异常",
        "body_zh": "每次尝试都失败时，装饰器把异常吞掉了，调用方拿到的是 None；而且比要求的多试了一次。",
        "api_en": "`retry(times=3, delay=0.0)` must keep its parameters and defaults",
        "api_zh": "`retry(times=3, delay=0.0)` 的参数和默认值不能改",
        "late_en": "there must be no sleep after the final failed attempt",
        "late_zh": "最后一次失败之后不要再 sleep",
        "late_why_en": "the job scheduler times out otherwise",
        "late_why_zh": "否则任务调度器会超时",
        "listing": "README.rst\nbackoff_tools/\nsetup.py\ntests/\n\nbackoff_tools:\n__init__.py\nclock.py\nretry.py\n\ntests:\ntest_clock.py\ntest_retry.py\n",
        "grep": "backoff_tools/retry.py:7:def retry(times: int = 3, delay: float = 0.0):\n"
                "backoff_tools/__init__.py:2:from .retry import retry\n"
                "tests/test_retry.py:3:from backoff_tools import retry\n",
        "source": "     1\t\"\"\"Retry decorator.\"\"\"\n     2\t\n     3\timport functools\n     4\timport time\n     5\t\n     6\t\n"
                  "     7\tdef retry(times: int = 3, delay: float = 0.0):\n"
                  "     8\t    \"\"\"Call the wrapped function up to ``times`` times; re-raise the last error.\"\"\"\n"
                  "     9\t    def decorator(func):\n    10\t        @functools.wraps(func)\n"
                  "    11\t        def wrapper(*args, **kwargs):\n    12\t            for attempt in range(times + 1):\n"
                  "    13\t                try:\n    14\t                    return func(*args, **kwargs)\n"
                  "    15\t                except Exception:\n    16\t                    time.sleep(delay)\n"
                  "    17\t        return wrapper\n    18\t    return decorator\n",
        "bug_line": "for attempt in range(times + 1):",
        "repro": "from backoff_tools import retry\ncalls = 0\n\n@retry(times=3)\ndef flaky():\n    global calls\n"
                 "    calls += 1\n    raise KeyError(\"boom\")\n\ntry:\n    result = flaky()\nexcept KeyError:\n"
                 "    result = \"raised\"\nprint(f\"calls={calls} result={result}\")\n",
        "repro_rc": 0,
        "repro_bug": "calls=4 result=None\n",
        "repro_bug_span": "calls=4 result=None",
        "repro_fixed": "calls=3 result=raised\n",
        "cause_en": "the loop runs `times + 1` attempts and, when all of them fail, falls off the end of `wrapper` and returns None",
        "cause_zh": "循环跑了 `times + 1` 次，全部失败后直接走出 `wrapper` 末尾，于是返回 None",
        "fix1": ("            for attempt in range(times + 1):\n                try:\n                    return func(*args, **kwargs)\n"
                 "                except Exception:\n                    time.sleep(delay)\n",
                 "            for attempt in range(times):\n                try:\n                    return func(*args, **kwargs)\n"
                 "                except Exception:\n                    time.sleep(delay)\n            raise\n"),
        "baseline_fail": {
            "out": "..F.....                                                                 [100%]\n"
                   "=================================== FAILURES ===================================\n"
                   "___________________________ test_reraises_last_error ___________________________\n\n"
                   "    def test_reraises_last_error():\n>       with pytest.raises(KeyError):\n"
                   "E       Failed: DID NOT RAISE <class 'KeyError'>\n\ntests/test_retry.py:30: Failed\n"
                   "=========================== short test summary info ============================\n"
                   "FAILED tests/test_retry.py::test_reraises_last_error - Failed: DID NOT RAISE <class 'KeyError'>\n"
                   "1 failed, 7 passed in 0.02s\n",
            "counts": "1 failed, 7 passed",
        },
        "fail_test": "test_reraises_last_error",
        "fail_out": "..F.....                                                                 [100%]\n"
                    "=================================== FAILURES ===================================\n"
                    "___________________________ test_reraises_last_error ___________________________\n\n"
                    "    def test_reraises_last_error():\n        with pytest.raises(KeyError):\n"
                    ">           always_fails()\n\ntests/test_retry.py:31: \n"
                    "_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _\n"
                    ">           raise\nE           RuntimeError: No active exception to reraise\n\n"
                    "backoff_tools/retry.py:17: RuntimeError\n"
                    "=========================== short test summary info ============================\n"
                    "FAILED tests/test_retry.py::test_reraises_last_error - RuntimeError: No active exception to reraise\n"
                    "1 failed, 7 passed in 0.02s\n",
        "fail_counts": "1 failed, 7 passed",
        "why_en": "a bare `raise` after the loop is outside the `except` block, so there is no active exception; I have to keep the last exception and raise it, and skip the sleep after the last attempt",
        "why_zh": "循环后面的裸 `raise` 已经不在 `except` 块里，没有活动的异常；要把最后一次的异常保存下来再抛出，并且最后一次失败后不再 sleep",
        "fix2": ("            for attempt in range(times):\n                try:\n                    return func(*args, **kwargs)\n"
                 "                except Exception:\n                    time.sleep(delay)\n            raise\n",
                 "            for attempt in range(times):\n                try:\n                    return func(*args, **kwargs)\n"
                 "                except Exception as exc:\n                    last_exc = exc\n"
                 "                    if attempt < times - 1:\n                        time.sleep(delay)\n"
                 "            raise last_exc\n"),
        "fix2_code": "raise last_exc",
        "diff": "diff --git a/backoff_tools/retry.py b/backoff_tools/retry.py\nindex c41e8f2..5b7a0d3 100644\n"
                "--- a/backoff_tools/retry.py\n+++ b/backoff_tools/retry.py\n@@ -9,10 +9,13 @@ def retry(times: int = 3, delay: float = 0.0):\n"
                "     def decorator(func):\n         @functools.wraps(func)\n         def wrapper(*args, **kwargs):\n"
                "-            for attempt in range(times + 1):\n+            for attempt in range(times):\n"
                "                 try:\n                     return func(*args, **kwargs)\n"
                "-                except Exception:\n-                    time.sleep(delay)\n"
                "+                except Exception as exc:\n+                    last_exc = exc\n"
                "+                    if attempt < times - 1:\n+                        time.sleep(delay)\n"
                "+            raise last_exc\n         return wrapper\n     return decorator\n",
        "changelog_en": "Fixed: `retry` makes exactly `times` attempts and re-raises the last error.",
        "changelog_zh": "修复：`retry` 只尝试 `times` 次，全部失败时重新抛出最后一个异常。",
    },
    {
        "key": "memoize",
        "repo": "memo",
        "path": "memo/cache.py",
        "func": "memoize",
        "test_path": "tests/test_cache.py",
        "n_tests": 6,
        "title_en": "memoize returns the cached result of f(1) for f('1')",
        "body_en": "The cache key joins str() of the arguments, so 1 and '1' collide and the second call gets the "
                   "wrong cached value.",
        "title_zh": "memoize 对 f('1') 返回了 f(1) 的缓存结果",
        "body_zh": "缓存 key 是把参数 str() 之后拼起来的，所以 1 和 '1' 会撞 key，第二次调用拿到错误的缓存值。",
        "api_en": "`memoize` must stay a plain decorator and keep exposing `wrapper.cache`",
        "api_zh": "`memoize` 必须还是普通装饰器，并且继续暴露 `wrapper.cache`",
        "late_en": "unhashable arguments like lists must keep working",
        "late_zh": "列表这类不可哈希的参数也必须继续能用",
        "late_why_en": "the pricing service memoizes on a list of SKUs",
        "late_why_zh": "定价服务是用 SKU 列表做参数来缓存的",
        "listing": "memo/\npyproject.toml\ntests/\n\nmemo:\n__init__.py\ncache.py\n\ntests:\ntest_cache.py\n",
        "grep": "memo/cache.py:6:def memoize(func):\nmemo/__init__.py:1:from .cache import memoize\n"
                "tests/test_cache.py:2:from memo import memoize\n",
        "source": "     1\t\"\"\"Tiny memoization decorator.\"\"\"\n     2\t\n     3\timport functools\n     4\t\n     5\t\n"
                  "     6\tdef memoize(func):\n     7\t    \"\"\"Cache results by argument values.\"\"\"\n     8\t    cache = {}\n     9\t\n"
                  "    10\t    @functools.wraps(func)\n    11\t    def wrapper(*args, **kwargs):\n"
                  "    12\t        key = \",\".join(map(str, args)) + str(sorted(kwargs.items()))\n"
                  "    13\t        if key not in cache:\n    14\t            cache[key] = func(*args, **kwargs)\n"
                  "    15\t        return cache[key]\n    16\t\n    17\t    wrapper.cache = cache\n    18\t    return wrapper\n",
        "bug_line": "key = \",\".join(map(str, args)) + str(sorted(kwargs.items()))",
        "repro": "from memo import memoize\n\n@memoize\ndef kind(x):\n    return type(x).__name__\n\nprint(kind(1), kind(\"1\"))\n",
        "repro_rc": 0,
        "repro_bug": "int int\n",
        "repro_bug_span": "int int",
        "repro_fixed": "int str\n",
        "cause_en": "`str()` erases the type, so 1 and '1' produce the same key",
        "cause_zh": "`str()` 把类型信息丢掉了，1 和 '1' 生成的 key 一样",
        "fix1": ("        key = \",\".join(map(str, args)) + str(sorted(kwargs.items()))\n",
                 "        key = (args, tuple(sorted(kwargs.items())))\n"),
        "fail_test": "test_unhashable_arguments",
        "fail_out": "....F.                                                                   [100%]\n"
                    "=================================== FAILURES ===================================\n"
                    "__________________________ test_unhashable_arguments ___________________________\n\n"
                    "    def test_unhashable_arguments():\n>       assert total([1, 2, 3]) == 6\n\n"
                    "tests/test_cache.py:24: \n_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _\n"
                    ">       if key not in cache:\nE       TypeError: unhashable type: 'list'\n\nmemo/cache.py:13: TypeError\n"
                    "=========================== short test summary info ============================\n"
                    "FAILED tests/test_cache.py::test_unhashable_arguments - TypeError: unhashable type: 'list'\n"
                    "1 failed, 5 passed in 0.02s\n",
        "fail_counts": "1 failed, 5 passed",
        "why_en": "a tuple key is only hashable when every argument is; the key must keep the type and fall back to repr for unhashable values",
        "why_zh": "只有所有参数都可哈希时元组 key 才能用；key 要保留类型信息，不可哈希的值退回用 repr",
        "fix2": ("        key = (args, tuple(sorted(kwargs.items())))\n",
                 "        key = repr([(type(a).__name__, a) for a in args]) + repr(sorted(kwargs.items()))\n"),
        "fix2_code": "repr([(type(a).__name__, a) for a in args])",
        "diff": "diff --git a/memo/cache.py b/memo/cache.py\nindex 2e8b1f4..9c03a7d 100644\n"
                "--- a/memo/cache.py\n+++ b/memo/cache.py\n@@ -9,7 +9,7 @@ def memoize(func):\n \n"
                "     @functools.wraps(func)\n     def wrapper(*args, **kwargs):\n"
                "-        key = \",\".join(map(str, args)) + str(sorted(kwargs.items()))\n"
                "+        key = repr([(type(a).__name__, a) for a in args]) + repr(sorted(kwargs.items()))\n"
                "         if key not in cache:\n             cache[key] = func(*args, **kwargs)\n         return cache[key]\n",
        "changelog_en": "Fixed: `memoize` keys keep argument types, so f(1) and f('1') are cached separately.",
        "changelog_zh": "修复：`memoize` 的缓存 key 保留参数类型，f(1) 和 f('1') 分开缓存。",
    },
]

"""``python -m training.data build``: corpora + labels -> DatasetDict, evaluation sessions, manifest.

Outputs under ``data/processed/`` (git-ignored):

- ``dataset/``: HF ``DatasetDict`` (train / dev / test), one row per message (columns in
  :data:`FEATURES`, see ``docs/contracts.md``);
- ``sessions.jsonl.gz``: the session records behind the dataset rows (contract format);
- ``eval_sessions.jsonl`` / ``dev_sessions.jsonl``: long evaluation sessions from the test / dev
  split groups (:mod:`training.data.chain`);
- ``train_sessions.jsonl``: long sessions chained the same way from the train split groups (outcome
  labels and page-in ranker pairs are mined from them; they never overlap the evaluation sessions);
- ``manifest.json``: sources, counts per label / source / language / split, SHA-256 of every
  input file read, weak-label accuracy, the dataset fingerprint and the build key;
- ``weak_label_accuracy.md``: the weak-label accuracy table of the data card.

The build is idempotent: when the SHA-256 of the inputs, the hash of this package's code and the
configuration match the manifest (and the outputs are there), it does nothing unless forced.
"""

from __future__ import annotations

import gzip
import hashlib
import heapq
import json
import logging
import os
import resource
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ctxscore.io import iter_jsonl

from ..paths import (
    CORPORA_ENV,
    DEFAULT_BUNDLED,
    DEFAULT_OUT,
    REPO_ROOT,
    SOURCE_DIRS,
    CorporaMissingError,
    corpora_explicit,
    corpora_present,
    corpora_root,
    missing_message,
)
from . import chain as chain_mod
from .labels import accuracy_table_markdown, importance_to_value, load_distilled, weak_label_accuracy
from .schema import CorpusSession
from .sources import SOURCES, bundled
from .splits import DEFAULT_FRACTIONS, SPLITS, assign_few, split_of, unit_hash

log = logging.getLogger("training.data")

#: Bump when the output format changes (also part of the build key).
FORMAT_VERSION = 1

#: Upstream provenance of each source (the data card has the full attribution).
PROVENANCE = {
    "sgd": ("google-research-datasets/dstc8-schema-guided-dialogue @ e852981", "CC BY-SA 4.0"),
    "multiwoz": ("MultiWOZ 2.1, ConvLab-2 form, from thu-coai/CrossWOZ @ f0171bb", "MIT"),
    "crosswoz": ("thu-coai/CrossWOZ @ df82c9f", "Apache-2.0"),
    "tau_airline": ("sierra-research/tau-bench @ 59a200c", "MIT"),
    "swe_mini": ("gruckion/mini-swe-agent @ d12a71a", "MIT"),
    "bundled": ("ctxscore project (data/bundled/sessions.jsonl)", "MIT (project)"),
}

#: Sources with few groups (50 tau-bench tasks, a handful of bundled scenario families): their
#: groups are split by :func:`training.data.splits.assign_few` so dev and test get their share.
FEW_GROUP_SOURCES = frozenset({"tau_airline"})

#: Default cap on weak-only (unlabelled) sessions added per source.
WEAK_CAPS: dict[str, int] = {"sgd": 300, "multiwoz": 150, "crosswoz": 150, "tau_airline": 200, "swe_mini": 20}


def _features():
    from datasets import Features, Sequence, Value

    return Features({
        "id": Value("string"),
        "session_id": Value("string"),
        "group": Value("string"),
        "source": Value("string"),
        "language": Value("string"),
        "index": Value("int32"),
        "n_messages": Value("int32"),
        "role": Value("string"),
        "text": Value("string"),
        "prev_text": Value("string"),
        "category": Value("string"),
        "importance": Value("int8"),
        "value": Value("float32"),
        "key_spans": Sequence(Value("string")),
        "label_source": Value("string"),
        "weak_category": Value("string"),
        "weak_confidence": Value("float32"),
        "weak_importance": Value("int8"),
        "weak_rule": Value("string"),
    })


#: Column names of the message-level dataset.
FEATURES: tuple[str, ...] = (
    "id", "session_id", "group", "source", "language", "index", "n_messages", "role", "text", "prev_text",
    "category", "importance", "value", "key_spans", "label_source", "weak_category", "weak_confidence",
    "weak_importance", "weak_rule",
)


@dataclass
class BuildConfig:
    """Build settings; all of them except the paths and ``progress`` enter the build key.

    Attributes:
        weak_caps: weak-only (no distilled label) sessions added per source, chosen by hash.
        eval_counts / dev_counts: evaluation sessions per source in ``eval_sessions.jsonl`` /
            ``dev_sessions.jsonl``.
        train_counts: long train-split sessions per source in ``train_sessions.jsonl``.
        seed: seeds the chaining order and target lengths.
        fractions: train / dev / test fractions of groups.
        pool_cap: held-out sessions kept per source and split as chaining material.
        sources: corpus sources to load (``None``: all of :data:`training.data.sources.SOURCES`).
    """

    weak_caps: dict[str, int] = field(default_factory=lambda: dict(WEAK_CAPS))
    eval_counts: dict[str, int] = field(default_factory=lambda: dict(chain_mod.EVAL_COUNTS))
    dev_counts: dict[str, int] = field(default_factory=lambda: dict(chain_mod.DEV_COUNTS))
    train_counts: dict[str, int] = field(default_factory=lambda: dict(chain_mod.TRAIN_COUNTS))
    seed: int = 0
    fractions: tuple[float, float, float] = DEFAULT_FRACTIONS
    pool_cap: int = 600
    sources: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.sources or ()) - set(SOURCES))
        if unknown:
            raise ValueError(f"unknown sources {unknown}; choose from {', '.join(SOURCES)}")

    def key_dict(self) -> dict[str, Any]:
        """JSON-able form used in the build key and the manifest."""
        d = asdict(self)
        d["fractions"] = list(self.fractions)
        d["sources"] = list(self.sources) if self.sources is not None else None
        return d


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """SHA-256 hex digest of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def code_hash() -> str:
    """SHA-256 over the source of ``training/data`` (sorted paths and contents) + FORMAT_VERSION."""
    h = hashlib.sha256(f"format{FORMAT_VERSION}".encode())
    base = Path(__file__).resolve().parent
    for p in sorted(base.rglob("*.py")):
        h.update(str(p.relative_to(base)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _rel(p: Path, root: Path | None) -> str:
    for base, tag in ((root, "corpora"), (REPO_ROOT, "repo")):
        if base is None:
            continue
        try:
            return f"{tag}:{p.resolve().relative_to(base)}"
        except ValueError:
            continue
    return str(p)


def input_files(root: Path | None, bundled_path: Path | None, sources: tuple[str, ...] | None = None) -> list[Path]:
    """Every file the build reads, in a fixed order."""
    files: list[Path] = []
    if root is not None:
        files.append(root / "labels" / "distilled.jsonl")
        for name, mod in SOURCES.items():
            if sources is None or name in sources:
                files.extend(mod.input_files(root))
    if bundled_path is not None and bundled_path.is_file():
        files.append(bundled_path)
    return files


def _outputs(out: Path) -> list[Path]:
    return [out / "dataset" / "dataset_dict.json", out / "eval_sessions.jsonl", out / "dev_sessions.jsonl",
            out / "train_sessions.jsonl", out / "sessions.jsonl.gz", out / "manifest.json"]


class _Bounded:
    """Keeps the ``cap`` items with the smallest keys (a max-heap of size ``cap``)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._heap: list[tuple[Any, int, CorpusSession]] = []
        self._n = 0

    def push(self, key: Any, item: CorpusSession) -> None:
        if self.cap <= 0:
            return
        self._n += 1
        entry = (_Neg(key), self._n, item)
        if len(self._heap) < self.cap:
            heapq.heappush(self._heap, entry)
        elif key < self._heap[0][0].key:
            heapq.heapreplace(self._heap, entry)

    def items(self) -> list[CorpusSession]:
        return [e[2] for e in sorted(self._heap, key=lambda e: e[0].key)]


class _Neg:
    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __lt__(self, other: _Neg) -> bool:
        return other.key < self.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Neg) and other.key == self.key


def _rows(session: CorpusSession, split: str, labels: dict[str, dict[str, Any]]) -> Iterator[dict[str, Any]]:
    msgs = session["messages"]
    prev = ""
    for m in msgs:
        w = m["weak"]
        gold = labels.get(m["id"]) or m.get("gold")
        if gold is not None:
            cat, imp, spans = gold["category"], gold["importance"], gold["key_spans"]
            label_source = "bundled" if session["source"] == "bundled" else "distilled"
        else:
            cat, imp, spans, label_source = w["category"], w["importance"], w["spans"], "weak"
        yield {
            "id": m["id"], "session_id": session["session_id"], "group": session["group"],
            "source": session["source"], "language": session["language"], "index": m["index"],
            "n_messages": len(msgs), "role": m["role"], "text": m["text"], "prev_text": prev,
            "category": cat, "importance": imp, "value": importance_to_value(imp), "key_spans": list(spans),
            "label_source": label_source, "weak_category": w["category"], "weak_confidence": w["confidence"],
            "weak_importance": w["importance"], "weak_rule": w["rule"], "_split": split,
        }
        prev = m["text"]


def _session_record(s: CorpusSession) -> dict[str, Any]:
    keep = ("id", "index", "role", "content", "name", "tool_calls", "tool_call_id", "text")
    return {
        "session_id": s["session_id"], "source": s["source"], "group": s["group"], "language": s["language"],
        "upstream_split": s["upstream_split"], "messages": [{k: m.get(k) for k in keep} for m in s["messages"]],
    }


def _write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> str:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return sha256_file(path)


def _known_gaps(root: Path | None, present: list[str]) -> list[str]:
    gaps: list[str] = []
    if root is None:
        return ["corpora absent: built from the bundled set only"]
    missing_list = root / "sgd" / "MISSING_FILES.txt"
    if missing_list.is_file():
        names = [ln.strip() for ln in missing_list.read_text(encoding="utf-8").splitlines() if ln.strip().endswith(".json")]
        gaps.append(f"sgd: {len(names)} upstream dialogue files absent (sgd/MISSING_FILES.txt)")
    gaps.append("multiwoz, crosswoz: no train split upstream here (val and test only)")
    for src, d in SOURCE_DIRS.items():
        if src not in present and not (root / d).is_dir():
            gaps.append(f"{src}: folder {root / d} absent; source skipped")
    return gaps


def _progress(items: Iterable[Any], desc: str, enabled: bool, **kwargs: Any) -> Iterable[Any]:
    """``items`` wrapped in a tqdm progress bar when ``enabled`` (tqdm is imported only then)."""
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, **kwargs)


def _resolve_inputs(corpora: str | os.PathLike[str] | None, bpath: Path, require_corpora: bool,
                    use_corpora: bool) -> Path | None:
    """The corpora root to read, or ``None`` to build from the bundled set ``bpath`` alone.

    Raises:
        FileNotFoundError: a bundled-only build without a bundled set.
        CorporaMissingError: the corpora are absent and (``require_corpora``, an explicit corpora
            path / ``CTXSCORE_CORPORA``, or no bundled set to fall back to).
    """
    root = corpora_root(corpora)
    if not use_corpora:
        if not bpath.is_file():
            raise FileNotFoundError(f"bundled-only build asked for, but there is no bundled set at {bpath}")
        log.info("building from the bundled set alone (%s), corpora not used", bpath)
        return None
    if not corpora_present(root):
        if require_corpora or corpora_explicit(corpora) or not bpath.is_file():
            extra = "" if bpath.is_file() else f" No bundled set at {bpath} to fall back to either."
            raise CorporaMissingError(missing_message(root) + extra)
        log.warning("%s Building from the bundled set alone (%s).", missing_message(root), bpath)
        return None
    if not bpath.is_file():
        log.warning("bundled set not found at %s; building from the corpora without it", bpath)
    return root


def _up_to_date(out_dir: Path, key: str) -> dict[str, Any] | None:
    """The manifest of ``out_dir`` when it was built with ``key`` and every output is there, else ``None``."""
    manifest_path = out_dir / "manifest.json"
    if not manifest_path.is_file() or not all(p.exists() for p in _outputs(out_dir)):
        return None
    try:
        old = json.loads(manifest_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None
    return old if old.get("build_key") == key else None


@dataclass
class _Collected:
    """Sessions read from the sources, sorted into the dataset, weak-only samples and held-out pools.

    Attributes:
        dataset_sessions: sessions with a gold label (and every bundled session).
        weak_heaps: per source, the weak-only sessions kept (the ``weak_caps`` smallest hashes).
        pools: per (source, split), chaining material for the long sessions.
        loaded: sessions read per source.
        present: sources read, in order.
        split_assignments: per few-group source, group -> split.
        label_hits: distilled labels matched by a loaded message.
    """

    cfg: BuildConfig
    labels: dict[str, dict[str, Any]]
    dataset_sessions: list[CorpusSession] = field(default_factory=list)
    weak_heaps: dict[str, _Bounded] = field(default_factory=dict)
    pools: dict[tuple[str, str], _Bounded] = field(default_factory=dict)
    loaded: Counter[str] = field(default_factory=Counter)
    present: list[str] = field(default_factory=list)
    split_assignments: dict[str, dict[str, str]] = field(default_factory=dict)
    label_hits: int = 0

    def take(self, s: CorpusSession, split: str | None = None) -> None:
        """File one session: its split (by group hash unless given), dataset or weak sample, pool."""
        src = s["source"]
        self.loaded[src] += 1
        split = split or split_of(s["group"], self.cfg.fractions)
        s["split"] = split
        n_lab = sum(1 for m in s["messages"] if m["id"] in self.labels or m.get("gold"))
        self.label_hits += n_lab if src != "bundled" else 0
        if n_lab or src == "bundled":
            self.dataset_sessions.append(s)
        else:
            heap = self.weak_heaps.setdefault(src, _Bounded(self.cfg.weak_caps.get(src, 0)))
            heap.push(unit_hash(s["session_id"], "weak"), s)
        if split in ("train", "dev", "test"):
            prio = (s.get("upstream_split") not in ("test", "bundled"), unit_hash(s["session_id"], "pool"))
            self.pools.setdefault((src, split), _Bounded(self.cfg.pool_cap)).push(prio, s)

    def take_few_groups(self, name: str, sessions: list[CorpusSession]) -> None:
        """File the sessions of a source with few groups, split by :func:`assign_few`."""
        assignment = assign_few([s["group"] for s in sessions], self.cfg.fractions)
        self.split_assignments[name] = assignment
        for s in sessions:
            self.take(s, assignment[s["group"]])


def _collect(root: Path | None, bpath: Path, cfg: BuildConfig, labels: dict[str, dict[str, Any]],
             progress: bool) -> _Collected:
    """Read every source (and the bundled set) into a :class:`_Collected`, dataset sessions sorted."""
    got = _Collected(cfg, labels)
    if root is not None:
        for name, mod in SOURCES.items():
            if cfg.sources is not None and name not in cfg.sources:
                continue
            if not (root / SOURCE_DIRS[name]).is_dir() or not mod.input_files(root):
                log.warning("source %s: no input files under %s; skipped", name, root / SOURCE_DIRS[name])
                continue
            got.present.append(name)
            it = _progress(mod.iter_sessions(root), f"load {name}", progress, unit=" sessions", mininterval=0.5)
            if name in FEW_GROUP_SOURCES:
                got.take_few_groups(name, list(it))
                continue
            for s in it:
                got.take(s)
    if bpath.is_file():
        got.present.append("bundled")
        got.take_few_groups("bundled", list(_progress(bundled.load_bundled(bpath), "load bundled", progress,
                                                      unit=" sessions")))
    if root is not None and got.label_hits != len(labels) and cfg.sources is None:
        log.warning("%d of %d distilled labels matched a loaded message (missing files?)", got.label_hits, len(labels))
    for heap in got.weak_heaps.values():
        got.dataset_sessions.extend(heap.items())
    order = {name: i for i, name in enumerate([*SOURCES, "bundled"])}
    got.dataset_sessions.sort(key=lambda s: (order.get(s["source"], 99), s["session_id"]))
    return got


def _write_dataset(out_dir: Path, sessions: list[CorpusSession], labels: dict[str, dict[str, Any]],
                   progress: bool) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]], str]:
    """Message rows of ``sessions`` saved as the ``dataset/`` DatasetDict (atomically replaced).

    Returns:
        ``(rows by split, gold rows for the weak-label accuracy, dataset fingerprint)``.
    """
    from datasets import Dataset, DatasetDict

    by_split: dict[str, list[dict[str, Any]]] = {sp: [] for sp in SPLITS}
    acc_rows: list[dict[str, Any]] = []
    for s in _progress(sessions, "rows", progress, unit=" sessions", mininterval=0.5):
        for r in _rows(s, s["split"], labels):
            split = r.pop("_split")
            by_split[split].append(r)
            if r["label_source"] != "weak":
                acc_rows.append({"source": r["source"], "category": r["category"], "weak_category": r["weak_category"],
                                 "importance": r["importance"], "weak_importance": r["weak_importance"], "split": split,
                                 "label_source": r["label_source"]})
    features = _features()
    dd = DatasetDict({sp: Dataset.from_list(by_split[sp], features=features) for sp in SPLITS})
    fp = hashlib.sha256()
    for sp in SPLITS:
        for r in by_split[sp]:
            fp.update(json.dumps(r, sort_keys=True, ensure_ascii=False).encode())
    tmp_ds = out_dir / "dataset.tmp"
    if tmp_ds.exists():
        shutil.rmtree(tmp_ds)
    dd.save_to_disk(str(tmp_ds))
    if (out_dir / "dataset").exists():
        shutil.rmtree(out_dir / "dataset")
    os.replace(tmp_ds, out_dir / "dataset")
    return by_split, acc_rows, fp.hexdigest()


def _eval_file_info(split: str, sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of one evaluation-session file for the manifest (sessions, messages, facts, per source)."""
    return {
        "split": split,
        "sessions": len(sessions),
        "messages": sum(s["n_messages"] for s in sessions),
        "key_facts": sum(len(s["key_facts"]) for s in sessions),
        "superseded_facts": sum(1 for s in sessions for f in s["key_facts"] if "superseded" in f),
        "per_source": {src: {"sessions": sum(1 for s in sessions if s["source"] == src),
                             "messages": sum(s["n_messages"] for s in sessions if s["source"] == src),
                             "key_facts": sum(len(s["key_facts"]) for s in sessions if s["source"] == src),
                             "lengths": sorted(s["n_messages"] for s in sessions if s["source"] == src)}
                       for src in sorted({s["source"] for s in sessions})},
    }


def _write_sessions(out_dir: Path, got: _Collected) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """Write ``sessions.jsonl.gz`` and the evaluation-session files; returns ``(sha256 by output
    file, manifest entry by evaluation file)``."""
    cfg = got.cfg
    outputs = {"sessions.jsonl.gz": _write_sessions_gz(out_dir / "sessions.jsonl.gz", got.dataset_sessions)}
    eval_files: dict[str, dict[str, Any]] = {}
    for split, fname, counts in (("test", "eval_sessions.jsonl", cfg.eval_counts), ("dev", "dev_sessions.jsonl", cfg.dev_counts),
                                 ("train", "train_sessions.jsonl", cfg.train_counts)):
        split_pools = {src: got.pools[(src, sp)].items() for src, sp in list(got.pools) if sp == split}
        sessions = chain_mod.build_eval_sessions(split_pools, split, counts, seed=cfg.seed)
        outputs[fname] = _write_jsonl(out_dir / fname, sessions)
        eval_files[fname] = _eval_file_info(split, sessions)
    return outputs, eval_files


def _sources_info(got: _Collected, by_split: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per source read: provenance, licence, sessions loaded, dataset sessions / messages / labelled messages."""
    info = {}
    for src in got.present:
        repo, lic = PROVENANCE[src]
        rows = [r for sp in SPLITS for r in by_split[sp] if r["source"] == src]
        info[src] = {
            "upstream": repo, "licence": lic, "sessions_loaded": got.loaded[src],
            "dataset_sessions": len({r["session_id"] for r in rows}), "dataset_messages": len(rows),
            "labelled_messages": sum(1 for r in rows if r["label_source"] != "weak"),
        }
    return info


def build(
    corpora: str | os.PathLike[str] | None = None,
    out: str | os.PathLike[str] | None = None,
    bundled_path: str | os.PathLike[str] | None = None,
    *,
    config: BuildConfig | None = None,
    force: bool = False,
    require_corpora: bool = False,
    use_corpora: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Build (or confirm up to date) the processed data; returns the manifest dict.

    Args:
        corpora: corpora folder (default :func:`training.data.corpora_root`).
        out: output folder (default ``data/processed``).
        bundled_path: the bundled set (default ``data/bundled/sessions.jsonl``; skipped if absent).
        config: :class:`BuildConfig` (defaults when ``None``).
        force: rebuild even when the manifest says the outputs are current.
        require_corpora: fail instead of falling back to the bundled set when corpora are absent.
        use_corpora: ``False`` builds from the bundled set alone even when corpora are present.
        progress: show tqdm progress bars.

    Raises:
        CorporaMissingError: the corpora are absent and (``require_corpora``, an explicit
            corpora path / ``CTXSCORE_CORPORA``, or no bundled set to fall back to).
    """
    t0 = time.perf_counter()
    cfg = config or BuildConfig()
    out_dir = Path(out) if out is not None else DEFAULT_OUT
    bpath = Path(bundled_path) if bundled_path is not None else DEFAULT_BUNDLED
    root = _resolve_inputs(corpora, bpath, require_corpora, use_corpora)
    hashes = {_rel(p, root): sha256_file(p) for p in input_files(root, bpath, cfg.sources)}
    chash = code_hash()
    key = hashlib.sha256(json.dumps({"inputs": hashes, "code": chash, "config": cfg.key_dict()},
                                    sort_keys=True).encode()).hexdigest()
    old = None if force else _up_to_date(out_dir, key)
    if old is not None:
        log.info("data/processed is up to date (inputs, code and config match the manifest); "
                 "nothing to do. Use --force to rebuild.")
        old["skipped"] = True
        return old

    out_dir.mkdir(parents=True, exist_ok=True)
    labels = load_distilled(root / "labels" / "distilled.jsonl") if root is not None else {}
    got = _collect(root, bpath, cfg, labels, progress)
    by_split, acc_rows, fingerprint = _write_dataset(out_dir, got.dataset_sessions, labels, progress)
    outputs, eval_files = _write_sessions(out_dir, got)
    acc = weak_label_accuracy(acc_rows) if acc_rows else {}
    manifest = _manifest(cfg, root, key, chash, hashes, got, by_split, labels, acc, eval_files, fingerprint, outputs)
    (out_dir / "weak_label_accuracy.md").write_text(
        "# Weak-label accuracy against the distilled labels\n\n" + (accuracy_table_markdown(acc) if acc else "(no gold labels)") + "\n",
        encoding="utf-8")
    manifest["build_seconds"] = round(time.perf_counter() - t0, 1)
    manifest["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    _write_manifest(out_dir / "manifest.json", manifest)
    log.info("built %s in %.1f s (peak RSS %.0f MB): %s rows, eval %d sessions / %d messages, dev %d / %d",
             out_dir, manifest["build_seconds"], manifest["peak_rss_mb"], manifest["counts"]["split"],
             eval_files["eval_sessions.jsonl"]["sessions"], eval_files["eval_sessions.jsonl"]["messages"],
             eval_files["dev_sessions.jsonl"]["sessions"], eval_files["dev_sessions.jsonl"]["messages"])
    return manifest


def _manifest(cfg: BuildConfig, root: Path | None, key: str, chash: str, hashes: dict[str, str], got: _Collected,
              by_split: dict[str, list[dict[str, Any]]], labels: dict[str, dict[str, Any]], acc: dict[str, Any],
              eval_files: dict[str, dict[str, Any]], fingerprint: str, outputs: dict[str, str]) -> dict[str, Any]:
    """The manifest of a build (see the module docstring); ``build_seconds`` and ``peak_rss_mb`` are added last."""
    return {
        "format_version": FORMAT_VERSION,
        "build_key": key,
        "code_hash": chash,
        "config": cfg.key_dict(),
        "mode": ("full" if cfg.sources is None else "partial") if root is not None else "bundled-only",
        "corpora_root": str(root) if root is not None else None,
        "corpora_env": CORPORA_ENV,
        "created_unix": int(time.time()),
        "inputs": hashes,
        "sources": _sources_info(got, by_split),
        "counts": _counts(by_split),
        "groups_per_split": {sp: len({r["group"] for r in by_split[sp]}) for sp in SPLITS},
        "split_method": {"default": "sha1 of the group name (training.data.splits.split_of)",
                         **{src: "rank by hash, fixed counts (training.data.splits.assign_few)"
                            for src in got.split_assignments}},
        "split_assignments": got.split_assignments,
        "distilled_labels": {"total": len(labels), "matched": got.label_hits},
        "value_target": "value = importance / 3 (see training/data/labels.py)",
        "weak_label_accuracy": acc,
        "eval_files": eval_files,
        "dataset_fingerprint": fingerprint,
        "outputs": outputs,
        "known_gaps": _known_gaps(root, got.present),
    }


def _write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _write_sessions_gz(path: Path, sessions: list[CorpusSession]) -> str:
    tmp = path.with_suffix(".tmp")
    # mtime=0 keeps the gzip bytes identical across builds of the same data
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        for s in sessions:
            gz.write((json.dumps(_session_record(s), ensure_ascii=False) + "\n").encode("utf-8"))
    os.replace(tmp, path)
    return sha256_file(path)


def _counts(by_split: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    c: dict[str, Any] = {k: Counter() for k in ("split", "source", "language", "category", "label_source")}
    by_source_split: dict[str, Counter[str]] = defaultdict(Counter)
    by_split_category: dict[str, Counter[str]] = defaultdict(Counter)
    by_source_category: dict[str, Counter[str]] = defaultdict(Counter)
    by_source_label: dict[str, Counter[str]] = defaultdict(Counter)
    gold_category: Counter[str] = Counter()
    for sp, rows in by_split.items():
        for r in rows:
            c["split"][sp] += 1
            c["source"][r["source"]] += 1
            c["language"][r["language"]] += 1
            c["category"][r["category"]] += 1
            c["label_source"][r["label_source"]] += 1
            by_source_split[r["source"]][sp] += 1
            by_split_category[sp][r["category"]] += 1
            by_source_category[r["source"]][r["category"]] += 1
            by_source_label[r["source"]][r["label_source"]] += 1
            if r["label_source"] != "weak":
                gold_category[r["category"]] += 1
    out = {k: dict(sorted(v.items())) for k, v in c.items()}
    out["gold_category"] = dict(sorted(gold_category.items()))
    out["source_split"] = {k: dict(v) for k, v in sorted(by_source_split.items())}
    out["split_category"] = {k: dict(sorted(v.items())) for k, v in by_split_category.items()}
    out["source_category"] = {k: dict(sorted(v.items())) for k, v in sorted(by_source_category.items())}
    out["source_label_source"] = {k: dict(sorted(v.items())) for k, v in sorted(by_source_label.items())}
    return out


def load_dataset_dict(path: str | os.PathLike[str] | None = None):
    """The message-level ``DatasetDict`` saved by :func:`build` (``data/processed`` by default).

    Raises:
        FileNotFoundError: no dataset there yet (the message says how to build it).
    """
    from datasets import load_from_disk

    base = Path(path) if path is not None else DEFAULT_OUT
    ds_dir = base / "dataset" if (base / "dataset").is_dir() else base
    if not (ds_dir / "dataset_dict.json").is_file():
        raise FileNotFoundError(f"no DatasetDict at {ds_dir}; run `python -m training.data build` first")
    return load_from_disk(str(ds_dir))


def load_manifest(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """``manifest.json`` of a build (``data/processed`` by default).

    Raises:
        FileNotFoundError: no manifest there yet.
    """
    base = Path(path) if path is not None else DEFAULT_OUT
    p = base / "manifest.json"
    if not p.is_file():
        raise FileNotFoundError(f"no manifest at {p}; run `python -m training.data build` first")
    return json.loads(p.read_text(encoding="utf-8"))


def load_eval_sessions(path: str | os.PathLike[str] | None = None, which: str = "eval") -> list[dict[str, Any]]:
    """Evaluation sessions (``which`` = ``"eval"`` for the held-out test file, ``"dev"`` for the dev
    file) from a build folder, or from a JSONL file path.

    Raises:
        FileNotFoundError: the file is missing (the message says how to build it).
        ValueError: ``which`` is not ``"eval"`` or ``"dev"``.
        ctxscore.errors.InputError: a line is not valid JSON (the message names the file and line).
    """
    if which not in ("eval", "dev"):
        raise ValueError(f"which must be 'eval' or 'dev', got {which!r}")
    p = Path(path) if path is not None else DEFAULT_OUT
    if p.is_dir():
        p = p / f"{which}_sessions.jsonl"
    if not p.is_file():
        raise FileNotFoundError(f"no evaluation sessions at {p}; run `python -m training.data build` first")
    return [obj for _, obj in iter_jsonl(p)]

"""Real text every machine has: this Python's standard library source, as BPE token shards.

``prepare`` runs once per (Python build, vocabulary, eval fraction) and caches
its output under ``cache_dir`` (default ``$COHORT_DATA_DIR``, else
``~/.cache/cohort/data``):

1. list the standard library's ``*.py`` files (no ``site-packages``, no test
   suites), sorted;
2. split them by file into train and eval, by a hash of each file's relative
   path, so no file straddles the two;
3. train a byte-level BPE tokenizer (Hugging Face ``tokenizers``) on the train
   files only;
4. encode every file, with ``<|endoftext|>`` between files, and write the
   token shards (``tokens.write_shards``) with ``tokenizer.json`` beside them.

Each step logs its progress. ``meta.json`` also records the unigram baseline:
the cross-entropy on the eval split of the train split's token frequencies
(add-one smoothed), in nats per token. A model that only learns which tokens
are common reaches it; anything below it has learned context.

Ranks that share a node share the cache and prepare it once (a file lock).
Ranks on separate nodes each prepare their own copy. That is deterministic:
the same Python build gives the same files, the BPE trainer breaks ties by
pair order, and the test suite checks two preparations byte for byte.

Directories named in ``$COHORT_DATA_PREPARED`` (``:``-separated, read only)
are looked in before the cache: the trainer image prepares the default
settings into one at build time (``python -m cohort.trainer.workloads.python_source
DIR``), with the Python it runs, so its workers find the shards there and
prepare nothing (about 11 s of CPU and 0.85 GB of memory each, measured on the
2-core host).
"""

from __future__ import annotations

import fcntl
import hashlib
import math
import os
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

from ..log import get_logger
from .tokens import FORMAT, write_shards

log = get_logger(__name__)

PREP_VERSION = 1  # bump when the preparation's output would change for the same inputs
EOT = "<|endoftext|>"
SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def source_files(root: Path | None = None) -> list[Path]:
    root = root or Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if not SKIP_DIRS.intersection(p.relative_to(root).parts))


def is_eval(relpath: str, eval_fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha256(relpath.encode()).digest()[:8], "big")
    return h % 10_000 < round(eval_fraction * 10_000)


def default_cache_dir() -> Path:
    return Path(os.environ.get("COHORT_DATA_DIR") or Path.home() / ".cache" / "cohort" / "data")


def prepared_dirs() -> list[Path]:
    """The read-only directories of data prepared ahead of time (``$COHORT_DATA_PREPARED``), in order."""
    return [Path(d) for d in os.environ.get("COHORT_DATA_PREPARED", "").split(":") if d]


def prepare(vocab_size: int = 4096, cache_dir: str = "", eval_fraction: float = 0.05,
            root: Path | None = None, limit_files: int = 0) -> Path:
    """The token-shard directory for these settings, prepared first if it is not cached yet.

    ``root`` and ``limit_files`` (the first N files) exist for tests.
    """
    if not 256 + 1 <= vocab_size <= 1 << 16:
        raise ValueError(f"vocab_size must be in [257, 65536], got {vocab_size}")
    if not 0 < eval_fraction < 0.5:
        raise ValueError(f"eval_fraction must be in (0, 0.5), got {eval_fraction}")
    root = root or Path(sysconfig.get_paths()["stdlib"])
    files = source_files(root)
    if limit_files:
        files = files[:limit_files]
    fingerprint = hashlib.sha256(repr((FORMAT, PREP_VERSION, sys.version, vocab_size, eval_fraction,
                                       [(str(f.relative_to(root)), f.stat().st_size) for f in files])).encode())
    name = f"python-source-{fingerprint.hexdigest()[:12]}"
    for ready in prepared_dirs():
        if (ready / name / "meta.json").exists():
            return ready / name
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    out = cache / name
    if (out / "meta.json").exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one preparation per node; the others wait and reuse it
        if not (out / "meta.json").exists():
            _prepare(files, root, vocab_size, eval_fraction, out)
    return out


def _prepare(files: list[Path], root: Path, vocab_size: int, eval_fraction: float, out: Path) -> None:
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError as e:
        raise ValueError("dataset python-source needs the 'tokenizers' package (in the trainer image and "
                         "the project's virtualenv)") from e
    t0 = time.monotonic()
    texts = {str(f.relative_to(root)): f.read_text(encoding="utf-8", errors="replace") for f in files}
    names: dict[str, list[str]] = {"train": [], "eval": []}
    for n in texts:
        names["eval" if is_eval(n, eval_fraction) else "train"].append(n)
    if not names["train"] or not names["eval"]:
        raise ValueError(f"{len(texts)} files do not make both a train and an eval split")
    log.info("python-source: read files", extra={
        "root": str(root), "files": len(texts), "mb": round(sum(map(len, texts.values())) / 1e6, 1),
        "train_files": len(names["train"]), "eval_files": len(names["eval"]), "out": str(out)})

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[EOT])
    tok.train_from_iterator((texts[n] for n in names["train"]), trainer, length=len(names["train"]))
    log.info("python-source: trained the tokenizer", extra={"vocab": tok.get_vocab_size(),
                                                            "seconds": round(time.monotonic() - t0, 1)})
    eot = tok.token_to_id(EOT)
    ids: dict[str, np.ndarray] = {}
    done, total, chunk = 0, len(texts), 64
    for split, split_names in names.items():
        parts: list[np.ndarray] = []
        for start in range(0, len(split_names), chunk):
            batch = split_names[start:start + chunk]
            for enc in tok.encode_batch([texts[n] for n in batch]):
                parts += [np.asarray(enc.ids, dtype=np.int64), np.asarray([eot], dtype=np.int64)]
            done += len(batch)
            log.info("python-source: encoding", extra={"files_done": done, "files": total,
                                                       "percent": round(100 * done / total)})
        ids[split] = np.concatenate(parts)
    baseline = unigram_cross_entropy(ids["train"], ids["eval"], tok.get_vocab_size())
    with tempfile.TemporaryDirectory() as tmp:
        tok_path = Path(tmp) / "tokenizer.json"
        tok.save(str(tok_path))
        write_shards(out, ids, tok.get_vocab_size(), files={"tokenizer.json": tok_path},
                     extra={"source": {"python": sys.version.split()[0], "files": total,
                                       "eval_fraction": eval_fraction},
                            "baseline": {"unigram_eval_loss": round(baseline, 4)}})
    log.info("python-source: prepared", extra={
        "train_tokens": int(len(ids["train"])), "eval_tokens": int(len(ids["eval"])),
        "unigram_eval_loss": round(baseline, 4), "unigram_perplexity": round(math.exp(baseline), 1),
        "seconds": round(time.monotonic() - t0, 1), "out": str(out)})


def unigram_cross_entropy(train: np.ndarray, held_out: np.ndarray, vocab_size: int) -> float:
    """Nats per token on ``held_out`` of train's add-one-smoothed token frequencies."""
    counts = np.bincount(train, minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[held_out].mean())


def main(argv: list[str] | None = None) -> None:
    """``python -m cohort.trainer.workloads.python_source DIR [VOCAB_SIZE]``: prepare into DIR (an image build)."""
    import argparse

    parser = argparse.ArgumentParser(description="Prepare the python-source token shards into a directory.")
    parser.add_argument("dir", help="where the shards go (a directory for $COHORT_DATA_PREPARED)")
    parser.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args(argv)
    print(prepare(vocab_size=args.vocab_size, cache_dir=args.dir))


if __name__ == "__main__":
    main()

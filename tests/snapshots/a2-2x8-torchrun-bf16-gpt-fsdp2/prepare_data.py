"""Turn text into the token files train.py reads: python prepare_data.py SOURCE.

SOURCE is a folder of .txt files (read recursively, in name order) or a .jsonl
file with a "text" field on each line. Each document is tokenized with a
byte-level tokenizer (its UTF-8 bytes are the tokens 0-255, and token 256 ends a
document), so nothing needs downloading. The first 90% of every document's
tokens go to train.bin, the rest to val.bin, both into the data folder with
meta.json beside them (dtype, vocabulary size, token counts). The files appear
only when complete, so running it again, or after a failure, is safe.
"""

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

PROJECT_DIR = Path(__file__).resolve().parent
DATA_DIR = PROJECT_DIR / "data"
END_OF_TEXT = 256  # after the 256 byte values
VOCAB_SIZE = 257
DTYPE = np.uint16  # holds every token id; recorded in meta.json
VAL_FRACTION = 0.1


def documents(source: Path) -> Iterator[tuple[str, str]]:
    """(name, text) of every document in SOURCE: each .txt file of a folder, or each line of a .jsonl file."""
    if source.is_dir():
        files = sorted(path for path in source.rglob("*.txt") if path.is_file())
        if not files:
            sys.exit(f"no .txt file in {source}")
        for path in files:
            yield (
                str(path.relative_to(source)),
                path.read_text(encoding="utf-8", errors="replace"),
            )
    elif source.suffix == ".jsonl":
        with source.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)["text"]
                except (ValueError, KeyError, TypeError):
                    sys.exit(
                        f'{source} line {number}: not a JSON object with a "text" field'
                    )
                yield f"{source.name}:{number}", str(text)
    else:
        sys.exit(f"{source} is neither a folder of .txt files nor a .jsonl file")


class Tokenizer:
    """The byte-level tokenizer: a document's UTF-8 bytes, END_OF_TEXT after them."""

    name = "bytes"
    vocab_size = VOCAB_SIZE
    end_of_text = END_OF_TEXT
    dtype = DTYPE

    def tokenize(self, text: str) -> np.ndarray:
        """The byte-level tokens of `text`, ending with END_OF_TEXT."""
        data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(DTYPE)
        return np.append(data, DTYPE(END_OF_TEXT))


def prepare(source: Path, data_dir: Path, tokenizer: Tokenizer) -> dict[str, int]:
    """Write train.bin, val.bin and meta.json of SOURCE's documents into `data_dir`; the tokens of each."""
    data_dir.mkdir(parents=True, exist_ok=True)
    counts = {"train": 0, "val": 0}
    partial = {split: data_dir / f"{split}.bin.partial" for split in counts}
    with partial["train"].open("wb") as train, partial["val"].open("wb") as val:
        for number, (name, text) in enumerate(documents(source), 1):
            tokens = tokenizer.tokenize(text)
            cut = len(tokens) - max(1, int(len(tokens) * VAL_FRACTION))
            train.write(tokens[:cut].tobytes())
            val.write(tokens[cut:].tobytes())
            counts["train"] += cut
            counts["val"] += len(tokens) - cut
            print(
                f"[{number}] {name}: {len(tokens):,} tokens ({counts['train'] + counts['val']:,} in all)",
                flush=True,
            )
    meta = {
        "dtype": np.dtype(tokenizer.dtype).name,
        "vocab_size": tokenizer.vocab_size,
        "tokenizer": tokenizer.name,
        "end_of_text": tokenizer.end_of_text,
        "tokens": counts,
        "source": str(source.resolve()),
    }
    (data_dir / "meta.json").unlink(
        missing_ok=True
    )  # until the new one is written, train.py asks for a rerun
    for split, path in partial.items():
        os.replace(path, data_dir / f"{split}.bin")
    (data_dir / "meta.json.partial").write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(data_dir / "meta.json.partial", data_dir / "meta.json")
    return counts


def main() -> None:
    """Parse the command line and prepare the data."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "source",
        type=Path,
        help="a folder of .txt files or a .jsonl file with a text field",
    )
    parser.add_argument(
        "--data-dir", type=Path, default=DATA_DIR, help=f"default: {DATA_DIR}"
    )
    args = parser.parse_args()
    if not args.source.exists():
        sys.exit(f"{args.source} does not exist")
    tokenizer = Tokenizer()
    counts = prepare(args.source, args.data_dir, tokenizer)
    print(
        f"wrote {counts['train']:,} training and {counts['val']:,} validation tokens to {args.data_dir}"
    )


if __name__ == "__main__":
    main()

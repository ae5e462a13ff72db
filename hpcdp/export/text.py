"""Text to token ids and back, for the tokenizers hpcdp's token files are made with.

- ``bytes``: ids 0-255 are UTF-8 bytes, the end id (256) ends a document;
- a tokenizer.json (BPE or given): HuggingFace ``tokenizers``;
- anything else (the Markov corpus's symbols): no text; prompts are ids written
  as numbers ("3 17 5") and output is ids.

No HDF5 here: what a tokenizer is comes from an export's config.json.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

END_MARK = "<|endoftext|>"  # how the end-of-document id of the byte tokenizer is shown


class TextError(ValueError):
    """A prompt or tokenizer that cannot be used; the message says why."""


@dataclass(frozen=True)
class Codec:
    name: str
    eod_id: int | None
    hf: Any = None  # a tokenizers.Tokenizer for tokenizer.json

    @property
    def has_text(self) -> bool:
        return self.name == "bytes" or self.hf is not None

    def encode(self, prompt: str) -> list[int]:
        """The prompt's ids; an empty prompt starts a document (the end id before it)."""
        if not prompt:
            if self.eod_id is None:
                raise TextError("an empty prompt starts after the end-of-document id, which "
                                "this tokenizer does not name: give --prompt")
            return [self.eod_id]
        if self.name == "bytes":
            return list(prompt.encode())
        if self.hf is not None:
            return list(self.hf.encode(prompt, add_special_tokens=False).ids)
        try:
            return [int(t) for t in prompt.split()]
        except ValueError:
            raise TextError(f"tokenizer {self.name!r} has no text: write the prompt as token "
                            f"ids separated by spaces, e.g. --prompt '3 17 5'") from None

    def decode(self, ids: Sequence[int]) -> str:
        if self.name == "bytes":
            parts, run = [], bytearray()
            for t in ids:
                if 0 <= t < 256:
                    run.append(t)
                else:
                    parts.append(run.decode("utf-8", errors="replace"))
                    parts.append(END_MARK if t == self.eod_id else f"<{t}>")
                    run = bytearray()
            return "".join(parts) + run.decode("utf-8", errors="replace")
        if self.hf is not None:
            return str(self.hf.decode(list(ids), skip_special_tokens=False))
        return " ".join(str(t) for t in ids)


def codec(tokenizer: Mapping[str, Any] | None, tokenizer_json: str | None) -> Codec:
    """The codec an export's tokenizer entry (and its tokenizer.json text) describe."""
    entry = dict(tokenizer or {})
    name, eod = entry.get("name"), entry.get("eod_id")
    if tokenizer_json is not None:
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise TextError("HuggingFace tokenizers is not installed (pip install "
                            "tokenizers)") from e
        return Codec(str(name or "tokenizer.json"), eod, Tokenizer.from_str(tokenizer_json))
    if name is not None and name not in ("bytes",) and not str(name).startswith("markov-"):
        raise TextError(f"tokenizer {name!r}: its tokenizer.json is not in the export (was it "
                        "beside the training data when it was exported?)")
    return Codec(str(name or "ids"), eod)

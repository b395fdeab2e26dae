"""Tokenizers for the models ssmport ports.

RWKV World (RWKV-4 World through RWKV-7): :class:`WorldTokenizer`, greedy
longest match over UTF-8 bytes, id-exact with the reference ``TRIE_TOKENIZER``.
Hugging Face ``tokenizer.json`` (Mamba-2's GPT-NeoX BPE, fla models): passed
through into bundles and run by the ``tokenizers`` package (:class:`HFJsonTokenizer`).
"""

from .corpus import build_corpus, verification_corpus
from .hf_json import HF_JSON_KIND, HF_TOKENIZER_FILENAME, HFJsonTokenizer
from .kinds import WORLD_KIND, find_tokenizer, load_tokenizer, tokenizer_kind, tokenizer_vocab_size
from .vocab_files import (
    BUNDLED_WORLD_VOCAB,
    VOCAB_FILENAMES,
    VocabError,
    detect_vocab_format,
    find_vocab,
    load_vocab,
    parse_vocab,
    parse_vocab_tsv,
    parse_vocab_txt,
    vocab_tsv_bytes,
)
from .vocab_tsv import VocabExportInfo, VocabVerificationError, export_vocab_tsv, verify_vocab_tsv
from .protocol import StreamDecoder, Tokenizer
from .world import TokenizerError, WorldTokenizer

__all__ = [
    "BUNDLED_WORLD_VOCAB",
    "HF_JSON_KIND",
    "HF_TOKENIZER_FILENAME",
    "HFJsonTokenizer",
    "WORLD_KIND",
    "find_tokenizer",
    "load_tokenizer",
    "tokenizer_kind",
    "tokenizer_vocab_size",
    "VOCAB_FILENAMES",
    "StreamDecoder",
    "Tokenizer",
    "TokenizerError",
    "VocabError",
    "VocabExportInfo",
    "VocabVerificationError",
    "WorldTokenizer",
    "build_corpus",
    "detect_vocab_format",
    "export_vocab_tsv",
    "find_vocab",
    "load_vocab",
    "parse_vocab",
    "parse_vocab_tsv",
    "parse_vocab_txt",
    "verification_corpus",
    "verify_vocab_tsv",
    "vocab_tsv_bytes",
]

import lance
import pyarrow as pa
import pytest

from lance_assets import paths
from lance_assets.ingest.synthetic import SyntheticSpec, generate
from lance_assets.table import Table
from lance_assets.table.producer import produce
from lance_assets.tokens import token_ids
from lance_assets.tokens.token_ids import TokenizerMismatchError
from lance_assets.tokens.tokenizers import load_tokenizer, table_tokenizer
from lance_assets_tests.helpers import quiet

EDGE_CASES = ["", "a", "héllo wörld", "日本語のテキスト", "emoji 🧪🚀 and ZWJ 👩‍👩‍👧", "tab\tnew\nline\r\n",
              "\u0000 nul and \ufeff bom", "<|endoftext|> looks special but is text", "ﬁ ligature",
              "<|pad|><|endoftext|>", "e\u0301 (NFD) vs \u00e9 (NFC)", "שָׁלוֹם עולם and العربية",
              "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 and 𠜎𠜱 (astral)", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇", "\u2028line\u2029para\x85nel\x0b\x0c",
              "12345678901234567890 3.14159 1e-9", "   leading and trailing   ", "\n\n\n\t \t",
              "a" * 5000, "🙂" * 300, "x\u200by\u200dz\ufe0f", "Ⅻ ½ ² ∞ ≠ ∑", "don't we'll they'RE I'M"]


@pytest.mark.parametrize("name", ["byte", "cl100k_base", "bpe"])
def test_round_trip_and_pad_is_never_a_real_token(name, bpe_root):
    """Every document of the demo corpus, another seed's, and unicode edge cases."""
    tok = load_tokenizer(name, bpe_root)
    texts = (generate(SyntheticSpec()).column("text").to_pylist()
             + generate(SyntheticSpec(rows=300, seed=1)).column("text").to_pylist() + EDGE_CASES)
    ids = tok.encode_batch(pa.array(texts))
    assert len(ids) == len(texts)
    for text, row in zip(texts, ids.to_pylist()):
        assert tok.decode(row) == text
        assert row == tok.encode(text)
        assert tok.info.pad_id not in row and tok.info.eos_id not in row
    assert tok.info.pad_id != tok.info.eos_id
    assert tok.info.pad_id < tok.info.vocab_size
    assert max(v for row in ids.to_pylist() for v in row) < tok.info.pad_id


def test_byte_tokens_are_utf8_bytes_of_a_sliced_array():
    tok = load_tokenizer("byte")
    arr = pa.array(["xx", "ab", "é"]).slice(1)
    assert tok.encode_batch(arr).to_pylist() == [[97, 98], [195, 169]]


def test_token_columns_and_tokenizer_recorded_in_table(root):
    from lance_assets.ingest.raw_text import ingest

    ingest(Table.of(root), "synthetic:200", rows_per_fragment=100, log=quiet)
    report = produce(token_ids.PRODUCER, Table.of(root),
                     token_ids.TokenIdsSettings(tokenizer="cl100k_base"), log=quiet)
    info = report.tokenizer
    tokens = report.tokens_written
    ds = lance.dataset(paths.table_uri(root))
    assert table_tokenizer(ds) == info and info.name == "cl100k_base"
    rows = ds.to_table(columns=["text", "input_ids", "n_tokens"]).to_pylist()
    assert sum(r["n_tokens"] for r in rows) == tokens
    assert all(r["n_tokens"] == len(r["input_ids"]) for r in rows)
    tok = load_tokenizer("cl100k_base")
    assert all(tok.decode(r["input_ids"]) == r["text"] for r in rows)

    version = ds.version
    with pytest.raises(TokenizerMismatchError, match="replace=True.*or 'cl100k_base'"):
        produce(token_ids.PRODUCER, Table.of(root), token_ids.TokenIdsSettings(tokenizer="byte"), log=quiet)
    ds = lance.dataset(paths.table_uri(root))
    assert ds.version == version and table_tokenizer(ds) == info

    # re-tokenizing is a new table version; the old version keeps its tokens
    report = produce(token_ids.PRODUCER, Table.of(root),
                     token_ids.TokenIdsSettings(tokenizer="byte", replace=True), log=quiet)
    byte_info = report.tokenizer
    assert report.replaced and len(report.fragments_written) == 2 and byte_info.name == "byte"
    ds = lance.dataset(paths.table_uri(root))
    assert table_tokenizer(ds) == byte_info
    assert ds.to_table(columns=["input_ids"]).column(0).to_pylist()[0] == list(rows[0]["text"].encode())
    old = lance.dataset(paths.table_uri(root), version=version)
    assert table_tokenizer(old) == info
    assert old.to_table(columns=["input_ids"]).column(0).to_pylist()[0] == rows[0]["input_ids"]


def test_unknown_tokenizer_is_a_clear_error():
    with pytest.raises(ValueError, match="could not load it offline"):
        load_tokenizer("no_such_encoding")


def test_tiktoken_encodings_never_download(tmp_path, monkeypatch):
    """gpt2 / r50k_base load only from tiktoken's cache: an empty cache is an error, not a fetch."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    for name in ("gpt2", "r50k_base"):
        with pytest.raises(ValueError, match="not in tiktoken's cache.*TIKTOKEN_CACHE_DIR"):
            load_tokenizer(name)

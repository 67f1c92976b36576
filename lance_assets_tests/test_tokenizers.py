import lance
import pyarrow as pa
import pytest

from lance_assets import paths
from lance_assets.corpus.synthetic import SyntheticSpec, generate
from lance_assets.corpus.tokenize import TokenizerMismatchError, table_tokenizer, token_ids
from lance_assets.corpus.tokenizers import load_tokenizer
from lance_assets_tests.conftest import quiet

EDGE_CASES = ["", "a", "héllo wörld", "日本語のテキスト", "emoji 🧪🚀 and ZWJ 👩‍👩‍👧", "tab\tnew\nline\r\n",
              "\u0000 nul and \ufeff bom", "<|endoftext|> looks special but is text", "ﬁ ligature"]


@pytest.mark.parametrize("name", ["byte", "cl100k_base"])
def test_round_trip_and_pad_is_never_a_real_token(name):
    tok = load_tokenizer(name)
    texts = generate(SyntheticSpec(rows=300, seed=1)).column("text").to_pylist() + EDGE_CASES
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
    from lance_assets.corpus.ingest import ingest

    ingest(root, "synthetic:200", rows_per_fragment=100, log=quiet)
    report, info, tokens = token_ids(root, "cl100k_base", log=quiet)
    ds = lance.dataset(paths.table_uri(root))
    assert table_tokenizer(ds) == info and info.name == "cl100k_base"
    rows = ds.to_table(columns=["text", "input_ids", "n_tokens"]).to_pylist()
    assert sum(r["n_tokens"] for r in rows) == tokens
    assert all(r["n_tokens"] == len(r["input_ids"]) for r in rows)
    tok = load_tokenizer("cl100k_base")
    assert all(tok.decode(r["input_ids"]) == r["text"] for r in rows)

    version = ds.version
    with pytest.raises(TokenizerMismatchError, match="keep tokenizer='cl100k_base'"):
        token_ids(root, "byte", log=quiet)
    ds = lance.dataset(paths.table_uri(root))
    assert ds.version == version and table_tokenizer(ds) == info


def test_unknown_tokenizer_is_a_clear_error():
    with pytest.raises(ValueError, match="could not load it offline"):
        load_tokenizer("no_such_encoding")

"""The GGUF-built tokenizer and chat template against transformers on the same model file."""

from __future__ import annotations

import os

import pytest

from tessera.formats.chat_template import ChatTemplateError
from tessera.formats.tokenizer import TokenizerError, default_model_path, load_tokenizer

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEXTS = [
    "Hello world",
    "  leading spaces and trailing   ",
    "def f(x):\n    return x ** 2  # square\n\n\tif x:\n\t\tpass",
    "日本語のテキストと中文字符，还有한국어",
    "emoji 🎉👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "combining: e\u0301 a\u0300\u0323 Z\u0351\u0368\u0364 n\u0303",
    "whitespace\r\n\r\n  \u00a0\u3000 runs\n\n\n",
    "numbers 3.14159 and 1,000,000 and  42 and\n\n1. item",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "don't they'll we've I'M",
    "Ελληνικά, русский, العربية, עברית",
    "",
]


@pytest.fixture(scope="module")
def ours():
    return load_tokenizer("default")


@pytest.fixture(scope="module")
def oracle():
    """transformers' own conversion of the same GGUF file."""
    path = default_model_path()
    return transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path))


@pytest.fixture(scope="module")
def original(oracle):
    """transformers' GGUF tokenizer with SmolLM2's original pre-tokenizer (tokenizer.json of
    HuggingFaceTB/SmolLM2: digits isolated, then GPT-2's byte-level regex). transformers'
    GGUF converter ignores tokenizer.ggml.pre = "smollm" and splits like plain GPT-2."""
    backend = tokenizers.Tokenizer.from_str(oracle.backend_tokenizer.to_str())
    pre = tokenizers.pre_tokenizers
    backend.pre_tokenizer = pre.Sequence([pre.Digits(individual_digits=True),
                                          pre.ByteLevel(add_prefix_space=False, use_regex=True)])
    return backend


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_original_tokenizer(ours, original, text):
    for special in (True, False):
        assert ours.encode(text, add_special_tokens=special) == \
            original.encode(text, add_special_tokens=special).ids


@pytest.mark.parametrize("text", [t for t in TEXTS if not any(c.isdigit() for c in t)])
def test_encode_matches_transformers_gguf_without_digits(ours, oracle, text):
    assert ours.encode(text) == oracle.encode(text)


def test_digits_isolated_like_llama_cpp_smollm(ours, oracle):
    # The one place transformers' GGUF conversion differs: a whitespace run before a digit.
    # llama.cpp's "smollm" pre-tokenizer splits digits first, so "\n\n" stays one token.
    text = "a\n\n1"
    ids = ours.encode(text)
    assert ours.decode(ids) == text
    assert ids[1:] == [ours.backend.token_to_id("ĊĊ"), ours.backend.token_to_id("1")]
    assert oracle.encode(text) != ids


@pytest.mark.parametrize("text", TEXTS)
def test_decode_matches_transformers(ours, oracle, text):
    ids = oracle.encode(text)
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == \
            oracle.decode(ids, skip_special_tokens=skip)
    assert ours.decode(ours.encode(text), skip_special_tokens=False) == text


def test_model_facts(ours, oracle):
    assert ours.vocab_size == len(oracle) == 49152
    assert ours.eos_token_ids == [oracle.eos_token_id]
    assert ours.special_ids == set(oracle.all_special_ids) | {
        i for i, t in oracle.added_tokens_decoder.items() if t.special}
    assert ours.context_length == 8192
    assert ours.special_tokens["bos_token"] == oracle.bos_token


CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer in haiku."},
     {"role": "user", "content": "桜が咲いた 🌸 — e\u0301te\u0301?"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"},
     {"role": "user", "content": "tell me a joke about 42"}],
]


@pytest.mark.parametrize("chat", CHATS)
@pytest.mark.parametrize("gen", [True, False])
def test_chat_template_matches_transformers(ours, oracle, chat, gen):
    text = ours.apply_chat_template(chat, add_generation_prompt=gen)
    assert text == oracle.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False)
    ids = oracle.apply_chat_template(chat, add_generation_prompt=gen, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    if not any(c.isdigit() for c in text):
        assert ours.encode(text, add_special_tokens=False) == list(ids)


def test_template_errors_are_clear(ours):
    with pytest.raises(ChatTemplateError, match="content"):
        ours.apply_chat_template([{"role": "user"}])


def test_hf_folder_round_trip(ours, oracle, tmp_path):
    oracle.save_pretrained(tmp_path)
    folder = load_tokenizer(str(tmp_path))
    assert folder.chat_template == ours.chat_template
    assert folder.eos_token_ids == ours.eos_token_ids
    for text in TEXTS:
        assert folder.decode(folder.encode(text), skip_special_tokens=False) == text
    chat = CHATS[1]
    assert folder.apply_chat_template(chat) == ours.apply_chat_template(chat)


def test_missing_model_says_what_to_do(tmp_path):
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        load_tokenizer(str(tmp_path / "nope"))


def test_broken_gguf_is_a_clear_error(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x01" * 10)
    with pytest.raises(TokenizerError, match="not a readable GGUF"):
        load_tokenizer(str(bad))


def test_config_only_model_gives_an_ids_only_tokenizer(tmp_path):
    config = tmp_path / "bench.json"
    config.write_text('{"vocab_size": 128256, "max_position_embeddings": 4096, '
                      '"eos_token_id": [128001, 128009]}')
    with pytest.raises(TokenizerError, match="not found"):
        load_tokenizer(str(config))  # without dummy weights a tokenizer is required
    tok = load_tokenizer(str(config), ids_only_ok=True)
    assert (tok.vocab_size, tok.context_length, tok.eos_token_ids) == \
        (128256, 4096, [128001, 128009])
    assert tok.decode([1, 2, 3]) == ""
    with pytest.raises(TokenizerError, match="send input_ids"):
        tok.encode("hello")


def test_encoding_a_long_text_lets_other_threads_run(ours):
    """A megabyte of text takes the tokenizer a good fraction of a second: the process's
    heartbeat thread must run meanwhile, or the supervisor takes the process for hung."""
    import threading
    import time

    text = "hello world " * 100_000
    ticks: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.005)

    ticker = threading.Thread(target=tick)
    ticker.start()
    time.sleep(0.05)
    try:
        start = time.monotonic()
        ids = ours.encode(text)
        end = time.monotonic()
    finally:
        stop.set()
        ticker.join()
    assert len(ids) == 200_001
    during = [t for t in ticks if start + 0.01 < t < end - 0.01]
    assert len(during) >= 3, f"{len(during)} ticks in {end - start:.2f} s of encoding"
    assert ours.encode(text[:5000]) == ours.backend.encode(text[:5000]).ids  # same ids

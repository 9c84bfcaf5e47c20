"""The endpoints and request forms of a router made for SGLang workers (the SGLang Model
Gateway): its worker registration reads /get_model_info and /get_server_info, and it sends
every SGLang extension field at its default value, which must be taken (and any other value
refused)."""

from __future__ import annotations

import json

import pytest

from tests.server.harness import ServerUnderTest

# What the gateway (sglang-router 0.3.2) sends for a plain request, captured from its wire.
GATEWAY_GENERATE = {"text": "Hello there", "model": None,
                    "sampling_params": {"temperature": 0.0, "max_new_tokens": 3},
                    "return_text_in_logprobs": False, "stream": False, "log_metrics": True,
                    "return_hidden_states": False, "background": False, "no_logs": False,
                    "return_bytes": False, "return_entropy": False}
GATEWAY_COMPLETION = {"model": "SmolLM2-135M-Instruct", "prompt": "Hello there", "max_tokens": 3,
                      "stream": False, "echo": False, "no_stop_trim": False,
                      "ignore_eos": False, "skip_special_tokens": True,
                      "return_hidden_states": False}
GATEWAY_CHAT = {"messages": [{"role": "user", "content": "hi"}],
                "model": "SmolLM2-135M-Instruct", "logprobs": False,
                "max_completion_tokens": 3, "stream": False, "no_stop_trim": False,
                "ignore_eos": False, "continue_final_message": False,
                "skip_special_tokens": True, "separate_reasoning": True,
                "stream_reasoning": True, "return_hidden_states": False}


@pytest.mark.parametrize("path", ["/get_model_info", "/model_info"])
def test_model_info(server: ServerUnderTest, path: str) -> None:
    status, _, body = server.request("GET", path)
    info = json.loads(body)
    assert status == 200 and info["is_generation"] is True
    assert info["served_model_name"] == "SmolLM2-135M-Instruct"
    # "default" is no folder: a path the gateway would try to download as a hub name.
    assert info["model_path"] is None and info["tokenizer_path"] is None


@pytest.mark.parametrize("path", ["/get_server_info", "/server_info"])
def test_server_info(server: ServerUnderTest, path: str) -> None:
    status, _, body = server.request("GET", path)
    info = json.loads(body)
    # dp_size 1: the gateway must treat the server as one worker, not split it.
    assert status == 200 and info["dp_size"] == 1 and info["tp_size"] == server.config.tp_size


@pytest.mark.parametrize("path,body", [("/generate", GATEWAY_GENERATE),
                                       ("/v1/completions", GATEWAY_COMPLETION),
                                       ("/v1/chat/completions", GATEWAY_CHAT)])
def test_gateway_defaults_are_taken(server: ServerUnderTest, path: str,
                                    body: dict[str, object]) -> None:
    status, _, raw = server.request("POST", path, body)
    assert status == 200, raw


@pytest.mark.parametrize("path,body,field", [
    ("/generate", {**GATEWAY_GENERATE, "return_hidden_states": True}, "return_hidden_states"),
    ("/v1/completions", {**GATEWAY_COMPLETION, "no_stop_trim": True}, "no_stop_trim"),
    ("/v1/chat/completions", {**GATEWAY_CHAT, "continue_final_message": True},
     "continue_final_message"),
    ("/v1/completions", {**GATEWAY_COMPLETION, "return_hidden_states": 0},
     "return_hidden_states")])
def test_other_values_are_refused(server: ServerUnderTest, path: str, body: dict[str, object],
                                  field: str) -> None:
    status, _, raw = server.request("POST", path, body)
    assert status == 400 and json.loads(raw)["error"]["param"] == field

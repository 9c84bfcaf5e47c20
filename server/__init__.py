"""tessera's HTTP server: OpenAI-compatible and SGLang-native routes on aiohttp, built on the
asyncio client library (`tessera.client.AsyncClient`). Run as `python -m tessera.server
--run-dir DIR`; `create_app` builds the application for embedding and tests."""

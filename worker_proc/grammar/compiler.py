"""Compile grammars in background threads, cached by their text.

`submit(spec)` returns at once with a Future; the compile (xgrammar releases the GIL while it
works) runs in a small thread pool, so the worker's step loop never waits for one. The same
spec compiles once: later requests share the cached CompiledGrammar (a bounded LRU; a failure
is cached too, so a bad schema sent again fails at once). The vocabulary is read on the first
compile, in the pool as well.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tessera.bus.messages import GrammarSpec

log = logging.getLogger(__name__)

CACHE_ENTRIES = 256
# xgrammar's messages start with its C++ log location: "[12:00:00] /path/x.cc:12: Check
# failed: (cond) is false: Failed to parse JSON ...". The user needs only the last part.
_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")


class GrammarCompileError(ValueError):
    """The grammar cannot be used; the message names the request field and says why."""


class GrammarCompiler:
    def __init__(self, make_tokenizer_info: Callable[[], Any], threads: int = 2,
                 cache_entries: int = CACHE_ENTRIES) -> None:
        self._make_info = make_tokenizer_info
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="grammar-compile")
        self._cache: OrderedDict[tuple[str, str], Future[Any]] = OrderedDict()
        self._cache_entries = cache_entries
        self._lock = threading.Lock()  # the cache (taken by the step loop: held briefly)
        self._build_lock = threading.Lock()  # building the compiler (seconds, in the pool)
        self._compiler: Any = None
        self._build_error: Exception | None = None
        self.compiles = 0  # compilations started (cache misses)
        self.hits = 0

    def submit(self, spec: GrammarSpec) -> Future[Any]:
        """A Future of the CompiledGrammar; it raises GrammarCompileError for a bad grammar."""
        key = (spec.kind, spec.spec)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return cached
            future = self._pool.submit(self._compile, spec)
            self._cache[key] = future
            self.compiles += 1
            while len(self._cache) > self._cache_entries:
                self._cache.popitem(last=False)
            return future

    def _xgr_compiler(self) -> Any:
        with self._build_lock:
            if self._build_error is not None:
                raise self._build_error
            if self._compiler is None:
                import xgrammar as xgr

                try:
                    info = self._make_info()
                except Exception as exc:
                    self._build_error = exc  # the vocabulary will not appear later
                    raise
                self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
            return self._compiler

    def _compile(self, spec: GrammarSpec) -> Any:
        compiler = self._xgr_compiler()
        try:
            if spec.kind == "json_schema":
                # Compact JSON with the schema's properties only: a model cannot wander off
                # into endless whitespace or keys the schema does not name.
                return compiler.compile_json_schema(spec.spec, any_whitespace=False,
                                                    strict_mode=True)
            if spec.kind == "json_object":
                # An object (OpenAI's json_object), with any properties: not any JSON value.
                return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False,
                                                    strict_mode=False)
            if spec.kind == "regex":
                return compiler.compile_regex(spec.spec)
            if spec.kind == "grammar":
                if "::=" in spec.spec:  # EBNF / GBNF, with a `root` rule
                    return compiler.compile_grammar(spec.spec)
                return compiler.compile_lark(spec.spec)  # Lark, with a `start` rule
        except Exception as exc:  # xgrammar raises RuntimeError / ValueError subclasses
            lines = str(exc).strip().splitlines()
            detail = _LOG_PREFIX.sub("", lines[0]) if lines else type(exc).__name__
            raise GrammarCompileError(
                f"{spec.param}: the {spec.kind.replace('_', ' ')} cannot be used: "
                f"{detail}") from None
        raise GrammarCompileError(f"{spec.param}: unknown grammar kind {spec.kind!r}")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

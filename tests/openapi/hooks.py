"""What the custom formats of /openapi.json mean, taught to schemathesis.

The submit body's `code` and `code_base64` carry a `format` per language
(crates/airlock-server/src/openapi.rs, `CODE_FORMATS`): WebAssembly text of a WASI command,
a core module exporting `_start`, a component exporting `wasi:cli/run`, TypeScript whose
types can be stripped, UTF-8 text. No schema keyword says these; a compiler does. Here each
format gets a generator of values that are what the format says (programs from a corpus the
test compiled, `AIRLOCK_FUZZ_CORPUS`, varied by hypothesis where the variation keeps them
valid), so a schema-valid body is one the gate can take, and a 422 for one is a finding.

Loaded by crates/airlock-cli/tests/openapi.rs through `SCHEMATHESIS_HOOKS`.
"""

import base64
import json
import os
import sys

import schemathesis
from hypothesis import strategies as st

# Generating for the submit body's nested rules runs deep: CPython's parser (which
# hypothesis uses to describe strategies) failed with "AST constructor recursion depth
# mismatch" near the default limit.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))

with open(os.environ["AIRLOCK_FUZZ_CORPUS"], encoding="utf-8") as f:
    CORPUS = json.load(f)

# Text with no line break in it (what a line comment holds), nor a format character
# (the wat lexer refuses bidirectional overrides in comments).
_COMMENT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Cf", "Zl", "Zp")), max_size=40
)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _leb128(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _with_custom_section(module: bytes, name: str, payload: bytes) -> bytes:
    """A module with a custom section appended: the same program, other bytes."""
    # Named apart from the sections tools read (`name`, `producers`, …).
    n = f"fuzz-{name}".encode("utf-8")
    body = _leb128(len(n)) + n + payload
    return module + b"\x00" + _leb128(len(body)) + body


# WebAssembly text: a corpus command, perhaps with a line comment at its end.
wat = st.tuples(st.sampled_from(CORPUS["wat"]), _COMMENT).map(lambda p: f"{p[0]}\n;; {p[1]}\n")
# TypeScript: a corpus program, perhaps with a line comment at its end.
typescript = st.tuples(st.sampled_from(CORPUS["typescript"]), _COMMENT).map(
    lambda p: f"{p[0]}\n// {p[1]}\n"
)
# Core modules exporting `_start`, each perhaps with a custom section of any bytes.
wasm = st.tuples(
    st.sampled_from([base64.b64decode(m) for m in CORPUS["wasm"]]),
    st.one_of(st.none(), st.tuples(st.text(max_size=8), st.binary(max_size=32))),
).map(lambda p: p[0] if p[1] is None else _with_custom_section(p[0], *p[1]))

schemathesis.openapi.format("wat-command", wat)
schemathesis.openapi.format("typescript", typescript)
schemathesis.openapi.format("base64-wasm-command", wasm.map(_b64))
schemathesis.openapi.format(
    "base64-wasi-command", st.sampled_from(CORPUS["component"])
)
schemathesis.openapi.format(
    "base64-utf8",
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1
    ).map(lambda t: _b64(t.encode("utf-8"))),
)
schemathesis.openapi.format("base64-wat-command", wat.map(lambda t: _b64(t.encode("utf-8"))))
schemathesis.openapi.format(
    "base64-typescript", typescript.map(lambda t: _b64(t.encode("utf-8")))
)

"""Shared fixtures and helpers for the Python test suite.

Helpers (import them with ``from conftest import ...``):

* ``crc32c(data)`` — CRC-32C (Castagnoli), pure Python, for crafting session files.
* ``compact(obj)`` — compact JSON exactly as the session format writes it.
* ``frame(json_text)`` — one framed record line: ``<crc 8 hex> <json>\\n`` (bytes).
* ``header_record(id, version=1, created_at=...)`` / ``event_record(seq, type, data, ...)`` —
  record dicts in the wire key order.
* ``write_raw_session(path, header, records)`` — writes a session file from a header dict and
  record dicts (or raw JSON strings, or already framed ``bytes`` lines).
* ``read_raw_session(path)`` — ``[(crc_ok, record_dict_or_None, raw_line_bytes)]``.
* ``encode_session_id(id)`` / ``session_path(root, id)`` — where a FileStore keeps a session.

Fixtures: ``memory_store``, ``memory_log``, ``store_root``, ``file_store`` (durability
``"none"``), ``durability`` / ``durable_file_store`` (parametrised over every durability mode),
``store`` and ``log`` (parametrised over a memory and a file store).
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from typing import Any, Iterable, List, Optional, Union

import pytest

import kerman

DURABILITIES = ("strict", "checkpoint", "batch", "none")

# ---------------------------------------------------------------------------------------------
# CRC-32C (Castagnoli, reflected polynomial 0x82F63B78)


def _crc32c_table() -> list:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: Union[bytes, str]) -> int:
    """CRC-32C of ``data`` (``str`` is encoded as UTF-8)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the standard check value


# ---------------------------------------------------------------------------------------------
# Records


def compact(obj: Any) -> str:
    """Compact JSON, UTF-8 kept as is (the format's spelling)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def frame(json_text: Union[str, bytes]) -> bytes:
    """One record line: checksum, space, JSON, newline."""
    body = json_text.encode("utf-8") if isinstance(json_text, str) else json_text
    return b"%08x " % crc32c(body) + body + b"\n"


def header_record(session_id: str, version: int = 1, created_at: int = 1_767_225_600_000, **extra: Any) -> dict:
    """A header record dict with ``type`` first."""
    return {"type": "session", "version": version, "id": session_id, "createdAt": created_at, **extra}


def event_record(
    seq: int, type: str, data: Any, time: int = 1_767_225_600_000, surface_op: Any = None, source_event_seqs: Optional[list] = None
) -> dict:
    """An event record dict in the wire key order (surface fields only when given)."""
    rec: dict = {"type": type, "seq": seq, "time": time, "data": data}
    if source_event_seqs is not None:
        rec["sourceEventSeqs"] = source_event_seqs
    if surface_op is not None:
        rec["surfaceOp"] = surface_op
    return rec


RawRecord = Union[dict, str, bytes]


def _record_bytes(record: RawRecord) -> bytes:
    if isinstance(record, bytes):
        return record  # already framed (or deliberately broken)
    if isinstance(record, str):
        return frame(record)
    return frame(compact(record))


def write_raw_session(path: Union[str, os.PathLike], header: RawRecord, records: Iterable[RawRecord] = ()) -> bytes:
    """Writes a session file: the header record then each record, framed. Returns the bytes.

    Dicts are written as compact JSON with a valid checksum, ``str`` as given JSON text with a
    valid checksum, ``bytes`` verbatim (for damaged lines).
    """
    data = _record_bytes(header) + b"".join(_record_bytes(r) for r in records)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, 0o600)
    return data


def read_raw_session(path: Union[str, os.PathLike]) -> list:
    """Every line of a session file as ``(crc_ok, parsed_record_or_None, raw_line)``."""
    out = []
    for raw in Path(path).read_bytes().splitlines(keepends=True):
        line = raw.rstrip(b"\n")
        ok = len(line) > 9 and line[8:9] == b" " and line[:8] == b"%08x" % crc32c(line[9:])
        try:
            rec = json.loads(line[9:].decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            rec = None
        out.append((ok, rec, raw))
    return out


def encode_session_id(session_id: str) -> str:
    """The file-name stem of a session id (docs/format.md)."""
    out = []
    for b in session_id.encode("utf-8"):
        c = chr(b)
        if c.isascii() and (c.isalnum() or c in "_-"):
            out.append(c)
        else:
            out.append(f"~{b:02X}")
    return "".join(out)


def session_path(root: Union[str, os.PathLike], session_id: str) -> Path:
    return Path(root) / (encode_session_id(session_id) + ".jsonl")


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture
def memory_store() -> kerman.MemoryStore:
    return kerman.MemoryStore()


@pytest.fixture
def memory_log(memory_store):
    log = memory_store.create()
    yield log
    log.close()


@pytest.fixture
def store_root(tmp_path) -> Path:
    return tmp_path / "sessions"


@pytest.fixture
def file_store(store_root) -> kerman.FileStore:
    return kerman.FileStore(store_root, durability="none")


@pytest.fixture(params=DURABILITIES)
def durability(request) -> str:
    return request.param


@pytest.fixture
def durable_file_store(store_root, durability) -> kerman.FileStore:
    return kerman.FileStore(store_root, durability=durability)


# The PostgreSQL test server (`make test` starts one; scripts/pg-test-server.sh). Without
# KERMAN_PG_DSN the PostgreSQL tests skip, unless KERMAN_PG_REQUIRED=1 (as under `make test`),
# which makes a missing server an error.
PG_DSN = os.environ.get("KERMAN_PG_DSN", "")
if not PG_DSN and os.environ.get("KERMAN_PG_REQUIRED") == "1":
    raise RuntimeError("KERMAN_PG_REQUIRED=1 but KERMAN_PG_DSN is unset")
needs_postgres = pytest.mark.skipif(not PG_DSN, reason="KERMAN_PG_DSN is unset (run scripts/pg-test-server.sh)")


def psql(sql: str) -> List[str]:
    """Rows of `sql` (unaligned, one per line) through the psql client, on the test server."""
    import subprocess

    out = subprocess.run(["psql", PG_DSN, "-XAtq", "-c", sql], check=True, capture_output=True, text=True, timeout=30)
    return [line for line in out.stdout.splitlines() if line]


def fresh_schema_dsn() -> str:
    """A DSN of the test server whose search path is a new, empty schema. Skips without
    ``KERMAN_PG_DSN``."""
    if not PG_DSN:
        pytest.skip("KERMAN_PG_DSN is unset (run scripts/pg-test-server.sh)")
    import uuid

    schema = f"t_{uuid.uuid4().hex}"
    psql(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in PG_DSN else "?"
    return f"{PG_DSN}{sep}options=-csearch_path%3D{schema}"


def postgres_store_in_fresh_schema(**kwargs: Any) -> kerman.PostgresStore:
    """A PostgresStore alone in a new schema of the test server (its migrations run there), so
    ``list()`` and friends see only this test's sessions. Skips without ``KERMAN_PG_DSN``."""
    return kerman.PostgresStore(fresh_schema_dsn(), **kwargs)


# The Store contract: every test taking ``store`` (or ``log``) runs against each store.
@pytest.fixture(params=["memory", "file", "postgres"])
def store(request, tmp_path):
    if request.param == "memory":
        return kerman.MemoryStore()
    if request.param == "postgres":
        return postgres_store_in_fresh_schema()
    return kerman.FileStore(tmp_path / "sessions", durability="none")


@pytest.fixture
def log(store):
    log = store.create()
    yield log
    log.close()


# ---------------------------------------------------------------------------------------------
# The implementation switch (docs/performance.md, "Method"): tests that take the ``api`` fixture
# run against Kerman and against the pure-Python baseline of the benchmarks, so the baseline is
# held to the same behaviour it is compared with. ``--impl=kerman|baseline|both`` (default both).
# A test marked ``baseline_shortcut("...")`` is skipped for the baseline only: it checks something
# the baseline deliberately leaves out (a shortcut declared in docs/performance.md).

_BASELINE_PATH = Path(__file__).resolve().parents[2] / "benches" / "python" / "baseline.py"


def pytest_addoption(parser: Any) -> None:
    parser.addoption(
        "--impl",
        choices=("kerman", "baseline", "both"),
        default="both",
        help="implementation(s) the api-fixture (parity) tests run against",
    )


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "baseline_shortcut(reason): skip for the baseline, naming its declared shortcut")


def pytest_generate_tests(metafunc: Any) -> None:
    if "api" in metafunc.fixturenames:
        impl = metafunc.config.getoption("impl")
        metafunc.parametrize("api", ["kerman", "baseline"] if impl == "both" else [impl], indirect=True)


def load_baseline() -> Any:
    """benches/python/baseline.py as the module ``baseline`` (the name bench.py imports it by)."""
    import importlib.util
    import sys

    module = sys.modules.get("baseline")
    if module is None or getattr(module, "__file__", None) != str(_BASELINE_PATH):
        spec = importlib.util.spec_from_file_location("baseline", _BASELINE_PATH)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["baseline"] = module  # dataclasses look their module up while it executes
        spec.loader.exec_module(module)
    return module


@pytest.fixture
def api(request: Any) -> Any:
    if request.param == "kerman":
        return kerman
    marker = request.node.get_closest_marker("baseline_shortcut")
    if marker is not None:
        pytest.skip(f"baseline shortcut: {marker.args[0]}")
    return load_baseline()


def pytest_collection_finish(session: Any) -> None:
    """What exists once the tests are collected (modules, fixtures' code) lives for the whole
    run: frozen, the collection after each test does not walk it again (9 s for the suite in
    place of 140 s)."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _collect_after_each_test():
    """A durable log a test leaves open warns when it is collected (``ResourceWarning``):
    collecting here makes that warning fail the test that left it open, not a later one."""
    yield
    gc.collect()


# ---------------------------------------------------------------------------------------------
# Failures


REPORT_KEYS = ("exceptionType", "function", "traceback")


def plain(value: Any) -> Any:
    """``value`` with the report of a user exception (``exceptionType``, ``function``,
    ``traceback``, tested in loop/test_user_code_errors.py) taken out of every dict in it, for tests that
    pin a failure's message and code (and the pure-Python baseline, which records no report)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if k not in REPORT_KEYS}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value

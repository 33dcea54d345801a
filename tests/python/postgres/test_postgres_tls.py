"""PostgresStore over TLS (issue 17, part 2): the DSN's sslmode, sslrootcert, sslcert and sslkey
honoured as libpq does, against the test server's own TLS setup (scripts/pg-test-server.sh:
a self-signed CA, a server certificate for localhost and 127.0.0.1, a client certificate for
the role kerman_tls_cert, a CA that signed nothing, and the role kerman_tls_only that pg_hba
admits over TLS only). The files are found through the server (`SHOW ssl_ca_file`).

Whether a connection is encrypted is read from the server (`pg_stat_ssl`), never assumed.
A wrong host name is made with `host=<a name the certificate does not hold>` and
`hostaddr=127.0.0.1` (the TCP address), as libpq users do. Every DSN that fails carries a
password, which no error may show."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Tuple
from urllib.parse import quote, urlsplit

import pytest

from conftest import PG_DSN, needs_postgres, psql
from kerman import LogError, PostgresStore

pytestmark = needs_postgres

DEADLINE = 30.0
SECRET = "hunter2secret"
WRONG_NAME = "kerman-wrong-name.invalid"


@pytest.fixture(scope="module")
def tls_dir() -> Path:
    """The folder of the server's TLS files; skips (fails under KERMAN_PG_REQUIRED=1) without."""
    if psql("SHOW ssl") != ["on"]:
        why = "the test server does not serve TLS: run scripts/pg-test-server.sh (it turns TLS on by a reload)"
        if os.environ.get("KERMAN_PG_REQUIRED") == "1":
            pytest.fail(why)
        pytest.skip(why)
    folder = Path(psql("SHOW ssl_ca_file")[0]).parent
    for name in ("ca.crt", "wrong-ca.crt", "client.crt", "client.key"):
        assert (folder / name).is_file(), f"{folder / name} is missing: the server's TLS setup is not the test script's"
    return folder


def server_port() -> int:
    port = urlsplit(PG_DSN).port
    assert port is not None, PG_DSN
    return port


def database() -> str:
    """The database the DSN names: the schemas are made there, so the stores connect to it."""
    return urlsplit(PG_DSN).path.lstrip("/") or "postgres"


def schema_for(role: str) -> str:
    """A new, empty schema the role owns (each store migrates in its own)."""
    schema = f"t_{uuid.uuid4().hex}"
    psql(f"CREATE SCHEMA {schema} AUTHORIZATION {role}")
    return schema


def url_dsn(user: str = "postgres", host: str = "127.0.0.1", **params: str) -> str:
    """The URL form, with a password (trust auth ignores it; errors must not show it)."""
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
    return f"postgresql://{user}:{SECRET}@{host}:{server_port()}/{database()}" + (f"?{query}" if query else "")


def kv_dsn(user: str = "postgres", host: str = "127.0.0.1", **params: str) -> str:
    """The key=value form of the same settings (values quoted, as a path with a space needs)."""
    items = {"host": host, "port": str(server_port()), "user": user, "dbname": database(), "password": SECRET, **params}
    return " ".join(f"{k}='{v}'" for k, v in items.items())


FORMS: Dict[str, Callable[..., str]] = {"url": url_dsn, "key-value": kv_dsn}


def tls_of(application_name: str) -> List[str]:
    """`ssl|version` of each backend with this application name."""
    return psql(
        "SELECT CASE WHEN s.ssl THEN 't' ELSE 'f' END || '|' || coalesce(s.version, '') "
        "FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
        f"WHERE a.application_name = '{application_name}'"
    )


def open_store(form: Callable[..., str], user: str = "postgres", **params: str) -> Tuple[PostgresStore, str]:
    """A store in a fresh schema, named so its backend can be found; returns it and its name."""
    name = f"tls_{uuid.uuid4().hex[:12]}"
    params = {"application_name": name, "options": f"-csearch_path={schema_for(user)}", **params}
    return PostgresStore(form(user=user, **params)), name


def refused(dsn: str) -> str:
    """The text of the LogError `PostgresStore(dsn)` raises; never shows the password."""
    with pytest.raises(LogError) as caught:
        PostgresStore(dsn, reconnect_timeout=0)
    text = str(caught.value)
    assert SECRET not in text, text
    return text


def flush(log) -> None:
    async def go() -> None:
        await log.flush()

    asyncio.run(asyncio.wait_for(go(), DEADLINE))


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# ---- verified connections ----------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
def test_verify_full_works_and_every_connection_of_the_store_is_encrypted(tls_dir, form):
    # kerman_tls_only is refused without TLS (pg_hba), so the LISTEN connection that feeds the
    # follower works only if it is encrypted too.
    common = {"sslmode": "verify-full", "sslrootcert": str(tls_dir / "ca.crt"), "hostaddr": "127.0.0.1"}
    store, name = open_store(form, user="kerman_tls_only", host="localhost", **common)
    log = store.create()
    log.append("x", 1)
    flush(log)
    [state] = tls_of(name)
    assert state.startswith("t|TLS"), state
    follower = store.follow(log.id)
    log.append("x", 2)
    flush(log)
    wait_until(lambda: len(follower) == 2, "the follower to see the second event (LISTEN over TLS)")
    assert [e.data for e in follower] == [1, 2]
    listen = psql(
        "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
        f"WHERE a.usename = 'kerman_tls_only' AND a.application_name = 'kerman-listen-{os.getpid()}'"
    )
    assert listen == ["t"]
    follower.close()
    log.close()
    with store.open(log.id) as again:
        assert [e.data for e in again] == [1, 2]


def test_verify_full_checks_an_ip_address_host_against_the_certificate(tls_dir):
    # The server certificate holds IP:127.0.0.1 too: connecting by address verifies.
    store, name = open_store(url_dsn, sslmode="verify-full", sslrootcert=str(tls_dir / "ca.crt"))
    assert store.list() == []
    assert tls_of(name)[0].startswith("t|")


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
def test_verify_ca_accepts_a_certificate_for_another_name_and_verify_full_refuses_it(tls_dir, form):
    roots = str(tls_dir / "ca.crt")
    store, name = open_store(form, host=WRONG_NAME, hostaddr="127.0.0.1", sslmode="verify-ca", sslrootcert=roots)
    assert store.list() == []
    assert tls_of(name)[0].startswith("t|")
    text = refused(form(host=WRONG_NAME, hostaddr="127.0.0.1", sslmode="verify-full", sslrootcert=roots))
    assert f'certificate not valid for name "{WRONG_NAME}"' in text, text
    assert "localhost" in text and "sslmode=verify-ca" in text, text


@pytest.mark.parametrize("mode", ["verify-full", "verify-ca", "require", "prefer"])
def test_a_certificate_from_another_ca_is_refused_naming_the_roots(tls_dir, mode):
    # require and prefer verify the chain too once sslrootcert names a file (libpq's rule).
    wrong = str(tls_dir / "wrong-ca.crt")
    text = refused(url_dsn(host="localhost", hostaddr="127.0.0.1", sslmode=mode, sslrootcert=wrong))
    assert text.startswith(f"connect to localhost:{server_port()}: "), text
    assert "invalid peer certificate" in text and "not signed by a CA from sslrootcert" in text and wrong in text, text


def test_the_system_roots_do_not_trust_the_test_ca(tls_dir):
    text = refused(url_dsn(host="localhost", hostaddr="127.0.0.1", sslrootcert="system"))
    # sslrootcert=system defaults to verify-full, as in libpq.
    assert "system" in text and ("not signed by a CA" in text or "no trusted root certificates" in text), text
    assert "may not be used with sslrootcert=system" in refused(url_dsn(sslmode="require", sslrootcert="system"))


# ---- unverified and plain connections ----------------------------------------------------------


def test_require_without_roots_encrypts_without_verifying(tls_dir):
    # The host name matches nothing and no CA is given: require only encrypts.
    store, name = open_store(url_dsn, host=WRONG_NAME, hostaddr="127.0.0.1", sslmode="require")
    assert store.list() == []
    assert tls_of(name)[0].startswith("t|")


def test_prefer_is_the_default_and_uses_tls_when_the_server_offers_it(tls_dir):
    store, name = open_store(url_dsn)
    assert store.list() == []
    assert tls_of(name)[0].startswith("t|")
    plain, plain_name = open_store(url_dsn, sslmode="disable")
    assert plain.list() == []
    assert tls_of(plain_name) == ["f|"]


def test_disable_against_a_tls_only_role_is_refused_and_allow_retries_with_tls(tls_dir):
    text = refused(kv_dsn(user="kerman_tls_only", sslmode="disable"))
    assert 'pg_hba.conf rejects connection for host "127.0.0.1", user "kerman_tls_only"' in text, text
    assert "no encryption" in text, text
    # allow: plain first, then (refused) TLS, as libpq.
    store, name = open_store(kv_dsn, user="kerman_tls_only", sslmode="allow")
    assert store.list() == []
    assert tls_of(name)[0].startswith("t|")


def test_require_against_a_server_without_tls_is_refused():
    # A server that answers the TLS request with "N" (no TLS), as one with ssl=off does.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(8)  # the SSLRequest
                conn.sendall(b"N")

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        with pytest.raises(LogError) as caught:
            PostgresStore(f"host=127.0.0.1 port={port} password={SECRET} sslmode=require", reconnect_timeout=0)
        thread.join(DEADLINE)
    text = str(caught.value)
    assert "server does not support TLS" in text and SECRET not in text, text


# ---- client certificates -----------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
def test_a_client_certificate_authenticates_its_role(tls_dir, form):
    certs = {"sslcert": str(tls_dir / "client.crt"), "sslkey": str(tls_dir / "client.key")}
    store, name = open_store(form, user="kerman_tls_cert", sslmode="verify-full", sslrootcert=str(tls_dir / "ca.crt"), **certs)
    with store.create() as log:
        log.append("x", "by certificate")
    assert psql(f"SELECT usename FROM pg_stat_activity WHERE application_name = '{name}'") == ["kerman_tls_cert"]
    # Without the certificate the same role is refused, by the server, clearly.
    text = refused(form(user="kerman_tls_cert", sslmode="require"))
    assert "connection requires a valid client certificate" in text, text


def test_missing_or_unusable_certificate_files_are_named(tls_dir, tmp_path):
    missing = tmp_path / "no such dir" / "client.key"
    text = refused(url_dsn(sslcert=str(tls_dir / "client.crt"), sslkey=str(missing)))
    assert text.startswith("set up TLS: cannot read sslkey file") and str(missing) in text, text
    assert "No such file" in text, text
    text = refused(kv_dsn(sslmode="verify-ca", sslrootcert=str(tmp_path / "ca.crt")))
    assert f'cannot read sslrootcert file "{tmp_path / "ca.crt"}"' in text, text
    not_a_key = tmp_path / "key.pem"
    not_a_key.write_text("-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n")
    text = refused(url_dsn(sslcert=str(tls_dir / "client.crt"), sslkey=str(not_a_key)))
    assert f'sslkey file "{not_a_key}" holds no PEM private key (an encrypted key is not supported)' in text, text
    wrong_key = tls_dir / "wrong-ca.key"
    if os.access(wrong_key, os.R_OK):
        text = refused(url_dsn(sslcert=str(tls_dir / "client.crt"), sslkey=str(wrong_key)))
        assert "sslcert and sslkey do not make a usable pair" in text, text


@pytest.mark.parametrize(
    "params,expected",
    [
        ({"sslmode": "verify-full"}, "sslmode=verify-full needs sslrootcert"),
        ({"sslmode": "verify-ca"}, "sslmode=verify-ca needs sslrootcert"),
        ({"sslmode": "sometimes"}, "invalid value for option `sslmode`"),
        ({"sslcert": "/c.crt"}, "sslcert needs sslkey"),
        ({"sslpassword": SECRET}, "sslpassword (an encrypted sslkey) is not supported"),
    ],
    ids=["verify-full-no-roots", "verify-ca-no-roots", "bad-mode", "cert-no-key", "sslpassword"],
)
def test_inconsistent_tls_settings_are_refused_before_connecting(params, expected):
    for form in FORMS.values():
        text = refused(form(**params))
        assert text.startswith("parse the DSN: invalid connection string: ") and expected in text, text

//! How the store reaches the server: the DSN's TLS settings, honoured as libpq does, and the
//! one [`Target::connect`] every connection of the store goes through (the I/O connection, its
//! reconnects, the LISTEN connection).
//!
//! tokio-postgres parses `sslmode=disable|prefer|require` only and knows no certificate
//! settings, so the DSN is pre-parsed here: `sslmode`, `sslrootcert`, `sslcert`, `sslkey` and
//! `sslpassword` are taken out of it (URL query or key=value form, as its own parser would
//! read them) and mapped onto a rustls `ClientConfig`; the rest goes to tokio-postgres
//! unchanged, so its errors about the other options stay as they were.
//!
//! | sslmode | TLS | chain checked | host name checked |
//! |---|---|---|---|
//! | `disable` | never | | |
//! | `allow` | only if the plain attempt is refused by the server | as `require` | |
//! | `prefer` (default) | if the server offers it, else plain | as `require` | |
//! | `require` | always | only against an `sslrootcert` given (libpq's quirk) | no |
//! | `verify-ca` | always | against `sslrootcert` | no |
//! | `verify-full` | always | against `sslrootcert` | yes |
//!
//! Only what the DSN says counts: like the rest of the store's settings (host, user, ...), no
//! `PG*` environment variable and no `~/.postgresql/` default file is read.

use std::fmt;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::SslMode as DriverMode;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::with_causes;
use crate::event_log::LogError;

/// The connection type of every store connection (TLS or not: one type, so one code path).
pub type Connection = tokio_postgres::Connection<Socket, <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream>;

/// libpq's `sslmode` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Option<SslMode> {
        Some(match value {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres is told (`allow` starts plain; see [`Target::connect`]).
    fn driver(self) -> DriverMode {
        match self {
            SslMode::Disable | SslMode::Allow => DriverMode::Disable,
            SslMode::Prefer => DriverMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => DriverMode::Require,
        }
    }
}

/// Where `sslrootcert` points.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Roots {
    File(String),
    /// `sslrootcert=system`: the operating system's trusted roots.
    System,
}

/// The TLS settings taken out of a DSN (values as written, decoded).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SslParams {
    pub mode: Option<String>,
    pub rootcert: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
    /// Whether `sslpassword` was given (its value is never kept).
    pub password: bool,
}

impl SslParams {
    /// Takes `key = value` if it is one of the TLS settings handled here.
    fn take(&mut self, key: &str, value: String) -> bool {
        match key {
            "sslmode" => self.mode = Some(value),
            "sslrootcert" => self.rootcert = Some(value),
            "sslcert" => self.cert = Some(value),
            "sslkey" => self.key = Some(value),
            "sslpassword" => self.password = true,
            _ => return false,
        }
        true
    }
}

/// A DSN ready to connect with: the driver's settings and the TLS connector made from it.
#[derive(Clone)]
pub struct Target {
    pub config: Config,
    mode: SslMode,
    /// For errors: where the roots came from (`None`: nothing is verified).
    roots: Option<Roots>,
    connector: MakeRustlsConnect,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the config: its Debug would show the password.
        f.debug_struct("Target").field("mode", &self.mode).field("roots", &self.roots).finish_non_exhaustive()
    }
}

impl Target {
    /// Parses `dsn` and reads the certificate files it names (once, so a missing file fails
    /// the store's construction, not a reconnect hours later). Errors never quote the DSN
    /// beyond option names and file paths, so no password shows.
    pub fn from_dsn(dsn: &str) -> Result<Target, LogError> {
        let parse_err = |detail: String| LogError::Database { context: "parse the DSN".into(), detail };
        let (rest, params) = split_dsn(dsn).map_err(parse_err)?;
        let mut config: Config = rest.parse().map_err(|e: tokio_postgres::Error| parse_err(with_causes(&e)))?;
        let (mode, roots) = settle(&params).map_err(parse_err)?;
        config.ssl_mode(mode.driver());
        let tls =
            client_config(mode, roots.as_ref(), &params).map_err(|detail| LogError::Database { context: "set up TLS".into(), detail })?;
        Ok(Target { config, mode, roots, connector: MakeRustlsConnect::new(tls) })
    }

    pub fn mode(&self) -> SslMode {
        self.mode
    }

    /// Connects as the DSN says. `allow` tries without TLS first and, if the server refuses
    /// that (as a `hostssl`-only `pg_hba` rule does), once more with TLS, as libpq does.
    pub async fn connect(&self) -> Result<(Client, Connection), String> {
        let first = self.config.connect(self.connector.clone()).await;
        let first = match first {
            Err(e) if self.mode == SslMode::Allow && e.as_db_error().is_some() => {
                let mut config = self.config.clone();
                config.ssl_mode(DriverMode::Require);
                config.connect(self.connector.clone()).await
            }
            other => other,
        };
        first.map_err(|e| self.describe(&e))
    }

    /// The driver's error with its causes (the server's message and SQLSTATE when it sent
    /// one), and for a refused certificate what to check.
    pub fn describe(&self, e: &tokio_postgres::Error) -> String {
        if let Some(db) = e.as_db_error() {
            return format!("{} ({})", db.message(), db.code().code());
        }
        let mut text = with_causes(e);
        if let Some(hint) = self.hint(e) {
            text.push_str(" (");
            text.push_str(&hint);
            text.push(')');
        }
        text
    }

    fn hint(&self, e: &tokio_postgres::Error) -> Option<String> {
        let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
        while let Some(cause) = source {
            let tls = cause.downcast_ref::<rustls::Error>().or_else(|| {
                let io = cause.downcast_ref::<std::io::Error>()?;
                io.get_ref()?.downcast_ref::<rustls::Error>()
            });
            if let Some(rustls::Error::InvalidCertificate(why)) = tls {
                return Some(self.certificate_hint(why));
            }
            source = cause.source();
        }
        None
    }

    fn certificate_hint(&self, why: &CertificateError) -> String {
        let from = match &self.roots {
            Some(Roots::File(path)) => format!("sslrootcert {path:?}"),
            Some(Roots::System) => "the system's trusted roots (sslrootcert=system)".into(),
            None => "no roots".into(),
        };
        match why {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                format!("the server's certificate is not signed by a CA from {from}")
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => format!(
                "sslmode={}: the server's certificate does not name the host connected to; connect by a name it holds \
                 (sslmode=verify-ca would check the chain only)",
                self.mode.name()
            ),
            _ => format!("sslmode={}, roots from {from}", self.mode.name()),
        }
    }
}

/// The mode and the roots, checked against each other as libpq checks them.
fn settle(params: &SslParams) -> Result<(SslMode, Option<Roots>), String> {
    let roots = params.rootcert.as_deref().map(|r| match r {
        "system" => Roots::System,
        path => Roots::File(path.to_string()),
    });
    let mode = match params.mode.as_deref() {
        None if roots == Some(Roots::System) => SslMode::VerifyFull,
        None => SslMode::Prefer,
        Some(value) => SslMode::parse(value).ok_or_else(|| {
            "invalid connection string: invalid value for option `sslmode` \
             (one of disable, allow, prefer, require, verify-ca, verify-full)"
                .to_string()
        })?,
    };
    if roots == Some(Roots::System) && mode != SslMode::VerifyFull {
        // As libpq: any other mode would trust every publicly issued certificate for any name.
        return Err(format!(
            "invalid connection string: sslmode={} may not be used with sslrootcert=system (use sslmode=verify-full)",
            mode.name()
        ));
    }
    if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && roots.is_none() {
        return Err(format!(
            "invalid connection string: sslmode={} needs sslrootcert (a PEM file of the CA certificates to trust, \
             or `system` for the operating system's roots)",
            mode.name()
        ));
    }
    if params.password {
        return Err("invalid connection string: sslpassword (an encrypted sslkey) is not supported; \
                    decrypt the key, e.g. `openssl pkey -in key.pem -out plain.pem`"
            .into());
    }
    match (&params.cert, &params.key) {
        (Some(_), None) => return Err("invalid connection string: sslcert needs sslkey (the client certificate's private key)".into()),
        (None, Some(_)) => return Err("invalid connection string: sslkey needs sslcert (the client certificate)".into()),
        _ => {}
    }
    Ok((mode, roots))
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls configuration for `mode`: which verifier, which roots, which client certificate.
fn client_config(mode: SslMode, roots: Option<&Roots>, params: &SslParams) -> Result<ClientConfig, String> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions().map_err(|e| e.to_string())?;
    let verifier: Arc<dyn ServerCertVerifier> = match roots {
        None => Arc::new(NoVerification { provider }),
        Some(roots) => {
            let store = Arc::new(load_roots(roots)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(store, provider).build().map_err(|e| e.to_string())?;
            match mode {
                SslMode::VerifyFull => webpki,
                _ => Arc::new(ChainOnly { inner: webpki }),
            }
        }
    };
    let builder = builder.dangerous().with_custom_certificate_verifier(verifier);
    let mut config = match (&params.cert, &params.key) {
        (Some(cert), Some(key)) => {
            let chain = load_certs("sslcert", cert)?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| pem_error("sslkey", key, "private key", e))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| format!("sslcert and sslkey do not make a usable pair: {e}"))?
        }
        _ => builder.with_no_client_auth(),
    };
    // PostgreSQL 17 checks the ALPN protocol when a client sends one (and requires it for
    // sslnegotiation=direct); older servers ignore it.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(config)
}

fn load_roots(roots: &Roots) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::File(path) => {
            for cert in load_certs("sslrootcert", path)? {
                store.add(cert).map_err(|e| format!("sslrootcert {path:?}: a certificate cannot be used as a root: {e}"))?;
            }
        }
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                let why: Vec<String> = found.errors.iter().map(std::string::ToString::to_string).collect();
                return Err(format!("sslrootcert=system: no trusted root certificates found on this system ({})", why.join("; ")));
            }
        }
    }
    Ok(store)
}

/// Every certificate of a PEM file; at least one.
fn load_certs(option: &str, path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(option, path, "certificate", e))?
        .collect::<Result<_, _>>()
        .map_err(|e| pem_error(option, path, "certificate", e))?;
    if certs.is_empty() {
        return Err(pem_error(option, path, "certificate", rustls::pki_types::pem::Error::NoItemsFound));
    }
    Ok(certs)
}

fn pem_error(option: &str, path: &str, what: &str, e: rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error;
    match e {
        Error::Io(io) => format!("cannot read {option} file {path:?}: {io}"),
        Error::NoItemsFound => {
            let hint = if what == "private key" { " (an encrypted key is not supported)" } else { "" };
            format!("{option} file {path:?} holds no PEM {what}{hint}")
        }
        other => format!("{option} file {path:?} is not valid PEM: {other}"),
    }
}

/// `require`/`prefer`/`allow` without roots: encryption only, as libpq (the handshake's
/// signatures are still checked against the certificate the server sent).
#[derive(Debug)]
struct NoVerification {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca` (and `require`/`prefer` with roots): the chain must lead to a trusted root,
/// the name is not checked. The webpki verifier checks the chain (and validity dates) before
/// the name, so a name error means everything else held.
#[derive(Debug)]
struct ChainOnly {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. })) => {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Takes the TLS settings out of `dsn`: the DSN without them (for tokio-postgres) and their
/// values. Both forms are read the way tokio-postgres reads them, so what is left parses as
/// it would have.
pub fn split_dsn(dsn: &str) -> Result<(String, SslParams), String> {
    let mut params = SslParams::default();
    let rest = match url_body(dsn) {
        Some(body) => split_url(dsn, body, &mut params)?,
        None => split_key_values(dsn, &mut params)?,
    };
    Ok((rest, params))
}

/// The URL form's part after the scheme, or `None` for the key=value form.
fn url_body(dsn: &str) -> Option<&str> {
    ["postgres://", "postgresql://"].iter().find_map(|p| dsn.strip_prefix(p))
}

/// `scheme://[credentials@]hosts[/db][?query]`: the query starts at the first `?` after the
/// credentials (which end at the first `@`), as in tokio-postgres's parser.
fn split_url(dsn: &str, body: &str, params: &mut SslParams) -> Result<String, String> {
    let scheme = &dsn[..dsn.len() - body.len()];
    let after_credentials = body.find('@').map_or(0, |at| at + 1);
    let Some(q) = body[after_credentials..].find('?').map(|i| after_credentials + i) else {
        return Ok(dsn.to_string());
    };
    let mut kept: Vec<&str> = Vec::new();
    for segment in body[q + 1..].split('&') {
        let taken = match segment.split_once('=') {
            Some((key, value)) => {
                let key = decode(key).ok_or("invalid connection string: a query option name is not valid UTF-8")?;
                let value =
                    decode(value).ok_or_else(|| format!("invalid connection string: the value of option `{key}` is not valid UTF-8"))?;
                params.take(&key, value)
            }
            None => false,
        };
        if !taken {
            kept.push(segment);
        }
    }
    let mut out = format!("{scheme}{}", &body[..q]);
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    Ok(out)
}

fn decode(s: &str) -> Option<String> {
    percent_encoding::percent_decode_str(s).decode_utf8().ok().map(std::borrow::Cow::into_owned)
}

/// `key = value ...`, values bare (backslash escapes) or single-quoted.
fn split_key_values(dsn: &str, params: &mut SslParams) -> Result<String, String> {
    let mut kept = String::new();
    let mut chars = dsn.char_indices().peekable();
    loop {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(start, _)) = chars.peek() else { break };
        while chars.next_if(|&(_, c)| !c.is_whitespace() && c != '=').is_some() {}
        let key_end = chars.peek().map_or(dsn.len(), |&(i, _)| i);
        let key = &dsn[start..key_end];
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        if chars.next_if(|&(_, c)| c == '=').is_none() {
            // Malformed: leave the rest to tokio-postgres, whose error says where.
            kept.push_str(&dsn[start..]);
            break;
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if(|&(_, c)| c == '\'').is_some() {
            loop {
                match chars.next() {
                    Some((_, '\'')) => break,
                    Some((_, '\\')) => value.extend(chars.next().map(|(_, c)| c)),
                    Some((_, c)) => value.push(c),
                    None => return Err("invalid connection string: unterminated quoted connection parameter value".into()),
                }
            }
        } else {
            while let Some((_, c)) = chars.next_if(|(_, c)| !c.is_whitespace()) {
                match c {
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    c => value.push(c),
                }
            }
        }
        let end = chars.peek().map_or(dsn.len(), |&(i, _)| i);
        if !params.take(key, value) {
            kept.push_str(&dsn[start..end]);
            kept.push(' ');
        }
    }
    Ok(kept.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(dsn: &str) -> (String, SslParams) {
        split_dsn(dsn).unwrap()
    }

    #[test]
    fn the_url_form_loses_its_tls_options_and_keeps_the_rest() {
        let (rest, p) = split("postgresql://u:p%3Fw@h:5/db?sslmode=verify-full&application_name=a&sslrootcert=%2Ftmp%2Fca%20x.crt");
        assert_eq!(rest, "postgresql://u:p%3Fw@h:5/db?application_name=a");
        assert_eq!(p.mode.as_deref(), Some("verify-full"));
        assert_eq!(p.rootcert.as_deref(), Some("/tmp/ca x.crt"));
        let (rest, p) = split("postgres://h/db?sslcert=/c&sslkey=/k");
        assert_eq!((rest.as_str(), p.cert.as_deref(), p.key.as_deref()), ("postgres://h/db", Some("/c"), Some("/k")));
        // A `?` inside the credentials is not the query.
        let (rest, p) = split("postgresql://u:a?b@h/db");
        assert_eq!((rest.as_str(), p), ("postgresql://u:a?b@h/db", SslParams::default()));
    }

    #[test]
    fn the_key_value_form_loses_its_tls_options_and_keeps_the_rest() {
        let (rest, p) = split("host=h  sslmode = verify-ca password='a b\\'c' sslrootcert='/x y/ca.crt' port=5");
        assert_eq!(rest, "host=h password='a b\\'c' port=5");
        assert_eq!(p.mode.as_deref(), Some("verify-ca"));
        assert_eq!(p.rootcert.as_deref(), Some("/x y/ca.crt"));
        let (rest, p) = split("sslkey=/a\\ b sslcert=/c sslpassword=secret");
        assert_eq!((rest.as_str(), p.key.as_deref(), p.cert.as_deref(), p.password), ("", Some("/a b"), Some("/c"), true));
        assert!(split_dsn("host=h sslrootcert='/x").unwrap_err().contains("unterminated"));
    }

    fn target_err(dsn: &str) -> String {
        Target::from_dsn(dsn).unwrap_err().to_string()
    }

    #[test]
    fn modes_and_roots_are_checked_as_libpq_checks_them() {
        assert_eq!(Target::from_dsn("host=h").unwrap().mode(), SslMode::Prefer);
        assert_eq!(Target::from_dsn("host=h sslmode=allow").unwrap().mode(), SslMode::Allow);
        assert!(target_err("host=h sslmode=sometimes password=hunter2").contains("invalid value for option `sslmode`"));
        assert!(target_err("host=h sslmode=verify-full").contains("sslmode=verify-full needs sslrootcert"));
        assert!(target_err("host=h sslmode=require sslrootcert=system").contains("may not be used with sslrootcert=system"));
        assert!(target_err("host=h sslcert=/c").contains("sslcert needs sslkey"));
        let e = target_err("host=h sslpassword=hunter2");
        assert!(e.contains("sslpassword") && !e.contains("hunter2"), "{e}");
    }

    #[test]
    fn unreadable_certificate_files_are_named() {
        let e = target_err("host=h sslmode=verify-ca sslrootcert=/nonexistent/ca.crt");
        assert!(e.starts_with("set up TLS: cannot read sslrootcert file \"/nonexistent/ca.crt\""), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not pem\n").unwrap();
        let e = target_err(&format!("host=h sslmode=verify-ca sslrootcert={}", empty.display()));
        assert!(e.contains("holds no PEM certificate"), "{e}");
    }

    #[test]
    fn the_config_debug_never_shows_the_password() {
        let t = Target::from_dsn("host=h password=hunter2").unwrap();
        assert!(!format!("{t:?}").contains("hunter2"));
    }
}

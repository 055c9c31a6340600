//! TLS as `sslmode` and `sslrootcert` ask for it: the CA certificates, the client
//! configuration, and the lenient verifier of prefer, require and verify-ca.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

use crate::error::Error;
use crate::pg::params::{ConnectParams, Ssl};

impl ConnectParams {
    /// The TLS connector `sslmode` asks for (`None`: plain TCP).
    pub(super) fn tls(&self) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>, Error> {
        if self.ssl == Ssl::Disable {
            return Ok(None);
        }
        crate::sys::crypto_ready();
        let roots = match self.ssl {
            Ssl::VerifyCa | Ssl::VerifyFull => self.read_root_certs()?,
            _ => Vec::new(),
        };
        let tls = tls_config(roots, self.ssl == Ssl::VerifyFull).map_err(|err| {
            Error::usage(
                format!(
                    "cannot use the CA certificate `{}`: {err}",
                    self.root_cert.as_deref().unwrap_or(Path::new("")).display()
                ),
                "point sslrootcert (or PGSSLROOTCERT) at the CA certificate that signed the server's",
            )
            .with_source(err)
        })?;
        Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(tls)))
    }

    /// Every certificate in the `sslrootcert` file (a bundle may hold several, as with libpq).
    fn read_root_certs(&self) -> Result<Vec<CertificateDer<'static>>, Error> {
        let path = self.root_cert.as_deref().unwrap_or(Path::new(""));
        let pem = std::fs::read(path).map_err(|err| {
            Error::usage(
                format!("cannot read the CA certificate `{}`: {err}", path.display()),
                "point sslrootcert (or PGSSLROOTCERT) at a readable PEM file",
            )
            .with_source(err)
        })?;
        let not_pem = |detail: &dyn std::fmt::Display| {
            Error::usage(
                format!("`{}` is not a PEM certificate: {detail}", path.display()),
                "point sslrootcert at the CA certificate that signed the server's",
            )
        };
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| not_pem(&err).with_source(err))?;
        if certs.is_empty() {
            return Err(not_pem(&"it holds no certificate"));
        }
        Ok(certs)
    }
}

/// A TLS configuration that, as libpq, trusts only `roots` (and verifies nothing without
/// them: `sslmode=prefer|require` encrypt without authenticating the server). With roots,
/// `verify_host` (verify-full) also checks that the certificate names the host; verify-ca
/// checks the chain only.
pub(super) fn tls_config(
    roots: Vec<CertificateDer<'static>>,
    verify_host: bool,
) -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let algorithms = provider.signature_verification_algorithms;
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let chain = if roots.is_empty() {
        None
    } else {
        let mut store = rustls::RootCertStore::empty();
        for root in roots {
            store.add(root)?;
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider)
            .build()
            .map_err(|err| rustls::Error::General(err.to_string()))?;
        if verify_host {
            return Ok(builder.with_webpki_verifier(webpki).with_no_client_auth());
        }
        Some(webpki)
    };
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Lenient { chain, algorithms }))
        .with_no_client_auth())
}

/// The server check of `sslmode=prefer|require` (no chain: any certificate) and of
/// `verify-ca` (the chain must lead to a trusted root; the names are not checked). The
/// handshake signatures are checked either way.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // The chain is checked before the names: a name error means the chain is good.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PostgreSQL's TLS (rustls with AWS-LC, which AWS-LC's constructor no longer prepares:
    /// `.cargo/config.toml`) has AWS-LC learn the CPU first.
    #[test]
    fn tls_readies_aws_lc_first() {
        let params =
            ConnectParams::resolve("postgres://u@127.0.0.1:1/db?sslmode=require", "test").unwrap();
        assert!(params.tls().unwrap().is_some());
        assert!(crate::sys::aws_lc_knows_the_cpu());
    }
}

//! A throwaway certificate authority and a server certificate for
//! `localhost` and `127.0.0.1`, made with `rcgen` when a TLS server starts.

use std::io;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{RootCertStore, ServerConfig};

/// The generated certificates and the server's TLS configuration.
#[derive(Debug)]
pub(crate) struct TlsMaterial {
    pub(crate) ca_der: CertificateDer<'static>,
    pub(crate) ca_pem: String,
    pub(crate) server_config: Arc<ServerConfig>,
}

fn other(e: impl std::error::Error + Send + Sync + 'static) -> io::Error {
    io::Error::other(e)
}

impl TlsMaterial {
    /// A fresh CA, a leaf for `localhost` and `127.0.0.1` signed by it, and
    /// a server configuration offering `h2` and `http/1.1` by ALPN.
    pub(crate) fn generate() -> io::Result<Self> {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(other)?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "rebound-test fault server CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().map_err(other)?;
        let ca = ca_params.self_signed(&ca_key).map_err(other)?;

        let mut leaf_params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .map_err(other)?;
        leaf_params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let leaf_key = KeyPair::generate().map_err(other)?;
        let leaf = leaf_params
            .signed_by(&leaf_key, &ca, &ca_key)
            .map_err(other)?;

        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(other)?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), ca.der().clone()], key)
            .map_err(other)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];

        Ok(TlsMaterial {
            ca_der: ca.der().clone(),
            ca_pem: ca.pem(),
            server_config: Arc::new(config),
        })
    }

    pub(crate) fn root_store(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        // The certificate was generated a moment ago by rcgen: it parses.
        let _ = roots.add(self.ca_der.clone());
        roots
    }
}

//! A throw-away PKI for integration tests against servers that run with TLS: a CA, a server
//! certificate for `localhost` and 127.0.0.1, a client certificate, and a second, unrelated CA
//! (to check that a server signed by another CA is refused). Generated at run time into a
//! directory of the test's own: no key is ever committed.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

/// The PEM files of one test PKI.
#[derive(Debug, Clone)]
pub struct TestPki {
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// The server's certificate (names `localhost` and 127.0.0.1).
    pub server_cert: PathBuf,
    /// The server's key (PKCS#8).
    pub server_key: PathBuf,
    /// A client certificate with common name `tenure-client`.
    pub client_cert: PathBuf,
    /// The client certificate's key.
    pub client_key: PathBuf,
    /// Another CA, which signed nothing the servers present.
    pub other_ca: PathBuf,
}

struct Issuer {
    cert: rcgen::Certificate,
    signer: rcgen::Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Issuer {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let cert = params.self_signed(&key).expect("self-sign the CA");
    Issuer { cert, signer: rcgen::Issuer::new(params, key) }
}

fn leaf(issuer: &Issuer, common_name: &str, usage: Vec<ExtendedKeyUsagePurpose>) -> (String, String) {
    let key = KeyPair::generate().expect("leaf key");
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("leaf params");
    params.subject_alt_names.push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = usage;
    let cert = params.signed_by(&key, &issuer.signer).expect("sign the leaf");
    (cert.pem(), key.serialize_pem())
}

impl TestPki {
    /// Generates the PKI into `dir` (created if missing).
    pub fn generate(dir: &Path) -> TestPki {
        std::fs::create_dir_all(dir).expect("create the PKI directory");
        let write = |name: &str, pem: &str| {
            let path = dir.join(name);
            std::fs::write(&path, pem).expect("write a PEM file");
            path
        };
        let issuer = ca("Tenure test CA");
        let (server_cert, server_key) = leaf(
            &issuer,
            "localhost",
            // etcd's gateway dials its own server with the server certificate: it is a client too.
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
        );
        let (client_cert, client_key) = leaf(&issuer, "tenure-client", vec![ExtendedKeyUsagePurpose::ClientAuth]);
        let other = ca("Some other CA");
        TestPki {
            ca: write("ca.pem", &issuer.cert.pem()),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server-key.pem", &server_key),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client-key.pem", &client_key),
            other_ca: write("other-ca.pem", &other.cert.pem()),
        }
    }
}

/// The bytes of a PEM file written by [`TestPki::generate`].
pub fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).expect("read a PEM file")
}

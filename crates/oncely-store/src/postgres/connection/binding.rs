//! SCRAM's `tls-server-end-point` channel binding (RFC 5929, section 4.1): the hash of
//! the server's certificate, with the hash function of the certificate's own signature
//! (SHA-256 when that is MD5 or SHA-1). With it, a password over TLS authenticates the
//! TLS channel too: a party in the middle with a certificate of its own fails SCRAM, even
//! under `sslmode=require`, which does not check certificates.
//!
//! Certificates signed with a scheme that names no hash (Ed25519, RSA-PSS, whose hash is
//! in its parameters) get no binding, as PostgreSQL gives them none; SCRAM then runs
//! without it (tokio-postgres' `channel_binding=prefer`, the default).

use sha2::{Digest, Sha224, Sha256, Sha384, Sha512};

/// The binding data for the DER certificate `cert`, if its signature names a hash.
pub(super) fn tls_server_end_point(cert: &[u8]) -> Option<Vec<u8>> {
    let digest = match signature_algorithm(cert)? {
        // md5WithRSAEncryption, sha1WithRSAEncryption, ecdsa-with-SHA1: SHA-256.
        MD5_RSA | SHA1_RSA | SHA1_ECDSA | SHA256_RSA | SHA256_ECDSA => {
            Sha256::digest(cert).to_vec()
        }
        SHA224_RSA | SHA224_ECDSA => Sha224::digest(cert).to_vec(),
        SHA384_RSA | SHA384_ECDSA => Sha384::digest(cert).to_vec(),
        SHA512_RSA | SHA512_ECDSA => Sha512::digest(cert).to_vec(),
        _ => return None,
    };
    Some(digest)
}

// The signature algorithms' object identifiers, DER-encoded (PKCS #1 and ANSI X9.62).
const MD5_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x04];
const SHA1_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x05];
const SHA256_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b];
const SHA384_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c];
const SHA512_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d];
const SHA224_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0e];
const SHA1_ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01];
const SHA224_ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x01];
const SHA256_ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
const SHA384_ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03];
const SHA512_ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04];

/// The object identifier of a certificate's `signatureAlgorithm`:
/// `Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm SEQUENCE { OID, ... },
/// signature }`.
fn signature_algorithm(cert: &[u8]) -> Option<&[u8]> {
    let (body, _) = element(cert, SEQUENCE)?;
    let (_tbs, rest) = element(body, SEQUENCE)?;
    let (algorithm, _) = element(rest, SEQUENCE)?;
    let (oid, _) = element(algorithm, OID)?;
    Some(oid)
}

const SEQUENCE: u8 = 0x30;
const OID: u8 = 0x06;

/// The content of the DER element at the start of `input`, if its tag is `tag`, and
/// what follows it.
fn element(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&found, rest) = input.split_first()?;
    if found != tag {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let (bytes, after) = rest.split_at_checked(n)?;
        rest = after;
        bytes
            .iter()
            .fold(0usize, |len, b| (len << 8) | usize::from(*b))
    };
    rest.split_at_checked(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate(alg: &'static rcgen::SignatureAlgorithm) -> Vec<u8> {
        let key = rcgen::KeyPair::generate_for(alg).unwrap();
        let params = rcgen::CertificateParams::new(vec!["db.example".to_string()]).unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn the_hash_is_the_one_the_certificate_was_signed_with() {
        let p256 = certificate(&rcgen::PKCS_ECDSA_P256_SHA256);
        assert_eq!(signature_algorithm(&p256), Some(SHA256_ECDSA));
        assert_eq!(
            tls_server_end_point(&p256),
            Some(Sha256::digest(&p256).to_vec())
        );
        let p384 = certificate(&rcgen::PKCS_ECDSA_P384_SHA384);
        assert_eq!(
            tls_server_end_point(&p384),
            Some(Sha384::digest(&p384).to_vec())
        );
    }

    #[test]
    fn ed25519_and_garbage_get_no_binding() {
        let ed = certificate(&rcgen::PKCS_ED25519);
        assert!(signature_algorithm(&ed).is_some());
        assert_eq!(tls_server_end_point(&ed), None);
        assert_eq!(tls_server_end_point(b""), None);
        assert_eq!(
            tls_server_end_point(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]),
            None
        );
        let p256 = certificate(&rcgen::PKCS_ECDSA_P256_SHA256);
        assert_eq!(tls_server_end_point(&p256[..p256.len() / 2]), None);
    }
}

//! A `jsonwebtoken` crypto provider on ring (the crate rustls already brings), so that
//! token verification needs neither aws-lc nor the RustCrypto `rsa` crate. It verifies
//! exactly the algorithms the principal's `JwtVerifier` accepts: HS256, RS256
//! (RSASSA-PKCS1-v1_5 with SHA-256, 2048 to 8192 bits) and ES256 (P-256). It never signs.

use jsonwebtoken::crypto::{CryptoProvider, JwkUtils, JwtSigner, JwtVerifier};
use jsonwebtoken::errors::{ErrorKind, Result};
use jsonwebtoken::signature::{self, Verifier};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, DecodingKeyKind, EncodingKey};
use ring::{hmac, signature as sig};

/// The provider; [`install`] makes it the process default.
static PROVIDER: CryptoProvider = CryptoProvider {
    signer_factory,
    verifier_factory,
    jwk_utils: JwkUtils::new_unimplemented(),
};

/// Makes ring the process's `jsonwebtoken` provider, unless one is installed already.
/// Call it before the first `jsonwebtoken::decode`.
pub(crate) fn install() {
    let _ = PROVIDER.install_default();
}

fn refused() -> signature::Error {
    signature::Error::new()
}

struct Hs256(hmac::Key);

impl Verifier<Vec<u8>> for Hs256 {
    fn verify(&self, msg: &[u8], signature: &Vec<u8>) -> std::result::Result<(), signature::Error> {
        hmac::verify(&self.0, msg, signature).map_err(|_| refused())
    }
}

impl JwtVerifier for Hs256 {
    fn algorithm(&self) -> Algorithm {
        Algorithm::HS256
    }
}

struct Rs256(DecodingKey);

impl Verifier<Vec<u8>> for Rs256 {
    fn verify(&self, msg: &[u8], signature: &Vec<u8>) -> std::result::Result<(), signature::Error> {
        let alg = &sig::RSA_PKCS1_2048_8192_SHA256;
        match self.0.kind() {
            DecodingKeyKind::RsaModulusExponent { n, e } => sig::RsaPublicKeyComponents { n, e }
                .verify(alg, msg, signature)
                .map_err(|_| refused()),
            DecodingKeyKind::SecretOrDer(der) => sig::UnparsedPublicKey::new(alg, der)
                .verify(msg, signature)
                .map_err(|_| refused()),
        }
    }
}

impl JwtVerifier for Rs256 {
    fn algorithm(&self) -> Algorithm {
        Algorithm::RS256
    }
}

struct Es256(Vec<u8>);

impl Verifier<Vec<u8>> for Es256 {
    fn verify(&self, msg: &[u8], signature: &Vec<u8>) -> std::result::Result<(), signature::Error> {
        sig::UnparsedPublicKey::new(&sig::ECDSA_P256_SHA256_FIXED, &self.0)
            .verify(msg, signature)
            .map_err(|_| refused())
    }
}

impl JwtVerifier for Es256 {
    fn algorithm(&self) -> Algorithm {
        Algorithm::ES256
    }
}

fn verifier_factory(alg: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>> {
    // A key of another family never verifies (the algorithm-confusion attack).
    if key.family() != alg.family() {
        return Err(ErrorKind::InvalidAlgorithm.into());
    }
    match (alg, key.family()) {
        (Algorithm::HS256, AlgorithmFamily::Hmac) => Ok(Box::new(Hs256(hmac::Key::new(
            hmac::HMAC_SHA256,
            key.try_get_hmac_secret()?,
        )))),
        (Algorithm::RS256, AlgorithmFamily::Rsa) => Ok(Box::new(Rs256(key.clone()))),
        (Algorithm::ES256, AlgorithmFamily::Ec) => match key.kind() {
            DecodingKeyKind::SecretOrDer(point) => Ok(Box::new(Es256(point.clone()))),
            DecodingKeyKind::RsaModulusExponent { .. } => Err(ErrorKind::InvalidKeyFormat.into()),
        },
        _ => Err(ErrorKind::InvalidAlgorithm.into()),
    }
}

fn signer_factory(_: &Algorithm, _: &EncodingKey) -> Result<Box<dyn JwtSigner>> {
    Err(ErrorKind::InvalidAlgorithm.into())
}

//! `cargo xtask certs`: the TLS material `deploy/` needs, written as a kustomize Component
//! that `deploy/base` includes.
//!
//! Into `--out` (default `deploy/generated`, ignored by git):
//!
//! | file | what |
//! |---|---|
//! | `ca.crt`, `ca.key` | a CA made on the first run and reused after, so the APIServices' `caBundle` and the agents' CA stay put while serving certificates are renewed (`--new-ca` replaces it) |
//! | `tls.crt`, `tls.key` | a serving certificate signed by that CA, new on every run, for the names in [`SERVING_NAMES`] |
//! | `serving-cert.yaml` | Secret `kpulse-system/kpulse-serving-cert` (`tls.crt`, `tls.key`, `ca.crt`): the aggregator-api's |
//! | `ca-configmap.yaml` | ConfigMap `kpulse-system/kpulse-ca` (`ca.crt` only): the agents', so their nodes never receive the key |
//! | `apiservice-cabundle.yaml` | a patch setting `spec.caBundle` on both metrics.k8s.io APIServices |
//! | `kustomization.yaml` | the Component listing the three above |
//!
//! Keys are ECDSA P-256 (rcgen's default), files holding keys are mode 0600.

use std::{
    fs,
    io::Write as _,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use anyhow::{bail, ensure, Context, Result};
use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData as _,
};
use time::{Duration, OffsetDateTime};

/// The namespace of everything in `deploy/`.
pub const NAMESPACE: &str = "kpulse-system";
/// The Secret the aggregator-api mounts.
pub const SECRET: &str = "kpulse-serving-cert";
/// The ConfigMap the agents mount.
pub const CA_CONFIGMAP: &str = "kpulse-ca";
/// The APIServices whose `caBundle` is set.
pub const APISERVICES: [&str; 2] = ["v1beta1.metrics.k8s.io", "v1.metrics.k8s.io"];
/// DNS names of the serving certificate: the Service the kube-apiserver's aggregator
/// calls (it verifies `<service>.<namespace>.svc`), and the headless Service agents resolve
/// to reach each replica.
pub const SERVING_NAMES: [&str; 4] = [
    "kpulse-aggregator-api.kpulse-system.svc",
    "kpulse-aggregator-api.kpulse-system.svc.cluster.local",
    "kpulse-aggregator-agents.kpulse-system.svc",
    "*.kpulse-aggregator-agents.kpulse-system.svc",
];
/// Lifetime of a new CA.
const CA_DAYS: i64 = 3650;
/// Tolerated clock skew between this machine and the cluster.
const SKEW: Duration = Duration::hours(1);

/// `cargo xtask certs` flags.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Output directory [default: deploy/generated in the workspace].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Lifetime of the serving certificate, in days.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u16).range(1..=3650))]
    pub days: u16,
    /// Make a new CA even if the output directory has one (the APIServices' caBundle and
    /// the agents' CA change with it).
    #[arg(long)]
    pub new_ca: bool,
}

/// Writes the files; prints what it did.
pub fn run(opts: &Options) -> Result<()> {
    let out = match &opts.out {
        Some(p) => p.clone(),
        None => crate::vm::workspace_root()?.join("deploy/generated"),
    };
    fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let now = OffsetDateTime::now_utc();
    let not_after = now + Duration::days(i64::from(opts.days));

    let (ca_pem, ca_key, reused) = match load_ca(&out)? {
        Some((pem, key)) if !opts.new_ca => (pem, key, true),
        _ => {
            let (pem, key) = new_ca(now)?;
            (pem, key, false)
        }
    };
    let ca_not_after = not_after_of(&ca_pem).context("ca.crt")?;
    if ca_not_after < not_after {
        bail!(
            "the CA in {} expires at {ca_not_after}, before a new serving certificate would \
             ({not_after}); run with --new-ca (caBundle and the agents' CA then change: \
             re-apply the whole deploy/)",
            out.display()
        );
    }
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).context("cannot use ca.crt")?;

    let mut params = CertificateParams::new(SERVING_NAMES.map(String::from).to_vec())
        .context("serving certificate names")?;
    params
        .distinguished_name
        .push(DnType::CommonName, SERVING_NAMES[0]);
    params.not_before = now - SKEW;
    params.not_after = not_after;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().context("cannot generate the serving key")?;
    let cert = params
        .signed_by(&key, &issuer)
        .context("cannot sign the serving certificate")?;
    let (tls_crt, tls_key) = (cert.pem(), key.serialize_pem());

    write(&out, "ca.crt", &ca_pem, false)?;
    write(&out, "ca.key", &ca_key_pem, true)?;
    write(&out, "tls.crt", &tls_crt, false)?;
    write(&out, "tls.key", &tls_key, true)?;
    write(
        &out,
        "serving-cert.yaml",
        &secret_yaml(&tls_crt, &tls_key, &ca_pem),
        true,
    )?;
    write(&out, "ca-configmap.yaml", &configmap_yaml(&ca_pem), false)?;
    write(
        &out,
        "apiservice-cabundle.yaml",
        &patch_yaml(&ca_pem),
        false,
    )?;
    write(&out, "kustomization.yaml", KUSTOMIZATION, false)?;

    println!(
        "{} CA (valid until {}); new serving certificate for {} (valid until {})\n\
         wrote {}\n\
         next: kubectl apply -k deploy/   (keys are in that directory: keep it out of git)",
        if reused { "reused the" } else { "made a new" },
        ca_not_after.date(),
        SERVING_NAMES.join(", "),
        not_after.date(),
        out.display()
    );
    Ok(())
}

/// The CA in `dir`, when both its files are there; an error when only one is, or when the
/// key does not belong to the certificate.
fn load_ca(dir: &Path) -> Result<Option<(String, KeyPair)>> {
    let (crt, key) = (dir.join("ca.crt"), dir.join("ca.key"));
    match (crt.exists(), key.exists()) {
        (false, false) => return Ok(None),
        (true, true) => {}
        _ => bail!(
            "{} has only one of ca.crt and ca.key; restore the other or run with --new-ca",
            dir.display()
        ),
    }
    let pem = fs::read_to_string(&crt).with_context(|| format!("cannot read {}", crt.display()))?;
    let key_pem =
        fs::read_to_string(&key).with_context(|| format!("cannot read {}", key.display()))?;
    let key = KeyPair::from_pem(&key_pem).with_context(|| format!("{}", key.display()))?;
    let der = pem_der(&pem).with_context(|| format!("{}", crt.display()))?;
    let (_, parsed) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| anyhow::anyhow!("{}: {e}", crt.display()))?;
    ensure!(
        parsed.tbs_certificate.subject_pki.raw == key.subject_public_key_info().as_slice(),
        "{} does not belong to {}; run with --new-ca",
        dir.join("ca.key").display(),
        crt.display()
    );
    ensure!(
        parsed.is_ca(),
        "{} is not a CA certificate; run with --new-ca",
        crt.display()
    );
    Ok(Some((pem, key)))
}

/// A new self-signed CA, good for [`CA_DAYS`].
pub(crate) fn new_ca(now: OffsetDateTime) -> Result<(String, KeyPair)> {
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "kpulse-ca");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = now - SKEW;
    params.not_after = now + Duration::days(CA_DAYS);
    let key = KeyPair::generate().context("cannot generate the CA key")?;
    let cert = params
        .self_signed(&key)
        .context("cannot self-sign the CA")?;
    Ok((cert.pem(), key))
}

/// The DER of the first certificate in `pem`.
fn pem_der(pem: &str) -> Result<Vec<u8>> {
    let (_, block) =
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| anyhow::anyhow!("{e}"))?;
    ensure!(
        block.label == "CERTIFICATE",
        "expected a CERTIFICATE, found {}",
        block.label
    );
    Ok(block.contents)
}

fn not_after_of(pem: &str) -> Result<OffsetDateTime> {
    let der = pem_der(pem)?;
    let (_, cert) =
        x509_parser::parse_x509_certificate(&der).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(cert.validity().not_after.to_datetime())
}

pub(crate) fn write(dir: &Path, name: &str, contents: &str, secret: bool) -> Result<()> {
    let path = dir.join(name);
    // Replace rather than rewrite in place: a file made before with wider permissions
    // keeps none of them.
    let _ = fs::remove_file(&path);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(contents.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

const HEADER: &str = "# Generated by `cargo xtask certs`. Do not edit; do not commit.\n";

const KUSTOMIZATION: &str = "# Generated by `cargo xtask certs`. Do not edit; do not commit.
apiVersion: kustomize.config.k8s.io/v1alpha1
kind: Component
resources:
  - serving-cert.yaml
  - ca-configmap.yaml
patches:
  - path: apiservice-cabundle.yaml
";

pub(crate) fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn secret_yaml(tls_crt: &str, tls_key: &str, ca: &str) -> String {
    format!(
        "{HEADER}apiVersion: v1
kind: Secret
metadata:
  name: {SECRET}
  namespace: {NAMESPACE}
  labels:
    app.kubernetes.io/name: kpulse-aggregator-api
    app.kubernetes.io/part-of: kpulse
type: kubernetes.io/tls
data:
  tls.crt: {}
  tls.key: {}
  ca.crt: {}
",
        b64(tls_crt),
        b64(tls_key),
        b64(ca)
    )
}

fn configmap_yaml(ca: &str) -> String {
    let indented: String = ca.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "{HEADER}apiVersion: v1
kind: ConfigMap
metadata:
  name: {CA_CONFIGMAP}
  namespace: {NAMESPACE}
  labels:
    app.kubernetes.io/name: kpulse-agent
    app.kubernetes.io/part-of: kpulse
data:
  ca.crt: |
{indented}"
    )
}

fn patch_yaml(ca: &str) -> String {
    let bundle = b64(ca);
    let docs: Vec<String> = APISERVICES
        .iter()
        .map(|name| {
            format!(
                "apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: {name}
spec:
  caBundle: {bundle}
"
            )
        })
        .collect();
    format!("{HEADER}{}", docs.join("---\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configmap_pem_is_a_block_scalar() {
        let y = configmap_yaml("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
        assert!(y.ends_with("  ca.crt: |\n    -----BEGIN CERTIFICATE-----\n    AAAA\n    -----END CERTIFICATE-----\n"), "{y}");
    }

    #[test]
    fn patch_names_both_apiservices() {
        let y = patch_yaml("x");
        for name in APISERVICES {
            assert!(y.contains(&format!("name: {name}\n")), "{y}");
        }
        assert_eq!(y.matches("caBundle: eA==\n").count(), 2, "{y}");
    }
}

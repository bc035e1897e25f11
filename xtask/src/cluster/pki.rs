//! The cluster's certificates and kubeconfigs, as kubeadm lays them out: a cluster CA
//! (kube-apiserver's serving certificate, every client certificate, kubelet's serving
//! certificate), a separate front-proxy CA whose `front-proxy-client` certificate
//! kube-apiserver's aggregator presents to extension API servers, and the service-account
//! signing key. Made anew by every `cluster up` under `target/cluster/pki/`.

use std::{
    fs,
    net::IpAddr,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use crate::certs::{b64, write};

/// A certificate and its key, as PEM, and where they were written.
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What `cluster up` needs from the PKI.
pub struct Pki {
    pub dir: PathBuf,
    pub ca: Pair,
    pub front_proxy_ca: Pair,
    pub apiserver: Pair,
    pub apiserver_kubelet_client: Pair,
    pub front_proxy_client: Pair,
    pub kubelet: Pair,
    /// `sa.key` (PKCS#8) and `sa.pub`.
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
}

/// Names and addresses of kube-apiserver's serving certificate.
pub struct ApiserverNames<'a> {
    pub service_ip: &'a str,
    pub node_ip: &'a str,
}

/// A kubeconfig user: CN and O of its client certificate.
pub struct User<'a> {
    pub file: &'a str,
    pub common_name: &'a str,
    pub organization: Option<&'a str>,
}

/// The kubeconfigs every component uses, written into the PKI directory (the admin one is
/// copied to `target/cluster/kubeconfig` by the caller).
pub const USERS: [User<'static>; 5] = [
    User {
        file: "admin.kubeconfig",
        common_name: "kubernetes-admin",
        organization: Some("system:masters"),
    },
    User {
        file: "controller-manager.kubeconfig",
        common_name: "system:kube-controller-manager",
        organization: None,
    },
    User {
        file: "scheduler.kubeconfig",
        common_name: "system:kube-scheduler",
        organization: None,
    },
    User {
        file: "kube-proxy.kubeconfig",
        common_name: "system:kube-proxy",
        organization: None,
    },
    // The kubelet's name is filled in by `make` (system:node:<node>).
    User {
        file: "kubelet.kubeconfig",
        common_name: "system:node:",
        organization: Some("system:nodes"),
    },
];

const DAYS: i64 = 365;
const SKEW: Duration = Duration::hours(1);

/// Makes every certificate, key and kubeconfig in `dir`.
pub fn make(dir: &Path, names: &ApiserverNames<'_>, node: &str, server: &str) -> Result<Pki> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let now = OffsetDateTime::now_utc();
    let (ca, ca_issuer) = new_ca(dir, "ca", "kubernetes", now)?;
    let (front_proxy_ca, fp_issuer) = new_ca(dir, "front-proxy-ca", "front-proxy-ca", now)?;

    let mut sans = vec![
        SanType::DnsName("kubernetes".try_into()?),
        SanType::DnsName("kubernetes.default".try_into()?),
        SanType::DnsName("kubernetes.default.svc".try_into()?),
        SanType::DnsName("kubernetes.default.svc.cluster.local".try_into()?),
        SanType::DnsName("localhost".try_into()?),
    ];
    for ip in [names.service_ip, names.node_ip, "127.0.0.1"] {
        sans.push(SanType::IpAddress(ip.parse::<IpAddr>()?));
    }
    let apiserver = leaf(
        dir,
        "apiserver",
        &ca_issuer,
        "kube-apiserver",
        None,
        sans,
        ExtendedKeyUsagePurpose::ServerAuth,
        now,
    )?;
    let apiserver_kubelet_client = leaf(
        dir,
        "apiserver-kubelet-client",
        &ca_issuer,
        "kube-apiserver-kubelet-client",
        Some("system:masters"),
        Vec::new(),
        ExtendedKeyUsagePurpose::ClientAuth,
        now,
    )?;
    let front_proxy_client = leaf(
        dir,
        "front-proxy-client",
        &fp_issuer,
        "front-proxy-client",
        None,
        Vec::new(),
        ExtendedKeyUsagePurpose::ClientAuth,
        now,
    )?;
    // Not `kubelet`: that stem is the kubelet's client certificate (kubelet.kubeconfig,
    // below), which would overwrite these files and be served instead.
    let kubelet = leaf(
        dir,
        "kubelet-serving",
        &ca_issuer,
        node,
        None,
        vec![
            SanType::DnsName(node.try_into()?),
            SanType::IpAddress(names.node_ip.parse::<IpAddr>()?),
        ],
        ExtendedKeyUsagePurpose::ServerAuth,
        now,
    )?;

    for user in &USERS {
        let cn = if user.common_name == "system:node:" {
            format!("system:node:{node}")
        } else {
            user.common_name.to_string()
        };
        let stem = user.file.trim_end_matches(".kubeconfig");
        let pair = leaf(
            dir,
            stem,
            &ca_issuer,
            &cn,
            user.organization,
            Vec::new(),
            ExtendedKeyUsagePurpose::ClientAuth,
            now,
        )?;
        write(
            dir,
            user.file,
            &kubeconfig(server, &ca.cert_pem, &cn, &pair),
            true,
        )?;
    }

    let sa = KeyPair::generate().context("cannot generate the service-account key")?;
    write(dir, "sa.key", &sa.serialize_pem(), true)?;
    write(dir, "sa.pub", &sa.public_key_pem(), false)?;

    Ok(Pki {
        dir: dir.to_path_buf(),
        ca,
        front_proxy_ca,
        apiserver,
        apiserver_kubelet_client,
        front_proxy_client,
        kubelet,
        sa_key: dir.join("sa.key"),
        sa_pub: dir.join("sa.pub"),
    })
}

/// The cluster CA in `pki_dir`: its certificate (PEM) and an issuer that signs with it.
fn cluster_issuer(pki_dir: &Path) -> Result<(String, Issuer<'static, KeyPair>)> {
    let read = |name: &str| -> Result<String> {
        let path = pki_dir.join(name);
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))
    };
    let ca_pem = read("ca.crt")?;
    let key = KeyPair::from_pem(&read("ca.key")?).context("ca.key is not a private key")?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, key).context("ca.crt cannot sign")?;
    Ok((ca_pem, issuer))
}

/// A serving certificate for `name` at address `ip`, signed by the cluster CA in `pki_dir`,
/// written to `out` as `<stem>.{crt,key}`, beside the CA (`ca.crt`): what kube-apiserver and
/// kpulse's kubelet fallback check a kubelet's certificate against.
pub fn serving(pki_dir: &Path, out: &Path, stem: &str, name: &str, ip: &str) -> Result<Pair> {
    fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let (ca_pem, issuer) = cluster_issuer(pki_dir)?;
    write(out, "ca.crt", &ca_pem, false)?;
    leaf(
        out,
        stem,
        &issuer,
        name,
        None,
        vec![
            SanType::DnsName(name.try_into()?),
            SanType::IpAddress(ip.parse::<IpAddr>()?),
        ],
        ExtendedKeyUsagePurpose::ServerAuth,
        OffsetDateTime::now_utc(),
    )
}

/// What a further node's kubelet needs, signed by the cluster CA in `pki_dir` and written to
/// `out`: the CA (`ca.crt`, its client CA), a serving certificate for `node` and its address
/// `ip` (`kubelet-serving.{crt,key}`, [`serving`]), and `kubelet.kubeconfig` with the client
/// certificate of `system:node:<node>` in group `system:nodes` (what the Node authorizer and
/// NodeRestriction expect). No bootstrap token: the node is trusted as the first one is.
pub fn node(pki_dir: &Path, out: &Path, node: &str, ip: &str, server: &str) -> Result<()> {
    serving(pki_dir, out, "kubelet-serving", node, ip)?;
    let (ca_pem, issuer) = cluster_issuer(pki_dir)?;
    let cn = format!("system:node:{node}");
    let client = leaf(
        out,
        "kubelet",
        &issuer,
        &cn,
        Some("system:nodes"),
        Vec::new(),
        ExtendedKeyUsagePurpose::ClientAuth,
        OffsetDateTime::now_utc(),
    )?;
    write(
        out,
        "kubelet.kubeconfig",
        &kubeconfig(server, &ca_pem, &cn, &client),
        true,
    )
}

/// A new CA (CN = `ca_stem`) and one client certificate it signs, written to `dir` as
/// `<ca_stem>.{crt,key}` and `<client_stem>.{crt,key}`: what a rotation brings in
/// (`cluster check`'s rotations of the front-proxy and client CAs).
pub fn ca_and_client(
    dir: &Path,
    ca_stem: &str,
    client_stem: &str,
    client_cn: &str,
    organization: Option<&str>,
) -> Result<(Pair, Pair)> {
    let now = OffsetDateTime::now_utc();
    let (ca, issuer) = new_ca(dir, ca_stem, ca_stem, now)?;
    let client = leaf(
        dir,
        client_stem,
        &issuer,
        client_cn,
        organization,
        Vec::new(),
        ExtendedKeyUsagePurpose::ClientAuth,
        now,
    )?;
    Ok((ca, client))
}

fn new_ca(
    dir: &Path,
    stem: &str,
    cn: &str,
    now: OffsetDateTime,
) -> Result<(Pair, Issuer<'static, KeyPair>)> {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = now - SKEW;
    params.not_after = now + Duration::days(DAYS);
    let key = KeyPair::generate().with_context(|| format!("cannot generate the {cn} key"))?;
    let cert = params
        .self_signed(&key)
        .with_context(|| format!("cannot self-sign {cn}"))?;
    let pair = save(dir, stem, cert.pem(), key.serialize_pem())?;
    let issuer = Issuer::from_ca_cert_pem(&pair.cert_pem, key)
        .with_context(|| format!("cannot use {} as an issuer", pair.cert.display()))?;
    Ok((pair, issuer))
}

#[allow(clippy::too_many_arguments)]
fn leaf(
    dir: &Path,
    stem: &str,
    issuer: &Issuer<'_, KeyPair>,
    cn: &str,
    organization: Option<&str>,
    sans: Vec<SanType>,
    usage: ExtendedKeyUsagePurpose,
    now: OffsetDateTime,
) -> Result<Pair> {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, cn);
    if let Some(o) = organization {
        params.distinguished_name.push(DnType::OrganizationName, o);
    }
    params.subject_alt_names = sans;
    params.not_before = now - SKEW;
    params.not_after = now + Duration::days(DAYS);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().with_context(|| format!("cannot generate the {stem} key"))?;
    let cert = params
        .signed_by(&key, issuer)
        .with_context(|| format!("cannot sign {stem}"))?;
    save(dir, stem, cert.pem(), key.serialize_pem())
}

fn save(dir: &Path, stem: &str, cert_pem: String, key_pem: String) -> Result<Pair> {
    let (crt, key) = (format!("{stem}.crt"), format!("{stem}.key"));
    write(dir, &crt, &cert_pem, false)?;
    write(dir, &key, &key_pem, true)?;
    Ok(Pair {
        cert_pem,
        key_pem,
        cert: dir.join(crt),
        key: dir.join(key),
    })
}

/// A kubeconfig with the CA, the server and a client certificate, all embedded.
pub fn kubeconfig(server: &str, ca_pem: &str, user: &str, pair: &Pair) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
  - name: kpulse
    cluster:
      server: {server}
      certificate-authority-data: {}
users:
  - name: {user}
    user:
      client-certificate-data: {}
      client-key-data: {}
contexts:
  - name: {user}@kpulse
    context:
      cluster: kpulse
      user: {user}
current-context: {user}@kpulse
",
        b64(ca_pem),
        b64(&pair.cert_pem),
        b64(&pair.key_pem)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_chain_and_name_what_kubeadm_names() {
        let dir = std::env::temp_dir().join(format!("kpulse-pki-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let pki = make(
            &dir,
            &ApiserverNames {
                service_ip: "10.96.0.1",
                node_ip: "10.244.0.1",
            },
            "node-a",
            "https://10.244.0.1:6443",
        )
        .expect("test setup");
        let parse = |pem: &str| {
            let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).expect("test setup");
            block.contents
        };
        let fp = parse(&pki.front_proxy_client.cert_pem);
        let (_, fp) = x509_parser::parse_x509_certificate(&fp).expect("test setup");
        assert_eq!(fp.subject().to_string(), "CN=front-proxy-client");
        assert_eq!(fp.issuer().to_string(), "CN=front-proxy-ca");
        let api = parse(&pki.apiserver.cert_pem);
        let (_, api) = x509_parser::parse_x509_certificate(&api).expect("test setup");
        let sans = format!(
            "{:?}",
            api.subject_alternative_name()
                .expect("test setup")
                .expect("test setup")
                .value
        );
        assert!(sans.contains("kubernetes.default.svc"), "{sans}");
        // The file the kubelet serves is its serving certificate, for its node's address
        // (not its client certificate, which once overwrote it).
        let served = fs::read_to_string(&pki.kubelet.cert).expect("test setup");
        let served = parse(&served);
        let (_, served) = x509_parser::parse_x509_certificate(&served).expect("test setup");
        assert_eq!(served.subject().to_string(), "CN=node-a");
        let sans = format!(
            "{:?}",
            served
                .subject_alternative_name()
                .expect("test setup")
                .expect("test setup")
                .value
        );
        assert!(
            sans.contains("10.244.0.1") || sans.contains("[10, 244, 0, 1]"),
            "{sans}"
        );
        let kubelet_cfg = fs::read_to_string(dir.join("kubelet.kubeconfig")).expect("test setup");
        assert!(
            kubelet_cfg.contains("name: system:node:node-a\n"),
            "{kubelet_cfg}"
        );
        assert!(fs::read_to_string(&pki.sa_pub)
            .expect("test setup")
            .contains("PUBLIC KEY"));
        fs::remove_dir_all(&dir).expect("test setup");
    }

    /// A further node's certificates come from the cluster's CA: its client certificate
    /// names it as the Node authorizer expects, its serving certificate has its address.
    #[test]
    fn a_further_node_is_signed_by_the_cluster_ca() {
        let dir = std::env::temp_dir().join(format!("kpulse-pki-node-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let names = ApiserverNames {
            service_ip: "10.96.0.1",
            node_ip: "10.244.0.1",
        };
        let server = "https://10.244.0.1:6443";
        let pki = make(&dir, &names, "node-a", server).expect("test setup");
        let out = dir.join("node-b");
        node(&dir, &out, "node-b", "10.244.255.2", server).expect("node certificates");
        let der = |path: &Path| {
            let pem = fs::read_to_string(path).expect("test setup");
            let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).expect("PEM");
            block.contents
        };
        let ca_der = der(&pki.ca.cert);
        let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).expect("CA");
        let serving_der = der(&out.join("kubelet-serving.crt"));
        let (_, serving) = x509_parser::parse_x509_certificate(&serving_der).expect("serving");
        assert_eq!(serving.subject().to_string(), "CN=node-b");
        serving
            .verify_signature(Some(ca.public_key()))
            .expect("signed by the cluster CA");
        let sans = format!(
            "{:?}",
            serving
                .subject_alternative_name()
                .expect("test setup")
                .expect("a SAN extension")
                .value
        );
        assert!(
            sans.contains("10.244.255.2") || sans.contains("[10, 244, 255, 2]"),
            "{sans}"
        );
        let client_der = der(&out.join("kubelet.crt"));
        let (_, client) = x509_parser::parse_x509_certificate(&client_der).expect("client");
        assert_eq!(
            client.subject().to_string(),
            "CN=system:node:node-b, O=system:nodes"
        );
        client
            .verify_signature(Some(ca.public_key()))
            .expect("signed by the cluster CA");
        assert_eq!(
            fs::read_to_string(out.join("ca.crt")).expect("test setup"),
            pki.ca.cert_pem
        );
        let kubeconfig = fs::read_to_string(out.join("kubelet.kubeconfig")).expect("test setup");
        assert!(
            kubeconfig.contains(&format!("server: {server}\n")),
            "{kubeconfig}"
        );
        assert!(
            kubeconfig.contains("name: system:node:node-b\n"),
            "{kubeconfig}"
        );
        // Without the cluster's CA there is nothing to sign with.
        assert!(node(&out, &dir.join("node-c"), "node-c", "10.244.255.3", server).is_err());
        fs::remove_dir_all(&dir).expect("test setup");
    }
}

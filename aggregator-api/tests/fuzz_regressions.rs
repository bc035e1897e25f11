//! Replays the committed fuzz inputs of `fuzz/` through the same bodies cargo-fuzz runs: the
//! minimized corpus (`fuzz/corpus/<target>/`) and every input that once crashed
//! (`fuzz/regressions/<target>/`). See docs/fuzzing.md.

use kpulse_testkit::{fuzz_dir, replay_fuzz_inputs};

#[test]
fn selectors() {
    replay_fuzz_inputs("selectors", kpulse_aggregator_api::fuzzing::selectors);
}

#[test]
fn request_header() {
    replay_fuzz_inputs(
        "request_header",
        kpulse_aggregator_api::fuzzing::request_header,
    );
}

#[test]
fn quantity() {
    replay_fuzz_inputs("quantity", kpulse_aggregator_api::fuzzing::quantity);
}

#[test]
fn kubelet_resource() {
    replay_fuzz_inputs(
        "kubelet_resource",
        kpulse_aggregator_api::fuzzing::kubelet_resource,
    );
}

/// Writes the seed inputs of `fuzz/corpus/{selectors,request_header,quantity}/`: run with
/// `cargo test -p kpulse-aggregator-api --test fuzz_regressions -- --ignored`, then minimize
/// with `cargo xtask fuzz --minimize`.
#[test]
#[ignore = "writes seed files into fuzz/corpus"]
fn write_seeds() {
    let root = fuzz_dir().join("corpus");
    let write = |target: &str, inputs: &[Vec<u8>]| {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).expect("mkdir");
        for (i, input) in inputs.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}")), input).expect("write seed");
        }
    };
    let selectors: Vec<Vec<u8>> = [
        "",
        "app=web",
        "app==web,tier!=db",
        "app in (web,api),tier notin (db)",
        "app in(web)",
        "k in (,a),k notin (b,)",
        "!canary,env",
        "n>4,n<6",
        "example.com/team=infra,app.kubernetes.io/name=web-0",
        "a=b,a=c,a,!a",
        "in=notin,notin in (in)",
        "a\tin\n(\rb )",
        "a=b c=d",
        "Ex.com/a=b",
        "metadata.name=web-0",
        "metadata.namespace=default,metadata.name=web-0",
        "metadata.name!=a\\,b\\=c\\\\",
        "metadata.name==x,metadata.name=b",
        "spec.nodeName=n1",
        "=,!=,=x,a\\==c",
        "a=b=c",
        "metadata.name=a\\b",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    write("selectors", &selectors);

    let headers = |selector: u8, records: &[&str]| {
        let mut data = vec![selector];
        data.extend_from_slice(records.join("\n").as_bytes());
        data
    };
    let forged = [
        "X-Remote-User:system:admin",
        "X-Remote-Group:system:masters",
        "X-Remote-Group:system:authenticated",
        "X-Remote-Uid:u-1",
        "X-Remote-Extra-Scopes:a",
        "X-Remote-Extra-Scopes:b",
        "X-Remote-Extra-Acme.com%2fProject:p",
        "Accept:application/json",
    ];
    let request_header = vec![
        headers(0, &forged),
        headers(0x80, &forged),
        headers(
            1,
            &[
                "X-Forwarded-User:bob",
                "X-Remote-User:",
                "X-Remote-Extra-a%zz:v",
                "X-Remote-x:y",
                "X-Forwarded-Groups:g1",
            ],
        ),
        headers(
            2,
            &["x-remote-user:", "X-Remote-User:alice", "X-REMOTE-UID:1"],
        ),
        headers(
            3,
            &[
                "X-User,X-Alt;X-Uid;X-Groups;X-Extra-,x-",
                "X-User:carol",
                "X-Extra-k%e2%82%ac:v",
                "X-Groups:g",
            ],
        ),
        headers(0x83, &["u;;;", "u:dave", "other:1"]),
        {
            let mut d = headers(0, &["X-Remote-User:\u{e9}", "X-Remote-Extra-k:"]);
            d.extend_from_slice(b"\xff\n\x01:x");
            d
        },
    ];
    write("request_header", &request_header);

    let values = |op: u8, vs: &[u64]| {
        let mut data = vec![op];
        for v in vs {
            data.extend_from_slice(&v.to_le_bytes());
        }
        data
    };
    let edges = [
        0,
        1,
        999,
        1_000,
        1_023,
        1_024,
        1_536,
        1_000_000,
        1 << 20,
        1_500_000_000,
        1_000_000_000_000,
        i64::MAX as u64,
        i64::MAX as u64 + 1,
        8 << 60,
        12 << 60,
        15 << 60,
        u64::MAX,
    ];
    let quantity: Vec<Vec<u8>> = (0..6)
        .map(|op| values(op, &edges))
        .chain([values(3, &[u64::MAX; 32]), values(2, &[1_000_000; 3])])
        .collect();
    write("quantity", &quantity);
}

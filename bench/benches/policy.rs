//! Policy v0: check cost against rule count, name validation, manifest parse.

use divan::{Bencher, black_box};
use policy::v0::{Class, Permission, Policy, Query};

fn main() {
    divan::main();
}

/// A policy of `n` rules spread over 100 subjects and every class.
fn policy_text(n: usize) -> String {
    let mut s = String::with_capacity(n * 48);
    for i in 0..n {
        let subject = i % 100;
        match i % 4 {
            0 => s.push_str(&format!("allow agent{subject}_t tool:tool-{i} execute\n")),
            1 => s.push_str(&format!("allow agent{subject}_t shared:space-{i} read\n")),
            2 => s.push_str(&format!("allow agent{subject}_t agent:child-{i} create\n")),
            _ => s.push_str(&format!("allow agent{subject}_t model:prov/model-{i} use\n")),
        }
    }
    s
}

/// Asks one allowed and one denied query per iteration, rotating over `rules` (indices of tool
/// rules in `policy_text`).
fn bench_pairs(b: Bencher, n: usize, rules: impl Iterator<Item = usize>) {
    let policy = Policy::from_text(policy_text(n).as_bytes()).expect("valid");
    let names: Vec<(String, String)> =
        rules.map(|i| (format!("agent{}_t", i % 100), format!("tool-{i}"))).collect();
    let mut k = 0usize;
    b.bench_local(|| {
        k = (k + 1) % names.len();
        let (subject, object) = &names[k];
        let q = Query { subject, class: Class::Tool, object, permission: Permission::Execute };
        let miss = Query { subject, class: Class::Tool, object: "absent", permission: Permission::Execute };
        (black_box(&policy).allows(&q), black_box(&policy).allows(&miss))
    });
}

/// Checks over a rotating set of 256 hot keys, so the probe does not always hit one cache line.
#[divan::bench(args = [10, 1_000, 100_000])]
fn check(b: Bencher, n: usize) {
    bench_pairs(b, n, (0..n.min(1024)).step_by(4));
}

/// The same pair of checks over keys spread across the whole table (up to 4,096 of them), so
/// large tables also pay for cache misses.
#[divan::bench(args = [10, 1_000, 100_000])]
fn check_spread(b: Bencher, n: usize) {
    let rules = n.div_ceil(4);
    bench_pairs(b, n, (0..n).step_by(4).step_by((rules / 4096).max(1)));
}

#[divan::bench(args = [10, 1_000, 100_000])]
fn parse_and_compile(b: Bencher, n: usize) {
    let text = policy_text(n);
    b.counter(divan::counter::BytesCount::new(text.len()))
        .bench(|| Policy::from_text(black_box(text.as_bytes())).expect("valid"));
}

#[divan::bench(args = ["fs.read", "github.search_issues_and_pull_requests_with_a_long_name_x", "bad/name"])]
fn validate_name(name: &str) -> bool {
    policy::name::validate(black_box(name)).is_ok()
}

const MANIFEST: &str = r#"{"schema":"cortexfs.object/v2","version":"1.0.0","compatibility":{"cortexfs":">=0.1"},
"class":"tool","name":"fs.read","executable":{"path":"bin/fs.read","sha256":"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
"controls":{"description":{"text":"Read a file"},"schema":{"text":"{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"}}}"},
"policy":{"text":"allow coder_t tool:fs.read execute\nallow reviewer_t tool:fs.read execute\n"}}}"#;

#[divan::bench]
fn manifest_parse(b: Bencher) {
    let v = policy::cortexfs_version();
    b.counter(divan::counter::BytesCount::new(MANIFEST.len()))
        .bench(|| policy::manifest::parse(black_box(MANIFEST.as_bytes()), &v).expect("valid"));
}

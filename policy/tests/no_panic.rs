//! No parser panics on any input, and accepted policies round-trip (a quick, always-on companion
//! to the fuzz targets in `fuzz/`).

use proptest::prelude::*;

fn policyish() -> impl Strategy<Value = Vec<u8>> {
    let word = prop_oneof![
        Just("allow".to_owned()),
        Just("coder_t".to_owned()),
        "(tool|model|shared|session|mount|agent|network|x):([a-z/.*]{0,6}|default|/w)",
        "(execute|use|read|write|resume|create|start|stop|connect|run)",
        "[ -~\t#\r]{0,8}",
    ];
    prop::collection::vec(prop::collection::vec(word, 0..6), 0..8)
        .prop_map(|lines| lines.into_iter().map(|l| l.join(" ")).collect::<Vec<_>>().join("\n").into_bytes())
}

proptest! {
    #[test]
    fn policy_roundtrips(text in policyish()) {
        if let Ok(rules) = policy::v0::parse(&text) {
            let rendered: String = rules.iter().map(|r| format!("{r}\n")).collect();
            let again = policy::v0::parse(rendered.as_bytes()).expect("rendered rules parse");
            prop_assert_eq!(again.len(), rules.len());
        }
    }

    #[test]
    fn no_parser_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let v = policy::cortexfs_version();
        let _ = policy::v0::parse(&bytes);
        let _ = policy::manifest::parse(&bytes, &v);
        let _ = policy::package::parse(&bytes, &v);
        let _ = policy::mount::parse(&bytes);
        let _ = policy::tshconf::parse_config(&bytes);
        let _ = policy::tshconf::parse_tshrc(&bytes);
        let _ = policy::controls::parse_mcp_locator(&bytes);
    }
}

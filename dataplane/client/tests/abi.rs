//! The header and the library agree: a C program built against `include/ferroce.h` prints
//! every struct's size and field offsets, which must equal those of the `repr(C)` structs
//! the library reads and writes. Every function the header declares is exported.

use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

use ferroce_client::*;

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

#[test]
fn header_layouts_match_the_library() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("ferroce-abi-{}", std::process::id()));
    let st = Command::new(cc())
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I"])
        .arg(dir.join("include"))
        .arg(dir.join("tests/abi_check.c"))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("a C compiler (cc)");
    assert!(st.success(), "the header does not compile cleanly");
    let o = Command::new(&out).output().unwrap();
    let _ = std::fs::remove_file(&out);
    let text = String::from_utf8(o.stdout).unwrap();
    let mut want = std::collections::HashMap::new();
    // Each struct of the header: its size, and the offsets of the fields named.
    macro_rules! layouts {
        ($($c:literal: $t:ty { $($f:ident),* })*) => {$(
            want.insert(format!("{} size", $c), size_of::<$t>());
            $(want.insert(format!("{}.{}", $c, stringify!($f)), offset_of!($t, $f));)*
        )*};
    }
    layouts! {
        "ferroce_device_attr": DeviceAttr { max_mr_size, max_qp, max_inline_data, atomic_cap }
        "ferroce_port_attr": PortAttr { link_layer }
        "ferroce_mr": CMr { lkey, rkey }
        "ferroce_srq_attr": CSrqAttr { srq_limit }
        "ferroce_qp_cap": CQpCap { max_inline_data }
        "ferroce_qp_init_attr": CQpInit { qp_type, cap, sq_sig_all }
        "ferroce_ah_attr": CAh { flow_label, sl, dmac, has_dmac }
        "ferroce_qp_attr": CQpAttr {
            dest_qp_num, ah_attr, pkey_index, rnr_retry, en_sqd_async_notify, cap
        }
        "ferroce_sge": CSge { lkey }
        "ferroce_send_wr": CSendWr {
            sg_list, num_sge, imm_data, remote_addr, rkey, compare_add, swap, ah, remote_qpn,
            remote_qkey
        }
        "ferroce_recv_wr": CRecvWr { sg_list, num_sge }
        "ferroce_wc": CWc { status, qp_num, wc_flags, pkey_index, sl, solicited }
        "ferroce_async_event": CEvent {}
    }
    want.insert(
        "ferroce_async_event.element".into(),
        offset_of!(CEvent, object),
    );
    let mut seen = 0;
    for line in text.lines() {
        let (k, v) = line.rsplit_once(' ').unwrap();
        let v: usize = v.parse().unwrap();
        let w = want
            .get(k)
            .unwrap_or_else(|| panic!("{k} not checked on the Rust side"));
        assert_eq!(*w, v, "{k}: the library has {w}, the header {v}");
        seen += 1;
    }
    assert_eq!(
        seen,
        want.len(),
        "every Rust-side entry printed by the C side"
    );
}

#[test]
fn every_declared_function_is_exported() {
    let header = include_str!("../include/ferroce.h");
    let lib = std::fs::read(env!("CARGO_MANIFEST_DIR").to_string() + "/src/lib.rs").unwrap();
    let lib = String::from_utf8(lib).unwrap();
    let mut n = 0;
    for name in header
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("ferroce_") && !w.starts_with("ferroce_h"))
    {
        // Function declarations are followed by "(" in the header.
        if !header.contains(&format!("{name}(")) {
            continue;
        }
        assert!(
            lib.contains(&format!("extern \"C\" fn {name}(")),
            "{name} is declared in ferroce.h but not exported"
        );
        n += 1;
    }
    assert!(n >= 30, "only {n} functions found");
}

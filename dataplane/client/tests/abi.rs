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
    macro_rules! s {
        ($c:literal, $t:ty) => {
            want.insert(format!("{} size", $c), size_of::<$t>());
        };
    }
    macro_rules! f {
        ($c:literal, $t:ty, $($f:tt)+) => {
            want.insert(format!("{}.{}", $c, stringify!($($f)+)), offset_of!($t, $($f)+));
        };
    }
    s!("ferroce_device_attr", DeviceAttr);
    f!("ferroce_device_attr", DeviceAttr, max_mr_size);
    f!("ferroce_device_attr", DeviceAttr, max_qp);
    f!("ferroce_device_attr", DeviceAttr, max_inline_data);
    f!("ferroce_device_attr", DeviceAttr, atomic_cap);
    s!("ferroce_port_attr", PortAttr);
    f!("ferroce_port_attr", PortAttr, link_layer);
    s!("ferroce_mr", CMr);
    f!("ferroce_mr", CMr, lkey);
    f!("ferroce_mr", CMr, rkey);
    s!("ferroce_srq_attr", CSrqAttr);
    f!("ferroce_srq_attr", CSrqAttr, srq_limit);
    s!("ferroce_qp_cap", CQpCap);
    f!("ferroce_qp_cap", CQpCap, max_inline_data);
    s!("ferroce_qp_init_attr", CQpInit);
    f!("ferroce_qp_init_attr", CQpInit, qp_type);
    f!("ferroce_qp_init_attr", CQpInit, cap);
    f!("ferroce_qp_init_attr", CQpInit, sq_sig_all);
    s!("ferroce_ah_attr", CAh);
    f!("ferroce_ah_attr", CAh, flow_label);
    f!("ferroce_ah_attr", CAh, sl);
    f!("ferroce_ah_attr", CAh, dmac);
    f!("ferroce_ah_attr", CAh, has_dmac);
    s!("ferroce_qp_attr", CQpAttr);
    f!("ferroce_qp_attr", CQpAttr, dest_qp_num);
    f!("ferroce_qp_attr", CQpAttr, ah_attr);
    f!("ferroce_qp_attr", CQpAttr, pkey_index);
    f!("ferroce_qp_attr", CQpAttr, rnr_retry);
    f!("ferroce_qp_attr", CQpAttr, en_sqd_async_notify);
    f!("ferroce_qp_attr", CQpAttr, cap);
    s!("ferroce_sge", CSge);
    f!("ferroce_sge", CSge, lkey);
    s!("ferroce_send_wr", CSendWr);
    f!("ferroce_send_wr", CSendWr, sg_list);
    f!("ferroce_send_wr", CSendWr, num_sge);
    f!("ferroce_send_wr", CSendWr, imm_data);
    f!("ferroce_send_wr", CSendWr, remote_addr);
    f!("ferroce_send_wr", CSendWr, rkey);
    f!("ferroce_send_wr", CSendWr, compare_add);
    f!("ferroce_send_wr", CSendWr, swap);
    f!("ferroce_send_wr", CSendWr, ah);
    f!("ferroce_send_wr", CSendWr, remote_qpn);
    f!("ferroce_send_wr", CSendWr, remote_qkey);
    s!("ferroce_recv_wr", CRecvWr);
    f!("ferroce_recv_wr", CRecvWr, sg_list);
    f!("ferroce_recv_wr", CRecvWr, num_sge);
    s!("ferroce_wc", CWc);
    f!("ferroce_wc", CWc, status);
    f!("ferroce_wc", CWc, qp_num);
    f!("ferroce_wc", CWc, wc_flags);
    f!("ferroce_wc", CWc, pkey_index);
    f!("ferroce_wc", CWc, sl);
    f!("ferroce_wc", CWc, solicited);
    s!("ferroce_async_event", CEvent);
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

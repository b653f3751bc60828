//! Finds Debian's DPDK 22.11 through `pkg-config libdpdk`, generates bindings with bindgen and
//! compiles the C shim for DPDK's static-inline fast path.
//!
//! Pitfalls (see ../shared/reference/dpdk.md): link flags must be emitted as `rustc-link-lib`
//! (a library crate's `rustc-link-arg` does not reach dependent binaries and tests); the forced
//! `-include rte_config.h` from pkg-config must reach both bindgen and cc; librte_net_ring and
//! librte_bus_vdev are not in pkg-config's list; two structs must be opaque.

use std::env;
use std::path::PathBuf;
use std::process::Command;

/// Libraries we call directly that `pkg-config --libs libdpdk` does not list.
const EXTRA_LIBS: &[&str] = &["rte_net_ring", "rte_bus_vdev"];

fn main() {
    println!("cargo:rerun-if-changed=shim/shim.c");
    println!("cargo:rerun-if-changed=shim/shim.h");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let probe = Command::new("pkg-config")
        .args(["--modversion", "libdpdk"])
        .output();
    let version = match probe {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        _ => {
            // One clear line, then fail: never build stubs (they hide a broken CI).
            panic!(
                "DPDK not found: `pkg-config libdpdk` failed; install it with \
                 `apt-get install -y --no-install-recommends libdpdk-dev pkg-config libclang-dev` \
                 (or run `make deps`)"
            );
        }
    };
    if !version.starts_with("22.11") {
        println!("cargo:warning=pmd-bindings targets DPDK 22.11; found {version}; building anyway");
    }

    let cflags = pkg_config_words(&["--cflags", "libdpdk"]);
    let libs = pkg_config_words(&["--libs", "libdpdk"]);

    // Link: every -L becomes a search path, every -l a dylib (Debian ships shared DPDK).
    let mut seen = std::collections::BTreeSet::new();
    for word in &libs {
        if let Some(dir) = word.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        } else if let Some(lib) = word.strip_prefix("-l") {
            if seen.insert(lib.to_string()) {
                println!("cargo:rustc-link-lib=dylib={lib}");
            }
        }
    }
    for lib in EXTRA_LIBS {
        if seen.insert(lib.to_string()) {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
    }

    // The C shim, compiled with exactly DPDK's flags (incl. the forced rte_config.h).
    let mut build = cc::Build::new();
    build.file("shim/shim.c").include("shim").opt_level(2);
    for flag in &cflags {
        build.flag(flag);
    }
    build.flag_if_supported("-Wno-unused-parameter");
    build.compile("ferroce_shim");

    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let bindings = bindgen::Builder::default()
        .header("shim/shim.h")
        .clang_args(cflags.iter())
        .allowlist_function("rte_.*")
        .allowlist_function("ferroce_.*")
        .allowlist_type("rte_.*")
        .allowlist_var("RTE_.*")
        .allowlist_var("RING_F_.*")
        // These two DPDK 22.11 structs do not lay out as Rust (packed + aligned members).
        .opaque_type("rte_l2tpv2_combined_msg_hdr")
        .opaque_type("rte_flow_item_gtp_psc")
        // Static-inline functions exist only through the shim.
        .generate_inline_functions(false)
        // DPDK's doc comments contain code blocks that rustdoc would run as doctests.
        .generate_comments(false)
        .derive_default(true)
        .layout_tests(false)
        .prepend_enum_name(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .unwrap_or_else(|e| {
            panic!("bindgen failed on the DPDK headers ({e}); is libclang-dev installed?")
        });
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs");
}

fn pkg_config_words(args: &[&str]) -> Vec<String> {
    let out = Command::new("pkg-config")
        .args(args)
        .output()
        .expect("pkg-config runs");
    assert!(out.status.success(), "pkg-config {args:?} failed");
    // `-include rte_config.h` is two words that must stay together and in order.
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

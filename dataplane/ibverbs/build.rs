//! Bindings to the installed `<infiniband/verbs.h>` (libibverbs-dev): the structures an
//! application's inline verbs read through must be laid out exactly as its headers say, so
//! they are generated, not retyped. Also the version nodes and SONAME of libibverbs.so.1.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=libibverbs.map");
    println!("cargo:rerun-if-changed=build.rs");
    if !std::path::Path::new("/usr/include/infiniband/verbs.h").exists() {
        panic!(
            "<infiniband/verbs.h> not found: install libibverbs-dev \
             (`apt-get install -y --no-install-recommends libibverbs-dev`, or run `make deps`)"
        );
    }
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/libibverbs.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_type("ibv_.*")
        .allowlist_type("verbs_.*")
        .allowlist_type("_compat_ibv_port_attr")
        // The kernel-ABI structures librdmacm hands to the ibv_copy_*_from_kern helpers.
        .allowlist_type("ib_user_path_rec")
        .allowlist_type("ib_uverbs_qp_attr")
        .allowlist_type("ib_uverbs_ah_attr")
        .allowlist_var("IBV_.*")
        // librdmacm's structures (the rdma_cm calls this library serves for librdmacm.so.1).
        .allowlist_type("rdma_.*")
        .allowlist_var("RDMA_.*")
        .allowlist_var("RAI_.*")
        .derive_default(true)
        .prepend_enum_name(false)
        .generate()
        .expect("bindgen on <infiniband/verbs.h>")
        .write_to_file(out.join("verbs.rs"))
        .expect("write bindings");
}

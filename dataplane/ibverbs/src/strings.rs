//! Names of enum values and the sysfs helpers libibverbs exports.

use super::*;

macro_rules! cstr {
    ($s:literal) => {
        concat!($s, "\0").as_ptr() as *const c_char
    };
}

/// Entry `i` of a table of NUL-terminated names, or `other` past its end.
fn name_of(table: &[&'static str], i: impl TryInto<usize>, other: *const c_char) -> *const c_char {
    i.try_into()
        .ok()
        .and_then(|i| table.get(i))
        .map_or(other, |s| s.as_ptr() as *const c_char)
}

#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: c_uint) -> *const c_char {
    const S: [&str; 22] = [
        "success\0",
        "local length error\0",
        "local QP operation error\0",
        "local EE context operation error\0",
        "local protection error\0",
        "Work Request Flushed Error\0",
        "memory management operation error\0",
        "bad response error\0",
        "local access error\0",
        "remote invalid request error\0",
        "remote access error\0",
        "remote operation error\0",
        "transport retry counter exceeded\0",
        "RNR retry counter exceeded\0",
        "local RDD violation error\0",
        "remote invalid RD request\0",
        "aborted error\0",
        "invalid EE context number\0",
        "invalid EE context state\0",
        "fatal error\0",
        "response timeout error\0",
        "general error\0",
    ];
    name_of(&S, status, cstr!("unknown"))
}
version!(ibv_wc_status_str, "IBVERBS_1.1");

#[no_mangle]
pub extern "C" fn ibv_node_type_str(t: c_int) -> *const c_char {
    // From IBV_NODE_CA (1); 0 is IBV_NODE_UNKNOWN.
    const S: [&str; 5] = [
        "unknown\0",
        "InfiniBand channel adapter\0",
        "InfiniBand switch\0",
        "InfiniBand router\0",
        "iWARP NIC\0",
    ];
    name_of(&S, t, cstr!("unknown"))
}
version!(ibv_node_type_str, "IBVERBS_1.1");

#[no_mangle]
pub extern "C" fn ibv_port_state_str(s: c_uint) -> *const c_char {
    const S: [&str; 6] = [
        "PORT_NOP\0",
        "PORT_DOWN\0",
        "PORT_INIT\0",
        "PORT_ARMED\0",
        "PORT_ACTIVE\0",
        "PORT_ACTIVE_DEFER\0",
    ];
    name_of(&S, s, cstr!("invalid state"))
}
version!(ibv_port_state_str, "IBVERBS_1.1");

#[no_mangle]
pub extern "C" fn ibv_event_type_str(e: c_uint) -> *const c_char {
    const S: [&str; 20] = [
        "CQ error\0",
        "local work queue catastrophic error\0",
        "invalid request local work queue error\0",
        "local access violation work queue error\0",
        "communication established\0",
        "send queue drained\0",
        "path migrated\0",
        "path migration request error\0",
        "local catastrophic error\0",
        "port active\0",
        "port error\0",
        "LID change\0",
        "P_Key change\0",
        "SM change\0",
        "SRQ catastrophic error\0",
        "SRQ limit reached\0",
        "last WQE reached\0",
        "client reregistration\0",
        "GID table change\0",
        "WQ fatal\0",
    ];
    name_of(&S, e, cstr!("unknown"))
}
version!(ibv_event_type_str, "IBVERBS_1.1");

/// Reads `dir/file` into `buf` (a real sysfs read: ferroce's devices have no sysfs nodes,
/// so reads about them fail and tools skip what they would print).
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        return -1;
    }
    let path = format!(
        "{}/{}",
        CStr::from_ptr(dir).to_string_lossy(),
        CStr::from_ptr(file).to_string_lossy()
    );
    match std::fs::read(&path) {
        Ok(mut v) => {
            if v.last() == Some(&b'\n') {
                v.pop();
            }
            let n = v.len().min(size - 1);
            std::ptr::copy_nonoverlapping(v.as_ptr(), buf as *mut u8, n);
            *buf.add(n) = 0;
            n as c_int
        }
        Err(_) => -1,
    }
}
version!(ibv_read_sysfs_file, "IBVERBS_1.0");

// What librdmacm imports: kernel-ABI copies, multicast, ECE, the sysfs root

/// The sysfs mount point (`SYSFS_PATH` overrides it, as in libibverbs).
#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    static P: OnceLock<std::ffi::CString> = OnceLock::new();
    P.get_or_init(|| {
        let p = std::env::var("SYSFS_PATH").unwrap_or_else(|_| "/sys".into());
        std::ffi::CString::new(p.trim_end_matches('/'))
            .unwrap_or_else(|_| std::ffi::CString::new("/sys").expect("no NUL"))
    })
    .as_ptr()
}
version!(ibv_get_sysfs_path, "IBVERBS_1.0");

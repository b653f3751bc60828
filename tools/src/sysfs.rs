//! A sysfs-style description of rnicd's RNICs, for programs that look for an RDMA device in
//! `/sys/class/infiniband` and `/sys/class/infiniband_verbs` (UCX, NCCL, libibumad and
//! `ibstat`, Open MPI, hwloc) before they use it. `ferroce-run` mounts it over `/sys/class`
//! in a private mount namespace (docs/ibverbs.md, "Device visibility"); `rnic-ctl sysfs DIR`
//! writes it.
//!
//! The files and their formats are the kernel's (drivers/infiniband/core/sysfs.c), with the
//! values `ibv_query_device`/`ibv_query_port`/`ibv_query_gid` of ferroce's libibverbs give:
//! node GUID (EUI-64 of the MAC), port state, the GID table with its RoCE v2 types (empty
//! entries all zeros), one P_Key. There is no `device` link (no PCI function behind a
//! software RNIC), no MAD class and no `rdma_cm` (ferroce serves neither).

use std::io;
use std::path::Path;

use ferroce_host::abi::proto::DeviceInfo;

/// The GID table length the library reports (`roce::engine::GID_TABLE_LEN`).
const GID_TABLE_LEN: usize = roce::engine::GID_TABLE_LEN as usize;

/// The kernel's first minor number of uverbs devices (their character major is 231).
const UVERBS_MINOR_BASE: usize = 192;

/// The `dev_name` ferroce's libibverbs gives RNIC `name` (`ibv_device.dev_name`): the name of
/// its uverbs entry and of its character file under /dev/infiniband.
pub fn uverbs_name(name: &str) -> String {
    format!("uverbs_{name}")
}

fn gid_text(g: &[u8; 16]) -> String {
    g.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

fn write(path: &Path, text: &str) -> io::Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    std::fs::write(path, format!("{text}\n"))
}

/// Writes `class/infiniband/<name>/...` and `class/infiniband_verbs/...` for `devs` under
/// `root` (which stands for /sys).
pub fn write_tree(root: &Path, devs: &[DeviceInfo]) -> io::Result<()> {
    let verbs = root.join("class/infiniband_verbs");
    write(&verbs.join("abi_version"), "6")?;
    for (n, d) in devs.iter().enumerate() {
        let ib = root.join("class/infiniband").join(&d.name);
        write(&ib.join("node_type"), "1: CA")?;
        write(&ib.join("node_guid"), &d.node_guid)?;
        write(&ib.join("sys_image_guid"), &d.node_guid)?;
        write(&ib.join("fw_ver"), roce::engine::FW_VERSION)?;
        write(&ib.join("hca_type"), "ferroce")?;
        write(&ib.join("hw_rev"), "0")?;
        write(&ib.join("board_id"), "FERROCE")?;
        write(&ib.join("node_desc"), &format!("ferroce {}", d.name))?;
        let p = ib.join("ports/1");
        let (state, phys) = if d.active {
            ("4: ACTIVE", "5: LinkUp")
        } else {
            ("1: DOWN", "3: Disabled")
        };
        write(&p.join("state"), state)?;
        write(&p.join("phys_state"), phys)?;
        // As ibv_query_port reports it: 4X at EDR's 25 Gb/s a lane.
        write(&p.join("rate"), "100 Gb/sec (4X EDR)")?;
        for (f, v) in [
            ("lid", "0x0"),
            ("lid_mask_count", "0"),
            ("sm_lid", "0x0"),
            ("sm_sl", "0"),
            ("cap_mask", "0x00010000"),
            ("link_layer", "Ethernet"),
        ] {
            write(&p.join(f), v)?;
        }
        for i in 0..GID_TABLE_LEN.max(d.gids.len()) {
            let g = d.gids.get(i).map_or([0u8; 16], |g| g.0);
            write(&p.join(format!("gids/{i}")), &gid_text(&g))?;
            // The kernel's file of an empty entry cannot be read; an empty file is what UCX
            // and NCCL accept in its place.
            let ty = p.join(format!("gid_attrs/types/{i}"));
            if d.gids.get(i).is_some() {
                write(&ty, "RoCE v2")?;
            } else {
                std::fs::create_dir_all(ty.parent().expect("a parent"))?;
                std::fs::write(&ty, "")?;
            }
        }
        write(&p.join("pkeys/0"), "0xffff")?;
        let uv = verbs.join(uverbs_name(&d.name));
        write(&uv.join("ibdev"), &d.name)?;
        write(&uv.join("abi_version"), "1")?;
        write(&uv.join("dev"), &format!("231:{}", UVERBS_MINOR_BASE + n))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_in_the_kernels_full_form() {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 99, 0, 1]);
        assert_eq!(gid_text(&g), "0000:0000:0000:0000:0000:ffff:0a63:0001");
    }
}
